"""PageManager accounting: reservation, lazy growth, rollback, release."""

from __future__ import annotations

import pytest

from dspark.errors import AdmissionError
from dspark.kv_cache import PageManager


def test_reserve_grow_truncate_release():
    bm = PageManager(num_pages=10, page_size=4)
    bm.reserve("a", 17)  # 5 blocks promised
    assert bm.num_unreserved_pages == 5 and bm.num_free_pages == 10
    table = bm.ensure("a", 9)
    assert len(table) == 3 and len(set(table)) == 3
    assert bm.num_free_pages == 7 and bm.num_unreserved_pages == 5
    bm.truncate("a", 5)  # rollback keeps ceil(5 / 4) = 2 blocks
    assert bm.table("a") == table[:2] and bm.num_free_pages == 8
    with pytest.raises(RuntimeError, match="beyond its reservation"):
        bm.ensure("a", 21)
    bm.release("a")
    assert bm.num_free_pages == 10 and bm.num_unreserved_pages == 10


def test_admission_refuses_when_promised_blocks_would_be_needed():
    bm = PageManager(num_pages=6, page_size=4)
    bm.reserve("a", 16)
    with pytest.raises(AdmissionError, match="needs 3 pages, 2 of 6 are free"):
        bm.reserve("b", 9)
    with pytest.raises(AdmissionError, match="too small"):
        bm.reserve("c", 100)
    bm.reserve("b", 8)
    assert bm.num_unreserved_pages == 0
