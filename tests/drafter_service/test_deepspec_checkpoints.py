"""Drafters as DeepSpec writes them: a checkpoint in DeepSpec's exact layout (deepspec_fixture.py) loads
through the public path and computes what an independent reference computes; every Markov head and
confidence-head variant; the RoPE base and type come from the drafter's own rope_parameters."""

from __future__ import annotations

import json

import pytest
import torch
from deepspec_fixture import draft_config, write_checkpoint
from deepspec_reference import block_states, corrected_logits
from safetensors.torch import load_file

from dspark import LLM, SamplingParams
from dspark.checkpoint import load_checkpoint
from dspark.drafter import DraftRequest, create_drafter
from dspark.model import CausalLM
from dspark.sampling import probs_from_logits

GAMMA, CONTEXT = 4, 9
# The reference's arithmetic: serving may run the LM head from a bf16 copy where that is faster
# (runtime/vocab_heads.py), which rounds the logits; these tests compare with the reference exactly.
REFERENCE_MATH = dict(num_speculative_tokens=GAMMA, head_dtype="float32", compute_dtype="float32")

VARIANTS = {  # name -> (drafter kind, build_draft_config arguments)
    "vanilla": ("dspark", dict(markov_head_type="vanilla")),
    "gated": ("dspark", dict(markov_head_type="gated")),
    "rnn": ("dspark", dict(markov_head_type="rnn")),
    "rnn_no_confidence": ("dspark", dict(markov_head_type="rnn", confidence_head_alpha=0.0)),
    "confidence_without_markov_input": ("dspark", dict(confidence_head_with_markov=False)),
    "rank0_with_confidence": ("dspark", dict(markov_rank=0, confidence_head_with_markov=False)),
    "dflash": ("dflash", dict(markov_rank=0, confidence_head_alpha=0.0)),
}


@pytest.fixture(scope="module")
def target(qwen3_dir) -> CausalLM:
    return CausalLM.from_checkpoint(load_checkpoint(qwen3_dir, load_tokenizer=False))


def fixture_dir(tmp_path, qwen3_dir, dtype=torch.float32, **overrides):
    # Layer -1 (the embedding output) and a middle layer; a RoPE base (1e6) that is not the target's (1e4).
    args = dict(target_layer_ids=[-1, 1], block_size=GAMMA, mask_token_id=1, rope_theta=1e6) | overrides
    config = draft_config(qwen3_dir, **args)
    return write_checkpoint(tmp_path / "deepspec_drafter", qwen3_dir, config, dtype=dtype), config


def propose(drafter, hidden, tokens, params, seed=0):
    drafter.add_context("s", tokens[:-1], hidden)
    request = DraftRequest("s", tokens, GAMMA, params, torch.Generator().manual_seed(seed))
    return drafter.propose([request])[0]


def inputs(config, seed=1):
    gen = torch.Generator().manual_seed(seed)
    hidden = torch.randn(CONTEXT, len(config["target_layer_ids"]) * config["hidden_size"], generator=gen)
    tokens = torch.randint(2, config["vocab_size"], (CONTEXT + 1,), generator=gen).tolist()
    return hidden, tokens


@pytest.mark.parametrize("variant", VARIANTS)
def test_deepspec_checkpoint_matches_the_reference(tmp_path, qwen3_dir, target, variant):
    kind, args = VARIANTS[variant]
    directory, config = fixture_dir(tmp_path, qwen3_dir, **args)
    weights = load_file(str(directory / "model.safetensors"))
    hidden, tokens = inputs(config)
    h = block_states(weights, config, hidden, tokens[-1])
    for params in (SamplingParams(temperature=0), SamplingParams(temperature=0.8)):
        drafter = create_drafter(kind, target=target, path=str(directory), **REFERENCE_MATH)
        assert drafter.name == kind and drafter.target_layer_ids == (-1, 1)
        proposal = propose(drafter, hidden, tokens, params)
        assert len(proposal.token_ids) == GAMMA
        logits, conf = corrected_logits(weights, config, h, [tokens[-1]] + proposal.token_ids[:-1])
        if params.greedy:  # each drafted token is the argmax given the tokens drafted before it
            assert proposal.token_ids == logits.argmax(-1).tolist()
        else:  # q is exactly the distribution each token was drawn from
            expected = torch.stack([probs_from_logits(row.float(), params) for row in logits])
            torch.testing.assert_close(proposal.probs, expected, atol=2e-5, rtol=1e-4)
        if conf is None:
            assert proposal.confidence_logits is None and not drafter.reports_confidence
        else:
            torch.testing.assert_close(proposal.confidence_logits, conf.float(), atol=2e-5, rtol=1e-4)


def test_a_bfloat16_checkpoint_beside_an_fp32_target(tmp_path, qwen3_dir, target):
    """As DeepSpec saves them: bf16 weights (embed / lm_head copies rounded to bf16) load into the
    fp32 target's dtype and compute what the reference computes from the same bf16 weights."""
    directory, config = fixture_dir(tmp_path, qwen3_dir, dtype=torch.bfloat16, markov_head_type="rnn")
    assert json.loads((directory / "config.json").read_text())["dtype"] == "bfloat16"
    weights = load_file(str(directory / "model.safetensors"))
    weights |= {  # the drafter computes with the target's own (fp32) embedding and LM head
        "embed_tokens.weight": target.model.embed_tokens.weight.detach(),
        "lm_head.weight": target.lm_head.weight.detach(),
    }
    hidden, tokens = inputs(config)
    drafter = create_drafter("dspark", target=target, path=str(directory), **REFERENCE_MATH)
    assert drafter.model.dtype == torch.float32
    proposal = propose(drafter, hidden, tokens, SamplingParams(temperature=0))
    h = block_states(weights, config, hidden, tokens[-1])
    logits, conf = corrected_logits(weights, config, h, [tokens[-1]] + proposal.token_ids[:-1])
    assert proposal.token_ids == logits.argmax(-1).tolist()
    torch.testing.assert_close(proposal.confidence_logits, conf.float(), atol=2e-5, rtol=1e-4)


def test_the_rope_base_of_rope_parameters_is_used(tmp_path, qwen3_dir, target):
    """The drafter's base is 1e6, its target's 1e4: its outputs follow 1e6 and not the other."""
    directory, config = fixture_dir(tmp_path, qwen3_dir, markov_rank=0, confidence_head_alpha=0.0)
    weights = load_file(str(directory / "model.safetensors"))
    hidden, tokens = inputs(config)
    drafter = create_drafter("dflash", target=target, path=str(directory), **REFERENCE_MATH)
    drafter.add_context("s", tokens[:-1], hidden)
    model = drafter.model
    with torch.inference_mode():
        context = model.context_kv(model.context_features(hidden[None]), torch.arange(CONTEXT)[None])
        block = torch.tensor([[tokens[-1]] + [1] * (GAMMA - 1)])
        mask = torch.ones(1, GAMMA, CONTEXT + GAMMA, dtype=torch.bool)
        ours = model.run_block(block, CONTEXT + torch.arange(GAMMA)[None], context, mask)[0].double()
    torch.testing.assert_close(ours, block_states(weights, config, hidden, tokens[-1]), atol=1e-5, rtol=1e-5)
    other = block_states(weights, config, hidden, tokens[-1], theta=1e4)
    assert (ours - other).abs().max() > 1e-2


@pytest.mark.parametrize(
    "rope",
    [
        {"rope_type": "linear", "rope_theta": 1e6, "factor": 2.0},
        {"rope_type": "llama3", "rope_theta": 5e5, "factor": 8.0, "low_freq_factor": 1.0,
         "high_freq_factor": 4.0, "original_max_position_embeddings": 64},
        {"rope_type": "yarn", "rope_theta": 1e6, "factor": 4.0, "original_max_position_embeddings": 128},
    ],
    ids=lambda r: r["rope_type"],
)  # fmt: skip
def test_every_static_rope_type_matches_transformers(tmp_path, qwen3_dir, target, rope):
    from transformers import Qwen3Config
    from transformers.models.qwen3.modeling_qwen3 import Qwen3RotaryEmbedding

    directory, config = fixture_dir(tmp_path, qwen3_dir, markov_rank=0, confidence_head_alpha=0.0)
    config["rope_parameters"] = rope
    (directory / "config.json").write_text(json.dumps(config))
    drafter = create_drafter("dflash", target=target, path=str(directory))
    positions = torch.arange(0, 400, 7)
    cos, sin = drafter.model.rotary_emb.cos_sin(positions, torch.float32)
    hf = Qwen3RotaryEmbedding(Qwen3Config(**{k: v for k, v in config.items() if k != "architectures"}))
    hf_cos, hf_sin = hf(torch.zeros(1, dtype=torch.float32), positions[None])
    torch.testing.assert_close((cos, sin), (hf_cos[0], hf_sin[0]))


def test_greedy_with_a_deepspec_drafter_is_the_target_alone(tmp_path, qwen3_dir):
    """In the engine, tapping layer -1 (the embedding output) and layer 1: output token-identical."""
    directory, _ = fixture_dir(tmp_path, qwen3_dir, markov_head_type="rnn")
    prompts = [[5, 9, 33, 7], [100, 3], [42] * 6]
    greedy = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    expected = LLM(str(qwen3_dir), num_kv_pages=64).generate(prompts, greedy)
    llm = LLM(
        str(qwen3_dir),
        drafter="dspark",
        drafter_model=str(directory),
        num_speculative_tokens=GAMMA,
        scheduler="fixed",
        num_kv_pages=64,
    )
    assert [o.token_ids for o in llm.generate(prompts, greedy)] == [e.token_ids for e in expected]
    assert llm.engine.stats.drafted_tokens > 0


def test_training_taps_layer_minus_one_as_the_engine_does(qwen3_dir):
    from transformers import AutoModelForCausalLM

    from drafter_service.training.target_states import FrozenTarget

    tokens = torch.tensor([[5, 9, 33, 7, 100, 3]])
    states = FrozenTarget(str(qwen3_dir), {-1, 1}).states(tokens, torch.tensor([6]))
    reference = AutoModelForCausalLM.from_pretrained(qwen3_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        expected = reference(tokens, output_hidden_states=True).hidden_states
    torch.testing.assert_close(states.taps([-1, 1]), torch.cat([expected[0], expected[2]], -1))
