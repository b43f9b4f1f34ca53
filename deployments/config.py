"""AppConfig: the application's arguments (a Serve config's `args`), validated once by build_app."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, model_validator

from dspark.config import EngineConfig


class AppConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    model: str = Field(description="local checkpoint directory of the target (safetensors + tokenizer)")
    served_model_name: str | None = Field(None, description="the `model` clients ask for; default: dir name")
    # Any EngineConfig field except `model`: drafter, drafter_model, num_speculative_tokens, dtype, device,
    # kv_cache_memory_mb, max_num_seqs, max_model_len, ...
    engine: dict = Field(default_factory=dict)
    tensor_parallel_size: int = Field(1, ge=1)
    num_replicas: int = Field(1, ge=1)
    # Logical Ray resources per target shard (the replica is shard 0) and for the ingress.
    replica_num_cpus: float = Field(1.0, ge=0)
    ingress_num_cpus: float = Field(0.5, ge=0)
    torch_num_threads: int | None = Field(None, ge=1, description="per shard; default: torch's choice")
    max_ongoing_requests: int | None = Field(None, ge=1, description="per replica; default: max_num_seqs")
    max_queued_requests: int = Field(256, ge=-1, description="ingress queue before 429; -1: unbounded")
    max_request_bytes: int = Field(1 << 20, ge=1024)
    api_keys: list[str] = Field(default_factory=list, description="bearer tokens accepted; empty: open")
    stuck_after_s: float = Field(
        30.0, gt=0, description="a replica with work but no step for this long is unhealthy"
    )
    health_check_period_s: float = Field(5.0, gt=0)
    health_check_timeout_s: float = Field(30.0, gt=0)
    graceful_shutdown_timeout_s: float = Field(20.0, ge=0)
    routing_stats_period_s: float = Field(1.0, gt=0)

    @model_validator(mode="after")
    def _engine_fields(self) -> AppConfig:
        if "model" in self.engine:
            raise ValueError("engine.model: set the top-level `model` instead")
        try:
            self.engine_config()  # EngineConfig names the field if an option is wrong
        except TypeError as exc:  # an unknown option
            raise ValueError(f"engine: {exc}") from None
        return self

    def engine_config(self) -> EngineConfig:
        return EngineConfig(model=str(Path(self.model).expanduser().resolve()), **self.engine)

    @property
    def model_name(self) -> str:
        return self.served_model_name or Path(self.model).resolve().name

    @property
    def uses_gpu(self) -> bool:
        return str(self.engine.get("device", "cpu")).startswith("cuda")
