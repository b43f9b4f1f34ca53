"""Prefix caching as page accounting (dspark/kv_cache.py, dspark/prefix_cache.py): chained hashes,
shared pages counted once, reference counts, LRU eviction of unreferenced pages only, rollback, and
the routing summary."""

from __future__ import annotations

import pytest

from dspark.errors import AdmissionError
from dspark.kv_cache import PageManager
from dspark.prefix_cache import cached_prefix_tokens, page_hashes

SIZE = 4
SYSTEM = list(range(100, 112))  # three full pages


def prefill(pm: PageManager, seq_id: str, prompt: list[int], max_new: int = 4) -> list:
    """Admit `prompt`, compute what the cache did not give, commit its full pages; returns the hits."""
    hits = pm.reserve(seq_id, len(prompt) + max_new, prompt)
    pm.ensure(seq_id, len(prompt))
    pm.publish(seq_id, len(prompt), lambda i: f"hidden-{seq_id}-{i}")
    return hits


def test_page_hashes_are_chained_over_every_earlier_token():
    a = page_hashes([1, 2, 3, 4, 5, 6, 7, 8, 9], SIZE)
    assert len(a) == 2  # the partial third page has no hash
    assert page_hashes([1, 2, 3, 4, 5, 6, 7, 8], SIZE) == a
    b = page_hashes([0, 2, 3, 4, 5, 6, 7, 8], SIZE)
    assert b[0] != a[0] and b[1] != a[1]  # the same second page after another first page differs
    assert page_hashes([1, 2, 3, 4, 5, 6, 7, 0], SIZE)[0] == a[0]


def test_a_shared_prompt_reuses_full_pages_and_counts_them_once():
    # 8 pages: two private copies of a 4-page life would need 8 + 8; shared, 3 + (4 - 3) * 2 = 5.
    pm = PageManager(num_pages=8, page_size=SIZE, prefix_caching=True)
    assert prefill(pm, "a", SYSTEM + [1, 2, 3]) == []
    assert pm.num_cached_pages == 3
    hits = prefill(pm, "b", SYSTEM + [7, 8, 9])
    assert [h.page for h in hits] == pm.table("a")[:3] == pm.table("b")[:3]
    assert [h.payload for h in hits] == ["hidden-a-0", "hidden-a-1", "hidden-a-2"]
    assert all(pm.refcount(p) == 2 for p in pm.table("a")[:3])
    assert pm.num_unreserved_pages == 8 - 3 - 2 * 2  # the shared three, then each one's private rest
    with pytest.raises(AdmissionError, match="needs 5 pages, 1 of 8"):
        pm.reserve("c", 20, [5] * 16)  # another prompt: no hits, the whole life
    prefill(pm, "c", SYSTEM + [0], max_new=0)  # a third sharer fits in the one page left
    for seq in ("a", "b", "c"):
        pm.release(seq)
    assert all(pm.refcount(p) == 0 for p in range(8))
    assert pm.num_free_pages == 8 and pm.num_unreserved_pages == 8 and pm.num_cached_pages == 3


def test_the_page_of_the_last_prompt_token_is_never_reused():
    pm = PageManager(num_pages=16, page_size=SIZE, prefix_caching=True)
    prefill(pm, "a", SYSTEM)  # exactly three pages, all cached
    assert pm.num_cached_pages == 3
    # The same prompt again: its last token must run through the target, so its page is its own.
    assert len(prefill(pm, "b", SYSTEM)) == 2
    assert len(prefill(pm, "c", SYSTEM + [1])) == 3


def test_a_released_prompt_stays_cached_and_revives_from_the_free_pool():
    pm = PageManager(num_pages=6, page_size=SIZE, prefix_caching=True)
    prefill(pm, "a", SYSTEM + [1])
    pm.release("a")
    assert pm.num_free_pages == 6 and pm.num_cached_pages == 3
    # It takes 2 fresh pages plus the 3 cached ones back from the free pool: 5 <= 6.
    assert len(prefill(pm, "b", SYSTEM + [2], max_new=4)) == 3
    assert pm.num_unreserved_pages == 6 - 5


def test_eviction_takes_unreferenced_pages_least_recently_used_first_and_never_a_held_one():
    pm = PageManager(num_pages=8, page_size=SIZE, prefix_caching=True)
    other = list(range(200, 208))  # two pages
    prefill(pm, "held", SYSTEM + [1], max_new=3)  # 4 pages held, 3 of them cached
    prefill(pm, "old", other + [1], max_new=3)  # 3 pages, 2 cached
    pm.release("old")
    held = set(pm.table("held"))
    # A newcomer needing every free page evicts the released pages, the held ones never.
    pm.reserve("big", 16, [9] * 16)
    table = pm.ensure("big", 16)
    assert not held & set(table)
    assert pm.num_cached_pages == 3 and all(pm.refcount(p) == 1 for p in held)
    with pytest.raises(AdmissionError):
        pm.reserve("more", 1, [1])
    pm.release("big")
    pm.release("held")
    assert pm.num_free_pages == 8 and all(pm.refcount(p) == 0 for p in range(8))


def test_the_last_pages_of_a_prompt_are_evicted_before_its_first():
    pm = PageManager(num_pages=5, page_size=SIZE, prefix_caching=True)
    prefill(pm, "a", SYSTEM + [1], max_new=0)  # 4 pages, 3 cached
    pm.release("a")
    pm.reserve("b", 12, [7] * 12)
    pm.ensure("b", 12)  # three pages: the two free ones and one evicted
    assert pm.num_cached_pages == 2
    pm.release("b")
    assert len(prefill(pm, "c", SYSTEM + [5], max_new=0)) == 2  # the first two pages survived


def test_rollback_never_touches_shared_pages():
    pm = PageManager(num_pages=16, page_size=SIZE, prefix_caching=True)
    prompt = SYSTEM + [1, 2]
    prefill(pm, "a", prompt, max_new=12)
    prefill(pm, "b", prompt, max_new=12)
    shared = pm.table("b")[:3]
    pm.ensure("b", len(prompt) + 9)  # a verify round wrote drafts two pages past the prompt
    pm.truncate("b", len(prompt) + 1)  # most were rejected
    assert pm.table("b")[:3] == shared and len(pm.table("b")) == 4
    assert all(pm.refcount(p) == 2 for p in shared)
    pm.release("a")
    assert all(pm.refcount(p) == 1 for p in shared)


def test_a_prompt_prefilled_twice_at_once_keeps_one_copy_cached():
    pm = PageManager(num_pages=16, page_size=SIZE, prefix_caching=True)
    prompt = SYSTEM + [1]
    for seq in ("a", "b"):  # both admitted before either committed a page
        assert pm.reserve(seq, len(prompt) + 2, prompt) == []
    for seq in ("a", "b"):
        pm.ensure(seq, len(prompt))
        pm.publish(seq, len(prompt))
    assert pm.num_cached_pages == 3
    pm.release("a")
    pm.release("b")
    assert pm.num_cached_pages == 3 and pm.num_free_pages == 16


def test_reuse_joins_pages_committed_since_admission_only_at_a_page_boundary():
    pm = PageManager(num_pages=32, page_size=SIZE, prefix_caching=True)
    prompt = SYSTEM + [1]
    pm.reserve("a", 20, prompt)
    pm.reserve("b", 20, prompt)
    pm.ensure("b", 2)
    pm.ensure("a", len(prompt))
    pm.publish("a", len(prompt))
    assert pm.reuse_cached("b", 2) == []  # b's first page is half its own already
    pm.reserve("c", 20, prompt)  # admitted after a committed: hits at admission
    pm.release("c")
    pm.reserve("d", 20, prompt, need_payload=True)
    assert pm.table("d") == []  # a's pages carry no payload, and d's drafter needs one
    assert len(pm.reserve("e", 20, prompt)) == 3
    assert pm.reuse_cached("e", 12) == []  # nothing cached continues its table
    assert len(pm.table("e")) == 3


def test_without_prefix_caching_nothing_is_shared():
    pm = PageManager(num_pages=8, page_size=SIZE)
    assert prefill(pm, "a", SYSTEM + [1], max_new=0) == []
    assert prefill(pm, "b", SYSTEM + [1], max_new=0) == []  # two private copies: all 8 pages
    assert pm.num_cached_pages == 0 and pm.routing_summary() == {"enabled": False}
    pm.release("a")
    pm.release("b")
    assert pm.num_free_pages == 8


def test_clear_cache_forgets_every_unreferenced_page():
    pm = PageManager(num_pages=8, page_size=SIZE, prefix_caching=True)
    prefill(pm, "a", SYSTEM + [1])
    pm.release("a")
    pm.clear_cache()
    assert pm.num_cached_pages == 0 and pm.num_free_pages == 8
    assert prefill(pm, "b", SYSTEM + [1]) == []


def test_the_routing_summary_predicts_the_prefix_a_replica_holds():
    pm = PageManager(num_pages=16, page_size=SIZE, prefix_caching=True)
    prefill(pm, "a", SYSTEM + [1, 2])
    summary = pm.routing_summary()
    assert summary["enabled"] and summary["page_size"] == SIZE and summary["cached_pages"] == 3
    assert len(summary["hashes"]) == 3 and all(len(h) == 16 for h in summary["hashes"])
    assert cached_prefix_tokens(SYSTEM + [9, 9, 9], summary) == 12
    assert cached_prefix_tokens(SYSTEM[:8] + [0] * 8, summary) == 8
    assert cached_prefix_tokens(SYSTEM, summary) == 8  # the last token's page always runs
    assert cached_prefix_tokens([0] + SYSTEM, summary) == 0
    assert cached_prefix_tokens(SYSTEM, {"enabled": False}) == 0
    # What the router predicts is what the replica then reuses.
    assert len(pm.reserve("b", 20, SYSTEM + [9, 9, 9])) * SIZE == 12


def test_the_routing_summary_is_built_again_only_after_a_change():
    pm = PageManager(num_pages=16, page_size=SIZE, prefix_caching=True)
    prefill(pm, "a", SYSTEM + [1, 2])
    first = pm.routing_summary()
    assert pm.routing_summary() is first  # nothing cached, dropped or used since: the same summary
    pm.release("a")
    prefill(pm, "b", [7] * 9)  # two pages of another prompt are cached: they lead the hashes
    second = pm.routing_summary()
    assert second is not first and second["cached_pages"] == 5 and second["hashes"][2:] == first["hashes"]
    pm.reserve("c", 20, SYSTEM + [9])  # a hit uses cached pages: the most recent move to the front
    third = pm.routing_summary()
    assert third is not second and third["hashes"][0] in first["hashes"]
    pm.release("b")
    pm.release("c")
    pm.clear_cache()
    assert pm.routing_summary()["cached_pages"] == 0
