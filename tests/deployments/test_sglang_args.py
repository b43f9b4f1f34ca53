"""Our translated arguments through SGLang's OWN resolution (ServerArgs.resolve_once and
check_server_args of sglang 0.5.23, installed without its GPU dependencies): accepted for DSpark, TP and
both verify modes, refused for invalid combinations with SGLang's reason under our field's name.

`device: cuda` resolves on a machine without a GPU (SGLang's resolution probes no device)."""

from __future__ import annotations

import pytest
from sglang_cpu import require_sglang

require_sglang()

from deployments.config import AppConfig  # noqa: E402
from deployments.sglang_args import SGLangRefusal, check_with_sglang, translate  # noqa: E402
from tests.drafter_service.drafter_fixtures import save_untrained_dspark  # noqa: E402


@pytest.fixture(scope="module")
def drafter(qwen3_dir, tmp_path_factory):
    return save_untrained_dspark(qwen3_dir, tmp_path_factory.mktemp("sglang") / "dspark", gamma=5)


def launch(qwen3_dir, drafter, engine=None, **fields):
    engine = {"drafter": "dspark", "drafter_model": str(drafter)} | (engine or {})
    return translate(AppConfig(model=str(qwen3_dir), backend="sglang", engine=engine, **fields), {})


def test_dspark_compact_is_accepted_with_the_verify_window_gamma_plus_one(qwen3_dir, drafter):
    resolved = check_with_sglang(
        launch(qwen3_dir, drafter, {"num_speculative_tokens": 4, "max_num_seqs": 16})
    )
    assert resolved == {
        "speculative_algorithm": "DSPARK", "speculative_num_draft_tokens": 5, "max_running_requests": 16,
        "tp_size": 1}  # fmt: skip


def test_without_a_block_size_sglang_takes_the_checkpoints(qwen3_dir, drafter):
    resolved = check_with_sglang(launch(qwen3_dir, drafter))
    assert resolved["speculative_num_draft_tokens"] == 6  # the drafter's block_size 5, plus one


def test_tensor_parallel_and_static_mode_are_accepted(qwen3_dir, drafter):
    resolved = check_with_sglang(
        launch(
            qwen3_dir,
            drafter,
            {"num_speculative_tokens": 3},
            tensor_parallel_size=2,
            sglang={"verify_mode": "static"},
        )  # fmt: skip
    )
    assert (resolved["tp_size"], resolved["speculative_num_draft_tokens"]) == (2, 4)


def test_sglangs_own_arguments_pass_through_its_checks(qwen3_dir, drafter):
    resolved = check_with_sglang(
        launch(
            qwen3_dir,
            drafter,
            sglang={"server_args": {"mem_fraction_static": 0.7, "chunked_prefill_size": 512}},
        )
    )
    assert resolved["speculative_algorithm"] == "DSPARK"


@pytest.mark.parametrize(
    ("engine", "fields", "field", "reason"),
    [
        ({"num_speculative_tokens": 0}, {}, "engine.num_speculative_tokens", "to be positive"),
        ({"device": "cpu"}, {}, "engine.device", "only supports CUDA, NPU or XPU"),
        (
            {},
            {"sglang": {"server_args": {"speculative_eagel_topk": 2}}},
            "sglang.server_args.speculative_eagel_topk",
            "Unexpected keyword argument",
        ),  # fmt: skip
        ({}, {"sglang": {"server_args": {"pp_size": 2}}}, "sglang.server_args.pp_size", "pp_size"),
        ({"drafter_model": "/nonexistent/drafter"}, {}, "engine.drafter_model", ""),
    ],
)
def test_invalid_combinations_are_refused_by_sglang_naming_our_field(
    qwen3_dir, drafter, engine, fields, field, reason
):
    with pytest.raises(SGLangRefusal) as info:
        check_with_sglang(launch(qwen3_dir, drafter, engine, **fields))
    assert info.value.field == field and reason in str(info.value), str(info.value)


@pytest.mark.parametrize(
    ("fields", "reason"),
    [
        (
            {"markov_rank": 0, "markov_head_type": None, "confidence_head_with_markov": False},
            "markov_rank > 0",
        ),
        ({"target_layer_ids": [-1, 1]}, "target_layer_ids"),
    ],
)
def test_a_drafter_sglangs_worker_would_reject_is_refused_at_build_time(qwen3_dir, tmp_path, fields, reason):
    """Checkpoints our engine serves and SGLang's DSpark worker rejects as it starts."""
    drafter = save_untrained_dspark(qwen3_dir, tmp_path / "dspark", gamma=4, **fields)
    with pytest.raises(SGLangRefusal) as info:
        check_with_sglang(launch(qwen3_dir, drafter))
    assert info.value.field == "engine.drafter_model" and reason in str(info.value), str(info.value)
