"""Stop strings, stop token ids and EOS end a request exactly where plain decoding would."""

from __future__ import annotations

import pytest

from dspark import LLM, SamplingParams

PROMPT = "def parse(text):\n    return"


@pytest.fixture(scope="module")
def free_run(qwen3_dir):
    llm = LLM(str(qwen3_dir), num_kv_pages=64, kv_page_size=8)
    return llm.generate(PROMPT, SamplingParams(temperature=0, max_tokens=40, ignore_eos=True))[0]


@pytest.mark.parametrize("drafter", ["none", "ngram"])
def test_stop_string_truncates_text(qwen3_dir, free_run, drafter):
    text = free_run.text
    stop = text[len(text) // 2 : len(text) // 2 + 2]
    assert stop.strip(), "fixture text should have visible characters in the middle"
    llm = LLM(str(qwen3_dir), drafter=drafter, num_kv_pages=64, kv_page_size=8)
    out = llm.generate(PROMPT, SamplingParams(temperature=0, max_tokens=40, ignore_eos=True, stop=[stop]))[0]
    cut = text.index(stop)
    assert out.finish_reason == "stop"
    assert out.text == text[:cut]
    assert out.token_ids == free_run.token_ids[: len(out.token_ids)]
    kept = LLM(str(qwen3_dir), drafter=drafter, num_kv_pages=64, kv_page_size=8).generate(
        PROMPT,
        SamplingParams(
            temperature=0, max_tokens=40, ignore_eos=True, stop=[stop], include_stop_str_in_output=True
        ),
    )[0]
    assert kept.text == text[: cut + len(stop)]


@pytest.mark.parametrize("drafter", ["none", "ngram"])
def test_stop_token_and_eos(qwen3_dir, free_run, drafter):
    token = free_run.token_ids[10]
    first = free_run.token_ids.index(token)
    llm = LLM(str(qwen3_dir), drafter=drafter, num_kv_pages=64, kv_page_size=8)
    out = llm.generate(
        PROMPT, SamplingParams(temperature=0, max_tokens=40, ignore_eos=True, stop_token_ids=[token])
    )[0]
    assert out.token_ids == free_run.token_ids[: first + 1] and out.finish_reason == "stop"
    # The same token as the model's EOS ends generation unless ignore_eos.
    llm.engine.eos_token_ids = frozenset({token})
    eos = llm.generate(PROMPT, SamplingParams(temperature=0, max_tokens=40))[0]
    assert eos.token_ids == out.token_ids and eos.finish_reason == "stop"


def test_length_finish(qwen3_dir, free_run):
    out = LLM(str(qwen3_dir), drafter="ngram", num_kv_pages=64, kv_page_size=8).generate(
        PROMPT, SamplingParams(temperature=0, max_tokens=7, ignore_eos=True)
    )[0]
    assert out.finish_reason == "length" and out.token_ids == free_run.token_ids[:7]
