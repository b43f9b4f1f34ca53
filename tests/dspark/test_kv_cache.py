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


@pytest.mark.parametrize("step", [4, 16, 48])
def test_growing_many_pages_at_once_hands_out_what_growing_one_at_a_time_would(step):
    # ensure's bulk path (all from the free pool): the pool's order, a released table's pages last.
    bm = PageManager(num_pages=12, page_size=4)
    bm.reserve("a", 24)
    bm.ensure("a", 24)  # pages 0..5
    bm.release("a")  # back to the pool last page first, behind the untouched 6..11
    bm.reserve("b", 48)
    for tokens in range(step, 49, step):
        bm.ensure("b", tokens)
    assert bm.table("b") == [6, 7, 8, 9, 10, 11, 5, 4, 3, 2, 1, 0]
    assert all(bm.refcount(p) == 1 for p in range(12)) and bm.num_free_pages == 0
