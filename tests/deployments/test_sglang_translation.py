"""The SGLang backend's pure parts, without SGLang: app config -> launch arguments, SGLang's chunks ->
our events, our draft budget -> SGLang's knob. (SGLang's own acceptance of the arguments is
test_sglang_args.py, with SGLang installed.)"""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from deployments.config import AppConfig
from deployments.sglang_args import NOSET_CUDA_ENV, RAY_ENGINE, SINGLE_GPU_ENGINE, VERIFY_MODE_ENV, translate
from deployments.sglang_budget import ROUNDING_GUARD, force_budget_frac, in_force, split
from deployments.sglang_events import ChunkReader, sampling_params, speculation
from dspark.draft_budget import DraftBudget
from dspark.errors import AdmissionError, InvalidRequestError, RequestFailedError
from dspark.sampling_params import SamplingParams


def sglang_config(model: Path, engine: dict | None = None, **fields) -> AppConfig:
    return AppConfig(model=str(model), backend="sglang", engine=engine or {}, **fields)


def test_dspark_in_compact_mode_translates_field_by_field(tmp_path):
    drafter = tmp_path / "drafter"
    config = sglang_config(
        tmp_path / "target",
        {
            "drafter": "dspark",
            "drafter_model": str(drafter),
            "num_speculative_tokens": 7,
            "max_num_seqs": 32,
            "max_model_len": 4096,
            "dtype": "bfloat16",
            "seed": 3,
        },  # fmt: skip
        sglang={
            "sps_table": str(tmp_path / "sps.json"),
            "sts": str(tmp_path / "sts.json"),
            "server_args": {"mem_fraction_static": 0.8},
        },  # fmt: skip
        served_model_name="m",
    )
    launch = translate(config, {})
    assert launch.server_args == {
        "model_path": str((tmp_path / "target").resolve()),
        "served_model_name": "m",
        "tp_size": 1,
        "device": "cuda",
        "max_running_requests": 32,
        "context_length": 4096,
        "dtype": "bfloat16",
        "random_seed": 3,
        "speculative_algorithm": "DSPARK",
        "speculative_draft_model_path": str(drafter.resolve()),
        "speculative_dspark_block_size": 7,
        "speculative_num_draft_tokens": 8,
        "speculative_dspark_sps_table_path": str((tmp_path / "sps.json").resolve()),
        "speculative_dspark_confidence_sts_path": str((tmp_path / "sts.json").resolve()),
        "mem_fraction_static": 0.8,
    }
    assert launch.env == {VERIFY_MODE_ENV: "compact"}
    assert (launch.engine_class, launch.uses_ray_engine, launch.gamma) == (SINGLE_GPU_ENGINE, False, 7)


def test_tensor_parallel_uses_the_ray_engine_with_every_gpu_visible(tmp_path):
    launch = translate(sglang_config(tmp_path, tensor_parallel_size=4, sglang={"verify_mode": "static"}), {})
    assert (launch.server_args["tp_size"], launch.engine_class, launch.uses_ray_engine) == (
        4,
        RAY_ENGINE,
        True,
    )
    assert launch.env == {VERIFY_MODE_ENV: "static", NOSET_CUDA_ENV: "1"}
    assert "speculative_algorithm" not in launch.server_args and launch.gamma is None


def test_the_drafter_defaults_beside_the_target_and_gamma_to_its_checkpoint(tmp_path):
    launch = translate(sglang_config(tmp_path / "target", {"drafter": "dspark"}), {})
    assert launch.server_args["speculative_draft_model_path"] == str(
        (tmp_path / "drafters" / "dspark").resolve()
    )
    assert "speculative_dspark_block_size" not in launch.server_args and launch.gamma is None


@pytest.mark.parametrize(
    ("environ", "expected", "protocol"),
    [
        ({}, None, None),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4317"}, "http://collector:4317", None),
        (
            {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318/", "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf"},
            "http://c:4318/v1/traces",
            "http/protobuf",
        ),  # fmt: skip
        (
            {
                "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://c:4318/v1/traces",
                "OTEL_EXPORTER_OTLP_ENDPOINT": "x",
            },
            "http://c:4318/v1/traces",
            None,
        ),  # fmt: skip
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4317", "OTEL_SDK_DISABLED": "true"}, None, None),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4317", "OTEL_TRACES_EXPORTER": "none"}, None, None),
    ],
)
def test_sglangs_span_export_follows_the_standard_otel_variables(tmp_path, environ, expected, protocol):
    launch = translate(sglang_config(tmp_path), environ)
    assert launch.server_args.get("otlp_traces_endpoint") == expected
    assert launch.server_args.get("enable_trace") == (True if expected else None)
    assert launch.env.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") == protocol


@pytest.mark.parametrize(
    ("fields", "field", "hint"),
    [
        ({"engine": {"scheduler": "dspark"}}, "engine.scheduler", "sglang.verify_mode"),
        ({"engine": {"kv_cache_memory_mb": 512}}, "engine.kv_cache_memory_mb", "mem_fraction_static"),
        ({"engine": {"drafter": "ngram"}}, "engine.drafter", "got 'ngram'"),
        ({"sglang": {"sts": "x.json"}}, "sglang.sts", "engine.drafter: dspark"),
        ({"sglang": {"server_args": {"tp_size": 2}}}, "sglang.server_args.tp_size", "tensor_parallel_size"),
        ({"sglang": {"num_gpus": 0.5}, "tensor_parallel_size": 2}, "sglang.num_gpus", "exactly one GPU"),
        ({"sglang": {"verify_mode": "cap-accept"}}, "sglang.verify_mode", "compact"),
        ({"sglang": {"sps": "x"}}, "sglang.sps", "Extra inputs"),
    ],
)
def test_what_sglang_has_no_counterpart_for_is_refused_by_name(tmp_path, fields, field, hint):
    with pytest.raises(ValidationError) as info:
        AppConfig(model=str(tmp_path), backend="sglang", **fields)
    message = str(info.value)
    assert field.split(".")[-1] in message and hint in message


def test_sglang_options_need_the_sglang_backend(tmp_path):
    with pytest.raises(ValidationError, match="sglang: SGLang's options apply with backend: sglang only"):
        AppConfig(model=str(tmp_path), sglang={"verify_mode": "static"})


def test_sampling_params_in_sglangs_names():
    params = SamplingParams(temperature=0.0, top_p=0.9, top_k=0, max_tokens=5, stop=("x",),
                            stop_token_ids=(2,), seed=4, include_stop_str_in_output=True)  # fmt: skip
    assert sampling_params(params) == {
        "max_new_tokens": 5, "temperature": 0.0, "top_p": 0.9, "top_k": -1, "ignore_eos": False,
        "no_stop_trim": True, "stop": ["x"], "stop_token_ids": [2], "sampling_seed": 4,
    }  # fmt: skip


def test_cumulative_chunks_become_delta_events_and_spec_counters_come_last():
    reader, live = ChunkReader("r", 3), [5, 6]
    first = reader.event({"text": "ab", "output_ids": live, "meta_info": {"finish_reason": None}})
    live.extend([7, 8, 9])  # SGLang keeps appending to the list it handed out
    assert first.token_ids == (5, 6) and first.text == "ab" and first.speculation.rounds == 0
    second = reader.event({"text": "ab", "output_ids": live, "meta_info": {"finish_reason": None}})
    assert second.token_ids == (7, 8, 9)
    assert (
        reader.event({"text": "abcd", "output_ids": live, "meta_info": {"finish_reason": None}}).text == "cd"
    )
    assert reader.event({"text": "abcd", "output_ids": live, "meta_info": {"finish_reason": None}}) is None
    meta = {"finish_reason": {"type": "length", "length": 6}, "prompt_tokens": 3, "completion_tokens": 6,
            "spec_verify_ct": 2, "spec_num_correct_drafts": 4, "spec_num_proposed_drafts": 14}  # fmt: skip
    last = reader.event({"text": "abcde", "output_ids": live + [1], "meta_info": meta})
    assert (last.token_ids, last.text, last.finished, last.finish_reason) == ((1,), "e", True, "length")
    assert (last.prompt_tokens, last.completion_tokens) == (3, 6)
    assert last.speculation.to_dict() == {
        "rounds": 2, "drafted_tokens": 14, "accepted_tokens": 4, "mean_accept_length": 3.0,
        "proposed_tokens": 14, "accepted_by_position": []}  # fmt: skip


def test_compact_mode_counts_only_the_scheduled_drafts_as_verified():
    meta = {
        "spec_verify_ct": 4,
        "spec_num_correct_drafts": 5,
        "spec_num_proposed_drafts": 28,
        "spec_cap_length": 3.5,
    }
    assert speculation(meta).drafted_tokens == 10  # 4 rounds x 3.5 window - 4 bonus slots


@pytest.mark.parametrize(
    ("status", "error"),
    [
        (400, InvalidRequestError),
        (429, AdmissionError),
        (503, AdmissionError),
        (500, RequestFailedError),
    ],  # fmt: skip
)
def test_an_sglang_refusal_raises_ours(status, error):
    chunk = {
        "output_ids": [],
        "meta_info": {"finish_reason": {"type": "abort", "message": "no", "status_code": status}},
    }
    with pytest.raises(error, match="no"):
        ChunkReader("r", 1).event(chunk)


def test_an_abort_without_status_is_a_finished_stream():
    event = ChunkReader("r", 1).event({"output_ids": [4], "meta_info": {"finish_reason": {"type": "abort"}}})
    assert (event.finished, event.finish_reason, event.token_ids) == (True, "abort", (4,))


@pytest.mark.parametrize(("k", "n"), [(k, n) for k in range(1, 7) for n in (1, 2, 3, 14, 48, 1000)])
def test_a_mean_request_budget_gives_k_tokens_per_running_request(k, n):
    frac = force_budget_frac(
        DraftBudget(max_request_tokens=k), gamma=7, verify_mode="compact", sps_profiled=True
    )
    assert (
        0 < frac <= 1 and int(frac * n * 7) == k * n
    )  # SGLang's own arithmetic (HostConfidenceBudgetPlanner)
    assert frac == pytest.approx((k + ROUNDING_GUARD) / 7)


def test_budgets_that_limit_nothing_clear_the_override():
    assert force_budget_frac(DraftBudget(), 7, "static", False) is None
    assert force_budget_frac(DraftBudget(), 7, "compact", False) is None
    assert force_budget_frac(DraftBudget(max_request_tokens=7), 7, "compact", True) is None
    assert force_budget_frac(DraftBudget(max_request_tokens=9), 7, "compact", True) is None


@pytest.mark.parametrize(
    ("budget", "mode", "field", "why"),
    [
        (DraftBudget(max_request_tokens=3), "static", "max_request_tokens", "verifies every drafted token"),
        (DraftBudget(max_request_tokens=3), "verify-all", "max_request_tokens", "without a profiled SPS"),
        (DraftBudget(max_step_tokens=8), "verify-all", "max_step_tokens", "(sglang.sps_table)"),
        (DraftBudget(max_step_tokens=8), "static", "max_step_tokens", "sglang.verify_mode: compact"),
        (DraftBudget(max_step_tokens=0), "compact", "max_step_tokens", "(0, 1]"),
        (
            DraftBudget(max_request_tokens_by_class={"gold": 2}),
            "compact",
            "max_request_tokens_by_class",
            "SLA",
        ),
        (DraftBudget(max_request_tokens=0), "compact", "max_request_tokens", "(0, 1]"),
    ],
)
def test_budgets_sglang_cannot_apply_are_refused_by_field(budget, mode, field, why):
    """`verify-all`: compact mode without a profiled SPS table, where SGLang ignores the knob too."""
    with pytest.raises(InvalidRequestError, match="") as info:
        force_budget_frac(budget, 7, "compact" if mode == "verify-all" else mode, mode == "compact")
    assert info.value.field == field and why in info.value.message


@pytest.mark.parametrize(("step", "n"), [(s, n) for s in (1, 5, 13, 40, 97) for n in (1, 2, 3, 14, 48)])
def test_a_step_cap_gives_that_many_tokens_at_the_requests_running_then(step, n):
    frac = force_budget_frac(DraftBudget(max_step_tokens=step), 7, "compact", True, running=n)
    if step >= n * 7:
        assert frac is None  # the whole batch's drafts: no limit
    else:
        assert 0 < frac <= 1 and int(frac * n * 7) == step  # SGLang's own arithmetic
    both = force_budget_frac(
        DraftBudget(max_step_tokens=step, max_request_tokens=2), 7, "compact", True, running=n
    )
    assert both is None if min(step, 2 * n) >= 7 * n else int(both * n * 7) == min(step, 2 * n)
    # With nobody running a step cap binds nothing; a request cap still does.
    assert force_budget_frac(DraftBudget(max_step_tokens=step), 7, "compact", True, running=0) is None


def test_split_applies_what_sglang_can_and_refuses_the_rest_with_reason_codes():
    budget = DraftBudget(max_step_tokens=0, max_request_tokens=3, max_request_tokens_by_class={"b": 1})
    kept, refused = split(budget, "compact", True)
    assert kept == DraftBudget(max_request_tokens=3)
    assert [(r.field, r.reason) for r in refused] == [
        ("max_step_tokens", "sglang_no_runtime_plain_decoding"),
        ("max_request_tokens_by_class", "sglang_no_class_budget"),
    ]
    kept, refused = split(DraftBudget(max_step_tokens=9, max_request_tokens=3), "static", True)
    assert kept == DraftBudget() and {r.reason for r in refused} == {"sglang_knob_ignored"}
    assert [r.field for r in refused] == ["max_step_tokens", "max_request_tokens"]
    assert split(DraftBudget(max_step_tokens=9), "compact", True) == (DraftBudget(max_step_tokens=9), [])
    # The step-time limit moves the prefill chunk, a launch argument in SGLang: refused in every mode.
    for mode in ("compact", "static"):
        kept, refused = split(DraftBudget(max_request_tokens=3, max_step_s=0.05), mode, True)
        assert kept.max_step_s is None
        assert ("max_step_s", "sglang_no_runtime_step_time") in [(r.field, r.reason) for r in refused]


def test_the_budget_in_force_says_what_sglang_does():
    frac = force_budget_frac(DraftBudget(max_request_tokens=3), 7, "compact", True)
    state = in_force(frac, 7, "compact", True)
    assert state["max_request_tokens"] == 3 and state["max_step_tokens"] is None
    assert (
        state["sglang"]["dspark_force_budget_frac"] == frac
        and "not a per-request cap" in state["sglang"]["meaning"]
    )
    assert in_force(None, 7, "static", False)["sglang"]["meaning"] == "every drafted token is verified"
    assert "without a profiled SPS table" in in_force(None, 7, "compact", False)["sglang"]["meaning"]
    assert in_force(None, 7, "compact", True)["sglang"]["meaning"] == "SGLang's SPS-optimal budget"
    stepped = in_force((10 + ROUNDING_GUARD) / 28, 7, "compact", True, step_cap=(10, 4))
    assert stepped["max_step_tokens"] == 10 and stepped["max_request_tokens"] is None
    assert "10 at the 4 running" in stepped["sglang"]["meaning"]
