"""Bad input fails with a clear error naming the problem; KV exhaustion refuses only the newcomer."""

from __future__ import annotations

import shutil

import pytest

from dspark import LLM, AdmissionError, InvalidRequestError, ModelLoadError, SamplingParams
from dspark.config import EngineConfig
from dspark.engine import Engine


@pytest.fixture(scope="module")
def engine(qwen3_dir):
    return Engine(EngineConfig(model=str(qwen3_dir), num_kv_pages=32, kv_page_size=8))


@pytest.mark.parametrize(
    "kwargs, field",
    [
        ({"max_tokens": 0}, "max_tokens"),
        ({"max_tokens": -3}, "max_tokens"),
        ({"temperature": -0.1}, "temperature"),
        ({"top_p": 0.0}, "top_p"),
        ({"top_p": 1.5}, "top_p"),
        ({"temperature": "hot"}, "temperature"),
        ({"max_tokens": 2.5}, "max_tokens"),
        ({"stop": [""]}, "stop"),
        ({"seed": "x"}, "seed"),
        # Numerically unsafe values: refused at the door, never sampled with.
        ({"temperature": float("inf")}, "temperature"),
        ({"temperature": float("nan")}, "temperature"),
        ({"temperature": 1e308}, "temperature"),
        ({"temperature": 10**400}, "temperature"),
        ({"top_p": float("nan")}, "top_p"),
        ({"top_p": float("inf")}, "top_p"),
        ({"seed": 2**63}, "seed"),
        ({"seed": -(2**63) - 1}, "seed"),
        ({"sla_class": ["gold"]}, "sla_class"),
    ],
)
def test_sampling_params_name_the_field(kwargs, field):
    with pytest.raises(InvalidRequestError) as err:
        SamplingParams(**kwargs)
    assert err.value.field == field
    assert field in str(err.value)


def test_sampling_params_at_the_edges_of_their_ranges_are_accepted():
    assert SamplingParams(seed=2**63 - 1).seed == 2**63 - 1 and SamplingParams(seed=-(2**63)).seed == -(2**63)
    assert not SamplingParams(temperature=100.0).greedy
    assert SamplingParams(temperature=1e-40).greedy and not SamplingParams(temperature=1e-5).greedy


def test_empty_prompt(engine):
    for prompt in ("", []):
        with pytest.raises(InvalidRequestError, match="prompt: must not be empty"):
            engine.add_request(prompt, SamplingParams())


def test_prompt_longer_than_context(engine):
    with pytest.raises(
        InvalidRequestError, match=r"prompt: 600 tokens do not fit the model's context of 512"
    ):
        engine.add_request([5] * 600, SamplingParams())
    with pytest.raises(InvalidRequestError, match="max_tokens"):
        engine.add_request([5] * 500, SamplingParams(max_tokens=100))


def test_token_ids_out_of_vocabulary(engine):
    with pytest.raises(InvalidRequestError, match="prompt: token ids"):
        engine.add_request([1, 10**6], SamplingParams())


def test_unknown_drafter(qwen3_dir):
    with pytest.raises(InvalidRequestError, match="drafter: unknown drafter 'eagle9'"):
        LLM(str(qwen3_dir), drafter="eagle9")


def test_model_directory_without_safetensors(tmp_path, qwen3_dir):
    shutil.copy(qwen3_dir / "config.json", tmp_path / "config.json")
    (tmp_path / "pytorch_model.bin").write_bytes(b"not loaded")
    with pytest.raises(ModelLoadError, match=r"no \*\.safetensors weights .*pytorch_model.bin"):
        LLM(str(tmp_path))
    with pytest.raises(ModelLoadError, match="does not exist"):
        LLM(str(tmp_path / "missing"))


def test_kv_exhaustion_refuses_newcomer_and_running_requests_finish_unchanged(qwen3_dir):
    params = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
    prompts = [[7, 8, 9, 10] * 6, [3, 1, 4, 1, 5] * 5]
    alone = LLM(str(qwen3_dir), num_kv_pages=64, kv_page_size=8).generate(prompts, params)

    # Two requests of 64 and 65 tokens need 8 + 9 blocks of 8: the cache of 20 holds them, not a third.
    engine = Engine(EngineConfig(model=str(qwen3_dir), drafter="ngram", num_kv_pages=20, kv_page_size=8))
    for i, p in enumerate(prompts):
        engine.add_request(p, params, request_id=str(i))
    for _ in range(3):
        engine.step()
    with pytest.raises(AdmissionError, match="KV cache exhausted: the request needs 8 pages, 3 of 20"):
        engine.add_request([2] * 24, params)
    with pytest.raises(AdmissionError, match="KV cache too small"):
        engine.add_request([2] * 200, SamplingParams(max_tokens=10))
    results = {}
    while engine.has_unfinished():
        results.update({o.request_id: o.token_ids for o in engine.step() if o.finished})
    assert [results["0"], results["1"]] == [o.token_ids for o in alone]
    assert engine.pages.num_free_pages == 20


def test_abort_frees_blocks(qwen3_dir):
    engine = Engine(EngineConfig(model=str(qwen3_dir), num_kv_pages=16, kv_page_size=8))
    engine.add_request([4] * 30, SamplingParams(max_tokens=50), request_id="a")
    engine.step()
    assert engine.pages.num_free_pages < 16
    out = engine.abort("a")
    assert out.finished and out.finish_reason == "abort"
    assert engine.pages.num_free_pages == 16 and not engine.has_unfinished()
