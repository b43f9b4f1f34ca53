"""Our app config as SGLang's launch arguments: `ServerArgs` keyword arguments plus environment.

`translate` is pure: it maps the fields that mean the same thing in both engines (the target, the DSpark
drafter and its block size, batch and context limits, TP) and refuses, by name, the built-in engine's
options SGLang has no counterpart for. Whether SGLang accepts the result is decided by SGLang itself:
`check_with_sglang` builds its `ServerArgs` and runs its own resolution and checks (`resolve_once`,
`check_server_args`), never a copy of its rules; its refusal comes back naming our field.

SGLang 0.5.23 facts relied on (sglang/srt/arg_groups/, speculative_hook.py):
- DSpark is `speculative_algorithm="DSPARK"`; gamma is `speculative_dspark_block_size` and the verify
  window `speculative_num_draft_tokens` must be gamma + 1. Without either, SGLang reads the block size
  from the draft checkpoint's config.json.
- Per-request verify scheduling (the confidence head, the SPS table, the runtime budget) runs only with
  the environment variable SGLANG_RAGGED_VERIFY_MODE=compact; `static` verifies every drafted token.
- Its RayEngine places one scheduler actor per TP rank with `torch.cuda.set_device(<Ray's GPU id>)`,
  so those actors must see every GPU: RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES=1, as SGLang's own
  Ray benchmark sets.
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

VERIFY_MODE_ENV = "SGLANG_RAGGED_VERIFY_MODE"
NOSET_CUDA_ENV = "RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES"
SINGLE_GPU_ENGINE = "sglang:Engine"
RAY_ENGINE = "sglang.srt.ray.engine:RayEngine"

# Built-in engine options with the same meaning in SGLang: ours -> ServerArgs field.
SAME_MEANING = {
    "max_num_seqs": "max_running_requests",
    "max_model_len": "context_length",
    "dtype": "dtype",
    "seed": "random_seed",
}
TRANSLATED = {"drafter", "drafter_model", "num_speculative_tokens", "device"}
# Where to say the same thing to SGLang, for the built-in options it has no counterpart for.
INSTEAD = {
    "scheduler": "sglang.verify_mode",
    "kv_cache_memory_mb": "sglang.server_args.mem_fraction_static",
    "num_kv_pages": "sglang.server_args.mem_fraction_static",
    "kv_page_size": "sglang.server_args.page_size",
    "max_num_batched_tokens": "sglang.server_args.chunked_prefill_size",
}


class SGLangOptions(BaseModel):
    """The `sglang:` block of the app config (backend: sglang)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    # compact: SGLang's per-request verify lengths from the drafter's confidences within a budget
    # (needs a confidence head; the runtime budget works only here). static: every drafted token verified.
    verify_mode: Literal["compact", "static"] = "compact"
    # SGLang SPS table (JSON, `python -m deployments.sglang_artifacts sps ...` writes one from ours).
    sps_table: str | None = None
    # STS temperatures (JSON), e.g. a drafter's own sts_temperature_<T>.json.
    sts: str | None = None
    # Further ServerArgs fields (mem_fraction_static, attention_backend, ...), checked by SGLang.
    server_args: dict[str, Any] = Field(default_factory=dict)
    # Ray GPUs the replica reserves at tensor_parallel_size 1 (a fraction shares a GPU between replicas,
    # with mem_fraction_static to match; 0 for a stand-in engine). At TP > 1 every rank's bundle holds
    # exactly one GPU: SGLang's scheduler actors ask for one each.
    num_gpus: float = Field(1.0, ge=0)
    # The engine class as module:attribute; default SGLang's Engine (TP 1) or its RayEngine (TP > 1).
    engine_class: str | None = None


@dataclass(frozen=True)
class SGLangLaunch:
    """Everything that starts one SGLang engine for a replica."""

    server_args: dict[str, Any]
    env: dict[str, str]
    engine_class: str
    uses_ray_engine: bool
    verify_mode: str
    gamma: int | None  # None: SGLang takes the draft checkpoint's block size
    # Which of our config fields each server arg / env var came from, to name it in SGLang's refusals.
    origins: dict[str, str] = field(default_factory=dict)


def translate(config, environ: Mapping[str, str]) -> SGLangLaunch:
    """`config` (an AppConfig with backend sglang) as SGLang launch arguments; ValueError names the field.

    `environ` supplies the OpenTelemetry variables (OTEL_EXPORTER_OTLP_*), so SGLang's own spans go to the
    endpoint the rest of the kit exports to.
    """
    options: SGLangOptions = config.sglang or SGLangOptions()
    engine = dict(config.engine)
    for name in sorted(engine):
        if name not in SAME_MEANING and name not in TRANSLATED:
            hint = f"; say it with {INSTEAD[name]}" if name in INSTEAD else ""
            raise ValueError(f"engine.{name}: the built-in engine's option has no SGLang counterpart{hint}")
    tp = config.tensor_parallel_size
    args: dict[str, Any] = {
        "model_path": config.engine_config().model,
        "served_model_name": config.model_name,
        "tp_size": tp,
        "device": engine.get("device", "cuda"),  # GPUs are SGLang's home; its CPU backend only if asked
        # One limit for Serve and SGLang: what the replica admits is what SGLang runs at once.
        "max_running_requests": config.engine_config().max_num_seqs,
    }
    origins = {
        "model_path": "model",
        "served_model_name": "served_model_name",
        "tp_size": "tensor_parallel_size",
        "device": "engine.device",
        "max_running_requests": "engine.max_num_seqs",
    }
    for ours, theirs in SAME_MEANING.items():
        if ours in engine:
            args[theirs], origins[theirs] = engine[ours], f"engine.{ours}"

    drafter = engine.get("drafter", "none")
    gamma = engine.get("num_speculative_tokens")
    if drafter == "dspark":
        from drafter_service.models.paths import default_drafter_dir

        path = engine.get("drafter_model") or default_drafter_dir(args["model_path"], "dspark")
        args |= {"speculative_algorithm": "DSPARK", "speculative_draft_model_path": _abs(path)}
        origins["speculative_algorithm"] = "engine.drafter"
        origins["speculative_draft_model_path"] = "engine.drafter_model"
        if gamma is not None:
            args |= {"speculative_dspark_block_size": gamma, "speculative_num_draft_tokens": gamma + 1}
            for key in ("speculative_dspark_block_size", "speculative_num_draft_tokens"):
                origins[key] = "engine.num_speculative_tokens"
        for theirs, ours in (
            ("speculative_dspark_sps_table_path", "sps_table"),
            ("speculative_dspark_confidence_sts_path", "sts"),
        ):
            if getattr(options, ours) is not None:
                args[theirs], origins[theirs] = _abs(getattr(options, ours)), f"sglang.{ours}"
    elif drafter == "none":
        gamma = None
        for ours in ("sps_table", "sts"):
            if getattr(options, ours) is not None:
                raise ValueError(f"sglang.{ours}: only with engine.drafter: dspark")
    else:
        raise ValueError(
            f"engine.drafter: the SGLang backend serves SGLang's DSpark (dspark) or no drafter (none), "
            f"got {drafter!r}"
        )

    env = {VERIFY_MODE_ENV: options.verify_mode}
    origins[VERIFY_MODE_ENV] = "sglang.verify_mode"
    args |= _tracing(environ, env)
    for key, value in options.server_args.items():
        if key in args:
            raise ValueError(f"sglang.server_args.{key}: set from {origins.get(key, 'the app config')}")
        args[key], origins[key] = value, f"sglang.server_args.{key}"

    uses_ray = tp > 1
    if uses_ray:
        env[NOSET_CUDA_ENV] = "1"
        if options.num_gpus != 1:
            raise ValueError("sglang.num_gpus: at tensor_parallel_size > 1 every rank holds exactly one GPU")
    default_class = RAY_ENGINE if uses_ray else SINGLE_GPU_ENGINE
    return SGLangLaunch(
        server_args=args,
        env=env,
        engine_class=options.engine_class or default_class,
        uses_ray_engine=uses_ray,
        verify_mode=options.verify_mode,
        gamma=gamma,
        origins=origins,
    )


def _abs(path: str | Path) -> str:
    return str(Path(path).expanduser().resolve())


def _tracing(environ: Mapping[str, str], env: dict[str, str]) -> dict[str, Any]:
    """SGLang's own OTLP span export, pointed where the standard OTEL_* variables point ours."""
    disabled = environ.get("OTEL_SDK_DISABLED", "").lower() == "true"
    if disabled or environ.get("OTEL_TRACES_EXPORTER") == "none":
        return {}
    protocol = environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or environ.get("OTEL_EXPORTER_OTLP_PROTOCOL")
    endpoint = environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
    if not endpoint and environ.get("OTEL_EXPORTER_OTLP_ENDPOINT"):
        endpoint = environ["OTEL_EXPORTER_OTLP_ENDPOINT"]
        if protocol == "http/protobuf":  # the common endpoint is a base URL; the traces path is added
            endpoint = endpoint.rstrip("/") + "/v1/traces"
    if not endpoint:
        return {}
    if protocol:
        env["OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"] = protocol  # SGLang reads only this one
    return {"enable_trace": True, "otlp_traces_endpoint": endpoint}


class SGLangRefusal(ValueError):
    """SGLang's own resolution refused the translated arguments; `field` is ours."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: SGLang refused it: {message}")
        self.field = field


def check_with_sglang(launch: SGLangLaunch) -> dict[str, Any]:
    """Build SGLang's ServerArgs and run its resolution and checks; returns the resolved DSpark values.

    Needs sglang importable (GPU host, or a CPU test environment, see tests/sglang_cpu.py). Resolution
    reads the environment (the verify mode), so launch.env is in force while it runs.
    """
    from sglang.srt.arg_groups.overrides import resolving_view
    from sglang.srt.server_args import ServerArgs

    try:
        server_args = ServerArgs(**launch.server_args)
    except TypeError as exc:  # "Unexpected keyword argument 'x'"
        raise SGLangRefusal(_field_of(str(exc), launch), str(exc)) from None
    with _environment(launch.env):
        try:
            server_args.resolve_once()
            server_args.check_server_args()
        except (ValueError, TypeError, AssertionError, RuntimeError, OSError) as exc:
            raise SGLangRefusal(_field_of(str(exc), launch), str(exc)) from None
        view = resolving_view(server_args)
        names = ("speculative_algorithm", "speculative_num_draft_tokens", "max_running_requests", "tp_size")
        resolved = {name: getattr(view, name) for name in names}
    if resolved["speculative_algorithm"] == "DSPARK" and "speculative_draft_model_path" in launch.server_args:
        _check_drafter_with_sglang(launch, resolved["speculative_num_draft_tokens"])
    return resolved


def _check_drafter_with_sglang(launch: SGLangLaunch, num_draft_tokens: int) -> None:
    """What SGLang checks of the draft checkpoint only as its worker starts (DSparkWorkerV2:
    resolve_runtime_config; the draft backbone: its target_layer_ids), run ahead with SGLang's own
    functions, so that a checkpoint it cannot serve (markov_rank 0, a tap on layer -1) is refused here."""
    from sglang.srt.speculative.dflash_utils import parse_dflash_draft_config
    from sglang.srt.speculative.dspark_components.dspark_config import resolve_runtime_config
    from sglang.srt.utils.hf_transformers_utils import get_config

    try:
        draft = get_config(launch.server_args["speculative_draft_model_path"], trust_remote_code=False)
        target = get_config(launch.server_args["model_path"], trust_remote_code=False)
        resolve_runtime_config(draft_hf_config=draft, speculative_num_draft_tokens=num_draft_tokens,
                               target_vocab_size=int(target.vocab_size))  # fmt: skip
        parse_dflash_draft_config(draft_hf_config=draft).resolve_target_layer_ids(
            target_num_layers=int(target.num_hidden_layers), draft_num_layers=int(draft.num_hidden_layers)
        )
    except (ValueError, TypeError, OSError) as exc:
        raise SGLangRefusal(launch.origins["speculative_draft_model_path"], str(exc)) from None


def _field_of(message: str, launch: SGLangLaunch) -> str:
    """Our config field behind the first server arg SGLang's message names: by name, --flag, env var,
    or its value (a path it could not read)."""
    found = []
    for key, ours in launch.origins.items():
        value = launch.server_args.get(key)
        spellings = {key, "--" + key.replace("_", "-")}
        if isinstance(value, str) and "/" in value:
            spellings.add(value)
        for spelling in spellings:
            match = re.search(rf"(?<![\w-]){re.escape(spelling)}(?![\w-])", message)
            if match:
                found.append((match.start(), ours))
    return min(found)[1] if found else "sglang"


@contextlib.contextmanager
def _environment(env: Mapping[str, str]) -> Iterator[None]:
    saved = {key: os.environ.get(key) for key in env}
    os.environ.update(env)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
