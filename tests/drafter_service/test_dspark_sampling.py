"""The statistical losslessness test with a trained DSpark drafter: its Markov-conditioned q and
confidences change nothing in the emitted distribution."""

from __future__ import annotations

import pytest
import torch
from drafter_fixtures import tiny_configs, train_tiny_stack
from lossless_check import (
    PARAMS,
    SAMPLES,
    VOCAB,
    build_small_vocab_target,
    exact_marginals,
    p_values,
    sample_counts,
)

from dspark import LLM
from dspark.config import EngineConfig
from dspark.engine import Engine


@pytest.fixture(scope="module")
def small_stack(tmp_path_factory):
    target = tmp_path_factory.mktemp("small_stack") / "target"
    target.mkdir()
    build_small_vocab_target(target)
    # No tokenizer at this vocabulary size: token 0 plays the reserved MASK.
    configs = {"dspark": tiny_configs(target, mask_token_id=0, gamma=3)["dspark"]}
    train_tiny_stack(target, configs, VOCAB, pad_id=0, steps=40, prompt_len=4, answer_len=12)
    return target


@pytest.mark.parametrize("params", PARAMS, ids=["t1", "t0.8-topk-topp"])
def test_dspark_drafter_keeps_the_target_distribution(small_stack, params):
    engine = Engine(
        EngineConfig(
            model=str(small_stack),
            drafter="dspark",
            num_speculative_tokens=3,
            scheduler="fixed",  # fixed windows: every drafted slot is put to the test
            max_num_seqs=64,
            num_kv_pages=256,
            kv_page_size=4,
            seed=5,
        )
    )
    counts = sample_counts(engine, params)
    assert engine.stats.drafted_tokens > SAMPLES
    assert 0 < engine.stats.accepted_tokens < engine.stats.drafted_tokens
    pvals = p_values(counts, exact_marginals(small_stack, params))
    assert min(pvals) > 1e-3, pvals


def test_dspark_greedy_identical_on_small_vocab(small_stack):
    prompts = [[1, 2, 3], [4, 5, 6, 7, 1], [2]]
    from dspark import SamplingParams

    greedy = SamplingParams(temperature=0, max_tokens=20, ignore_eos=True)
    plain = LLM(str(small_stack), num_kv_pages=64, kv_page_size=4).generate(prompts, greedy)
    drafted = LLM(
        str(small_stack), drafter="dspark", num_speculative_tokens=3, num_kv_pages=64, kv_page_size=4
    ).generate(prompts, greedy)
    assert [o.token_ids for o in drafted] == [o.token_ids for o in plain]
    assert torch.tensor([o.speculation.accepted_tokens for o in drafted]).sum() > 0
