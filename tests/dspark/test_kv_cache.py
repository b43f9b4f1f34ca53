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


@pytest.mark.parametrize("prefix_caching", [False, True])
def test_the_unreserved_count_kept_as_a_total_is_the_sum_over_the_running_sequences(prefix_caching):
    # num_unreserved_pages keeps its promised pages as a running total: through seeded random admissions
    # (shared prompts, so cached pages are reused with prefix caching), growth, rollbacks, publications,
    # reuse and releases it must equal the sum it replaced.
    import random

    rng = random.Random(7)
    bm = PageManager(num_pages=64, page_size=4, prefix_caching=prefix_caching)
    prompts = [[rng.randrange(50) for _ in range(rng.randrange(1, 30))] for _ in range(4)]
    computed: dict[str, int] = {}
    for step in range(2000):
        op = rng.random()
        if op < 0.25 or not computed:
            prompt = list(rng.choice(prompts))
            try:
                hits = bm.reserve(f"s{step}", len(prompt) + rng.randrange(1, 40), prompt)
            except AdmissionError:
                continue
            computed[f"s{step}"] = len(hits) * 4
        else:
            seq = rng.choice(sorted(computed))
            reserved = bm._seqs[seq].reserved * 4
            if op < 0.7 and computed[seq] < reserved:
                grown = min(reserved, computed[seq] + rng.randrange(1, 9))
                bm.ensure(seq, grown)
                computed[seq] = rng.randint(computed[seq], grown)  # a verification keeps some of them
                bm.truncate(seq, computed[seq])
                bm.publish(seq, computed[seq])
                bm.reuse_cached(seq, computed[seq])
            elif op < 0.85:
                bm.release(seq)
                del computed[seq]
        promised = sum(a.reserved - len(a.table) for a in bm._seqs.values())
        assert bm.num_unreserved_pages == bm.num_free_pages - promised
    assert computed and step == 1999
