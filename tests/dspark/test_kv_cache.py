"""BlockManager accounting: reservation, lazy growth, rollback, release."""

from __future__ import annotations

import pytest

from dspark.errors import AdmissionError
from dspark.kv_cache import BlockManager


def test_reserve_grow_truncate_release():
    bm = BlockManager(num_blocks=10, block_size=4)
    bm.reserve("a", 17)  # 5 blocks promised
    assert bm.num_unreserved_blocks == 5 and bm.num_free_blocks == 10
    table = bm.ensure("a", 9)
    assert len(table) == 3 and len(set(table)) == 3
    assert bm.num_free_blocks == 7 and bm.num_unreserved_blocks == 5
    bm.truncate("a", 5)  # rollback keeps ceil(5 / 4) = 2 blocks
    assert bm.table("a") == table[:2] and bm.num_free_blocks == 8
    with pytest.raises(RuntimeError, match="beyond its reservation"):
        bm.ensure("a", 21)
    bm.release("a")
    assert bm.num_free_blocks == 10 and bm.num_unreserved_blocks == 10


def test_admission_refuses_when_promised_blocks_would_be_needed():
    bm = BlockManager(num_blocks=6, block_size=4)
    bm.reserve("a", 16)
    with pytest.raises(AdmissionError, match="needs 3 blocks, 2 of 6 are free"):
        bm.reserve("b", 9)
    with pytest.raises(AdmissionError, match="too small"):
        bm.reserve("c", 100)
    bm.reserve("b", 8)
    assert bm.num_unreserved_blocks == 0
