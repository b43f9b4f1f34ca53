"""Prefix caching in the engine: greedy output stays token-identical to the target alone with shared
system prompts, staggered arrivals and chunked prefill; a hit skips its prefill; the drafter gets the
same context from a cached page as from a computed one; refcounts come back to zero; eviction and
the end of one sharer never hurt the others."""

from __future__ import annotations

from collections import Counter

import pytest
import torch

from dspark import SamplingParams
from dspark.config import EngineConfig
from dspark.drafter import DraftProposal
from dspark.engine import Engine
from dspark.errors import AdmissionError

GREEDY = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
PAGE = 8
SYSTEM_PAGES = 5


def shared_prompts(vocab: int) -> tuple[list[int], list[list[int]]]:
    """A 40-token system prompt (five pages) before suffixes of mixed length, one prompt that is the
    system prompt alone, and one unrelated prompt; repeated spans feed the n-gram drafter."""
    gen = torch.Generator().manual_seed(11)
    system = (torch.randint(0, vocab, (20,), generator=gen).tolist() * 2)[: SYSTEM_PAGES * PAGE]
    suffixes = [torch.randint(0, vocab, (n,), generator=gen).tolist() for n in (3, 11, 1, 20, 6)]
    other = torch.randint(0, vocab, (30,), generator=gen).tolist()
    return system, [system + s for s in suffixes] + [system, other]


def config(model_dir, **options) -> EngineConfig:
    # 36 tokens per step: every 40-token-plus prompt is prefilled in chunks.
    base = dict(
        model=str(model_dir),
        num_speculative_tokens=4,
        max_num_seqs=8,
        max_num_batched_tokens=36,
        kv_page_size=PAGE,
        num_kv_pages=96,
    )
    return EngineConfig(**{**base, **options})


_ALONE: dict[str, list[list[int]]] = {}


def alone(model_dir, prompts) -> list[list[int]]:
    """Each prompt decoded by the target alone: no drafter, no batch, no prefix cache."""
    key = str(model_dir)
    if key not in _ALONE:
        engine = Engine(config(model_dir, max_num_seqs=1, enable_prefix_caching=False))
        _ALONE[key] = [finish(engine, [p])[0] for p in prompts]
    return _ALONE[key]


def finish(engine: Engine, prompts, params: SamplingParams = GREEDY) -> list[list[int]]:
    """Admit every prompt, step until all are done; generated ids in prompt order."""
    ids = [engine.add_request(p, params) for p in prompts]
    done = {}
    while engine.has_unfinished():
        done.update({o.request_id: o for o in engine.step() if o.finished})
    return [done[i].token_ids for i in ids]


def run_staggered(engine: Engine, prompts, gap: int = 2) -> dict:
    """Requests arrive `gap` steps apart, joining a batch that is prefilling and decoding; returns
    each one's final output by index. Checks the page reference counts after every step."""
    outputs, step, arrivals = {}, 0, list(enumerate(prompts))
    while arrivals or engine.has_unfinished():
        if arrivals and step % gap == 0:
            i, p = arrivals.pop(0)
            engine.add_request(p, GREEDY, request_id=str(i))
        outputs.update({int(o.request_id): o for o in engine.step() if o.finished})
        assert_refcounts_match_tables(engine)
        step += 1
    return outputs


def assert_refcounts_match_tables(engine: Engine) -> None:
    """Every page is counted once per running request whose table holds it: no page is in use twice
    unless it is a shared cached page, and none was evicted from under a request."""
    holders = Counter(p for rid in engine.seqs for p in engine.pages.table(rid))
    assert [engine.pages.refcount(p) for p in range(engine.pages.num_pages)] == [
        holders[p] for p in range(engine.pages.num_pages)
    ]
    for page, count in holders.items():
        assert count == 1 or engine.pages.index.get(page) is not None


def assert_all_pages_free(engine: Engine) -> None:
    pages = engine.pages
    assert pages.num_free_pages == pages.num_pages
    assert all(pages.refcount(p) == 0 for p in range(pages.num_pages))


@pytest.fixture(params=["qwen3", "llama"])
def model_dir(request, qwen3_dir, llama_dir):
    return qwen3_dir if request.param == "qwen3" else llama_dir


@pytest.mark.parametrize("drafter", ["none", "ngram"])
@pytest.mark.parametrize("gap", [1, 3])
def test_greedy_identical_with_shared_prompts_and_staggered_arrivals(model_dir, drafter, gap):
    engine = Engine(config(model_dir, drafter=drafter))
    _, prompts = shared_prompts(engine.model_config.vocab_size)
    outputs = run_staggered(engine, prompts, gap)
    assert [outputs[i].token_ids for i in range(len(prompts))] == alone(model_dir, prompts)
    stats = engine.stats
    cached = [outputs[i].num_cached_tokens for i in range(len(prompts))]
    assert cached[0] == 0 and cached[-1] == 0  # the first arrival and the unrelated prompt
    assert all(n % PAGE == 0 and n <= SYSTEM_PAGES * PAGE for n in cached)
    assert sum(cached) == stats.cached_prompt_tokens >= 3 * SYSTEM_PAGES * PAGE
    # Every prompt token was either run by the target or served from the cache, never both.
    assert stats.prefill_tokens + stats.cached_prompt_tokens == stats.prompt_tokens
    if drafter == "ngram":
        assert stats.accepted_tokens > 0
    assert_all_pages_free(engine)
    assert engine.pages.num_cached_pages >= SYSTEM_PAGES


def test_a_hit_skips_the_prefill_of_the_cached_pages(qwen3_dir):
    engine = Engine(config(qwen3_dir))
    system, prompts = shared_prompts(engine.model_config.vocab_size)
    run_forward, forwarded = engine.runner.forward, []
    engine.runner.forward = lambda items, taps: forwarded.append(items) or run_forward(items, taps)

    first = engine.add_request(prompts[3], GREEDY)
    while engine.has_unfinished():
        engine.step()
    prefill_before, forwarded[:] = engine.stats.prefill_tokens, []
    rid = engine.add_request(prompts[1], GREEDY)  # the same system prompt, another suffix
    out = None
    while engine.has_unfinished():
        out = next((o for o in engine.step() if o.request_id == rid), out)
    assert first != rid and out.num_cached_tokens == len(system)
    # The target ran the suffix only: its first forward starts after the system prompt.
    assert forwarded[0][0].start == len(system)
    assert forwarded[0][0].token_ids == prompts[1][len(system) :]
    assert engine.stats.prefill_tokens - prefill_before == len(prompts[1]) - len(system)
    assert out.token_ids == alone(qwen3_dir, prompts)[1]


def test_without_prefix_caching_every_prompt_is_prefilled(qwen3_dir):
    engine = Engine(config(qwen3_dir, enable_prefix_caching=False))
    _, prompts = shared_prompts(engine.model_config.vocab_size)
    assert finish(engine, prompts) == alone(qwen3_dir, prompts)
    assert engine.stats.cached_prompt_tokens == 0
    assert engine.stats.prefill_tokens == engine.stats.prompt_tokens
    assert engine.pages.num_cached_pages == 0


class RecordingDrafter:
    """Reads two layers' hidden states, drafts nothing, and keeps every context it is given."""

    name = "recording"
    target_layer_ids = (0, 2)
    max_draft_tokens = 0

    def __init__(self) -> None:
        self.tokens: dict[str, list[int]] = {}
        self.hidden: dict[str, list[torch.Tensor]] = {}

    def add_context(self, seq_id, token_ids, hidden) -> None:
        self.tokens.setdefault(seq_id, []).extend(token_ids)
        self.hidden.setdefault(seq_id, []).append(hidden.clone())

    def propose(self, requests):
        return [DraftProposal([]) for _ in requests]

    def release(self, seq_id) -> None:
        pass


def test_the_drafter_gets_the_same_context_from_cached_pages(qwen3_dir):
    contexts = []
    for caching in (False, True):
        engine = Engine(config(qwen3_dir, enable_prefix_caching=caching))
        engine.drafter = drafter = RecordingDrafter()
        _, prompts = shared_prompts(engine.model_config.vocab_size)
        outputs = run_staggered(engine, prompts[:5], gap=3)
        contexts.append(
            (
                [drafter.tokens[str(i)] for i in range(5)],
                [torch.cat(drafter.hidden[str(i)]) for i in range(5)],
                [outputs[i].num_cached_tokens for i in range(5)],
            )
        )
    (tokens_off, hidden_off, cached_off), (tokens_on, hidden_on, cached_on) = contexts
    assert sum(cached_off) == 0 and sum(cached_on) >= 3 * SYSTEM_PAGES * PAGE
    assert tokens_on == tokens_off  # every committed token, in order, once
    for off, on in zip(hidden_off, hidden_on):
        assert on.shape == off.shape == (len(off), 2 * engine.model_config.hidden_size)
        torch.testing.assert_close(on, off, rtol=1e-5, atol=1e-5)


def test_aborting_or_failing_a_sharer_leaves_the_others_untouched(qwen3_dir):
    engine = Engine(config(qwen3_dir, drafter="ngram"))
    system, prompts = shared_prompts(engine.model_config.vocab_size)
    expected = alone(qwen3_dir, prompts)
    finish(engine, [prompts[0]])  # the system prompt is cached
    engine.add_request(prompts[1], GREEDY, request_id="aborted")
    engine.add_request(prompts[2], GREEDY, request_id="failed")
    engine.add_request(prompts[3], GREEDY, request_id="kept")
    shared = engine.pages.table("kept")[:SYSTEM_PAGES]
    assert all(engine.pages.refcount(p) == 3 for p in shared)
    accept = engine._accept

    def fail_one(seq, *args):
        if seq.request_id == "failed":
            raise RuntimeError("injected")
        return accept(seq, *args)

    engine._accept = fail_one
    outputs, step = {}, 0
    while engine.has_unfinished():
        if step == 3:
            engine.abort("aborted")
            assert all(engine.pages.refcount(p) == 1 for p in shared)  # the failed one left already
        outputs.update({o.request_id: o for o in engine.step() if o.finished})
        step += 1
    assert outputs["failed"].finish_reason == "error"
    assert outputs["kept"].token_ids == expected[3]
    assert outputs["kept"].num_cached_tokens == len(system)
    assert_all_pages_free(engine)
    # The shared pages are still whole: a newcomer reuses them and decodes exactly.
    engine._accept = accept
    assert finish(engine, [prompts[4]]) == [expected[4]]
    assert engine.stats.cached_prompt_tokens == 4 * len(system)


def test_eviction_under_pressure_never_takes_a_page_in_use(qwen3_dir):
    # 20 pages: two requests at most (10 pages each at worst), so every new prompt evicts.
    engine = Engine(config(qwen3_dir, num_kv_pages=20, max_num_seqs=3))
    _, prompts = shared_prompts(engine.model_config.vocab_size)
    gen = torch.Generator().manual_seed(3)
    vocab = engine.model_config.vocab_size
    others = [torch.randint(0, vocab, (40,), generator=gen).tolist() for _ in range(4)]
    mixed = [p for pair in zip(prompts[:4], others) for p in pair] + prompts[4:6]
    pending, outputs = list(enumerate(mixed)), {}
    while pending or engine.has_unfinished():
        try:
            if pending:
                engine.add_request(pending[0][1], GREEDY, request_id=str(pending[0][0]))
                pending.pop(0)
        except AdmissionError:
            pass  # full: it waits for a request to finish
        outputs.update({int(o.request_id): o.token_ids for o in engine.step() if o.finished})
        assert_refcounts_match_tables(engine)
    reference = Engine(config(qwen3_dir, max_num_seqs=1, enable_prefix_caching=False))
    assert [outputs[i] for i in range(len(mixed))] == [finish(reference, [p])[0] for p in mixed]
    assert engine.pages.evictions > 0 and engine.stats.cached_prompt_tokens > 0
    assert_all_pages_free(engine)


def test_profiling_forgets_the_cache_it_overwrites(qwen3_dir):
    engine = Engine(config(qwen3_dir, drafter="ngram", cost_table_profile="coarse"))
    system, prompts = shared_prompts(engine.model_config.vocab_size)
    finish(engine, [prompts[0]])
    assert engine.pages.num_cached_pages == SYSTEM_PAGES
    engine.load_cost_table(force=True)  # its dummy forwards write over every page
    assert engine.pages.num_cached_pages == 0
    rid = engine.add_request(prompts[1], GREEDY)
    assert engine.seqs[rid].num_cached_tokens == 0
    out = None
    while engine.has_unfinished():
        out = next((o for o in engine.step() if o.request_id == rid), out)
    assert out.token_ids == alone(qwen3_dir, prompts)[1]
