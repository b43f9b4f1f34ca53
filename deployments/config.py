"""AppConfig: the application's arguments (a Serve config's `args`), validated once by build_app."""

from __future__ import annotations

from dataclasses import fields
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from ray.serve.config import AutoscalingConfig

from deployments import gc_policy
from deployments.sglang_args import SGLangOptions
from deployments.telemetry import TelemetryConfig
from dspark.config import EngineConfig
from router.policy import PolicyConfig
from router.sla import DEFAULT_CLASS, DEFAULT_CLASSES, SlaClass

# `router`: ours, or one of Ray Serve's for comparison (the import paths Serve takes).
ROUTERS = {
    "sla": "router.serve_router:SLARequestRouter",
    "pow2": "ray.serve._private.request_router:PowerOfTwoChoicesRequestRouter",  # Serve's default
    "round_robin": "ray.serve.experimental.round_robin_router:RoundRobinRouter",
}


class ControllerSettings(BaseModel):
    """The cluster controller (deployments/controller.py): one deployment beside the replicas."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    period_s: float = Field(2.0, ge=1.0, le=10.0, description="how often it reads replicas and decides")
    # PolicyConfig fields (controller/policy.py) over its defaults: slack, confirm_windows, limits,
    # min_evidence, collapse_acceptance, probe_after, sla_classes {name: {tpot_s, interactive}}, ...
    policy: dict = Field(default_factory=dict)
    admin_tokens: list[str] = Field(default_factory=list, description="bearer tokens of the admin surface")
    record_path: str | None = Field(None, description="append what it sees and decides here (JSONL)")
    recalibrate: bool = Field(True, description="refit STS temperatures and rescale drifting cost tables")
    sts_threshold: float = Field(0.05, gt=0, lt=1, description="pooled ECE past which STS is refitted")
    sts_min_rounds: int = Field(200, ge=1)
    # Its OTLP receiver (plaintext): the replicas' spans and metrics reach it there. OTLP/gRPC on
    # `otlp_port`, and with `otlp_http_port` OTLP/HTTP as well (POST /v1/traces, /v1/metrics), each on a
    # port of its own as a Collector has (4317, 4318). Without the app's own telemetry.otlp_endpoint the
    # replicas export straight to it over `otlp_protocol`; with one (a Collector), the Collector fans
    # out to this address as well (docs/ARCHITECTURE.md §3).
    otlp_port: int | None = Field(
        None, gt=0, lt=65536, description="OTLP/gRPC port of the controller's receiver"
    )
    otlp_http_port: int | None = Field(
        None, gt=0, lt=65536, description="its OTLP/HTTP port (needs otlp_port)"
    )
    otlp_host: str = Field(
        "127.0.0.1", min_length=1, description="address it binds, and replicas reach it at"
    )
    # Ray custom resources its actor needs: the Helm chart pins it to the head pod this way, so that
    # its receiver sits behind the chart's Service (charts/dspark/templates/controller.yaml).
    resources: dict[str, float] = Field(default_factory=dict, description="Ray custom resources it needs")
    otlp_protocol: Literal["grpc", "http/protobuf"] = Field(
        "grpc", description="the protocol the replicas export to it over (http/protobuf needs otlp_http_port)"
    )

    @property
    def otlp_endpoint(self) -> str | None:
        """Where the replicas' exporters send to over `otlp_protocol` (http://: plaintext); None with no
        receiver."""
        port = self.otlp_http_port if self.otlp_protocol == "http/protobuf" else self.otlp_port
        return None if self.otlp_port is None else f"http://{self.otlp_host}:{port}"

    @model_validator(mode="after")
    def _otlp_ports(self) -> ControllerSettings:
        if self.otlp_http_port is not None and self.otlp_port is None:
            raise ValueError(
                "otlp_http_port needs otlp_port (the receiver serves OTLP/gRPC, and HTTP beside it)"
            )
        if self.otlp_protocol == "http/protobuf" and self.otlp_http_port is None:
            raise ValueError("otlp_protocol http/protobuf needs otlp_http_port")
        if self.otlp_http_port is not None and self.otlp_http_port == self.otlp_port:
            raise ValueError("otlp_http_port must differ from otlp_port")
        return self

    @model_validator(mode="after")
    def _policy_fields(self) -> ControllerSettings:
        self.policy_config()  # PolicyConfig names a wrong field or value
        return self

    def policy_config(self):
        from controller.record import config_from_dict

        try:
            return config_from_dict({**self.policy, "period_s": self.period_s})
        except TypeError as exc:
            raise ValueError(f"policy: {exc}") from None


class AppConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    model: str = Field(description="local checkpoint directory of the target (safetensors + tokenizer)")
    served_model_name: str | None = Field(None, description="the `model` clients ask for; default: dir name")
    # Any EngineConfig field except `model`: drafter, drafter_model, num_speculative_tokens, dtype, device,
    # kv_cache_memory_mb, max_num_seqs, max_model_len, ...
    engine: dict = Field(default_factory=dict)
    # Which engine the target replicas run: the built-in torch engine, or SGLang's (GPU hosts with the
    # sglang package; its DSpark implementation). With sglang, `engine` keeps the options that mean the
    # same in both (drafter, drafter_model, num_speculative_tokens, dtype, max_num_seqs, max_model_len,
    # seed, device) and `sglang` holds SGLang's own (deployments/sglang_args.py).
    backend: Literal["builtin", "sglang"] = "builtin"
    sglang: SGLangOptions | None = None
    # Engine options that differ per replica: the replica of Serve rank r also applies
    # engine_by_rank[r % len] on top of `engine` (heterogeneous pools, a canary, benchmarks), e.g.
    # [{}, {"drafter": "none"}] runs every other replica without speculation. A replica follows its rank:
    # when Serve changes it (Serve makes ranks contiguous again after a rolling update or a replacement),
    # the replica rebuilds its engine if the new rank's differs (deployments/replica_engine.py).
    engine_by_rank: list[dict] = Field(default_factory=list)
    tensor_parallel_size: int = Field(1, ge=1)
    num_replicas: int = Field(1, ge=1, description="target replicas; with autoscaling_config, Serve decides")
    # The ingress holds no request state (Abort reaches every target replica), so it scales out freely.
    num_ingress_replicas: int = Field(
        2, ge=1, description="ingress replicas; with ingress_autoscaling_config, Serve decides"
    )
    # Serve's autoscaling (ray.serve.config.AutoscalingConfig fields: min_replicas, max_replicas,
    # target_ongoing_requests, upscale_delay_s, downscale_delay_s, ...) for the target replicas and for
    # the ingress. Serve changes replica counts over tens of seconds; KubeRay's autoscaler then adds or
    # removes worker pods to fit them.
    autoscaling_config: dict | None = None
    ingress_autoscaling_config: dict | None = None
    # Logical Ray resources per target shard (the replica is shard 0) and per ingress replica.
    replica_num_cpus: float = Field(1.0, ge=0)
    ingress_num_cpus: float = Field(0.5, ge=0)
    # Custom Ray resources each target shard also needs, e.g. {"accelerator_type:H100": 0.001} to keep
    # replicas on one node type, or a resource only one worker group advertises.
    replica_resources: dict[str, float] = Field(default_factory=dict)
    torch_num_threads: int | None = Field(None, ge=1, description="per shard; default: torch's choice")
    max_ongoing_requests: int | None = Field(None, ge=1, description="per replica; default: max_num_seqs")
    max_queued_requests: int = Field(
        256, ge=-1, description="per ingress replica, queued before 429; -1: unbounded"
    )
    max_request_bytes: int = Field(1 << 20, ge=1024)
    # Tokens a target replica gathers per streamed message after the first (vLLM's and SGLang's
    # stream_interval): fewer messages per token on every hop, more time between them. 1: every engine
    # step goes out as soon as it is produced (what piled up meanwhile still travels merged).
    stream_interval: int = Field(1, ge=1)
    # One multiplexed stream per (ingress replica, target replica) pair carries every stream's events after
    # the first, a step's worth in one message (deployments/stream_mux.py); applies with the builtin
    # engine, and with the "serve" transport only with the SLA router and a fixed replica count
    # (`stream_mux_applies`); otherwise one stream per request.
    stream_mux: bool = True
    # What carries a multiplexed stream's events after the first: "socket", a TCP connection from the
    # target replica to the ingress replica (deployments/mux_socket.py: a message costs the replica one
    # socket write, not Serve's streaming plumbing, whose Python holds the lock the engine thread needs);
    # "serve", a streaming call through Serve pinned to the replica (for networks where the replicas'
    # ports cannot be reached from the ingress; it needs the SLA router's pin and no autoscaler).
    stream_mux_transport: Literal["socket", "serve"] = "socket"
    # The Linux scheduling policy of the serving threads: every thread of a target replica but its engine
    # thread, and every thread of the ingress replicas. "batch" (SCHED_BATCH): a serving thread woken by a
    # streamed token never preempts the thread running on its CPU (often the engine's, on a host of few
    # cores); it keeps its fair share of CPU and runs on a free CPU or at the end of the running thread's
    # slice (deployments/thread_policy.py). "normal": the threads keep the policy they started with.
    # Default batch from bench/placement_ab.py on a quiet 2-core host: fewer preemptions of the engine
    # thread per token at concurrency 1 and tok/s/user a few points closer to offline; neutral at 8.
    serving_thread_policy: Literal["normal", "batch"] = "batch"
    # A CPU for the engine thread alone, where the host has one to spare: the target replica runs its
    # engine thread on this CPU only and its other threads, like the ingress replicas' threads, on the
    # other CPUs the process may use (a number the process may not use, or the only one, fails the
    # replica's start naming this field). Keeps our serving threads off the engine's CPU and caches; other
    # processes still run anywhere, and the engine can no longer move when its CPU is taken. Meant for a
    # node that runs one target replica (tensor-parallel shards are left as they are). None: no pinning.
    engine_cpu: int | None = Field(None, ge=0)
    # The ingress replicas' garbage collector (deployments/gc_policy.py), where the SLA router decides:
    # the youngest generation collected every this many allocations, not Python's 700 (Serve freezes
    # the start-up heap already). bench/route_decision.py at 1,000 replicas, stats new every 0.25 s:
    # decisions holding a collection ~1.3 % -> ~0.05 %. None: Python's own threshold.
    serving_gc_threshold: int | None = Field(
        gc_policy.SERVING_YOUNG_THRESHOLD, ge=gc_policy.PYTHON_YOUNG_THRESHOLD
    )
    api_keys: list[str] = Field(default_factory=list, description="bearer tokens accepted; empty: open")
    # Tokens kept out of the config itself: a file with one per line (a mounted Kubernetes Secret),
    # read by the ingress at start and accepted besides `api_keys`.
    api_keys_file: str | None = None
    stuck_after_s: float = Field(
        30.0, gt=0, description="a replica with work but no step for this long is unhealthy"
    )
    health_check_period_s: float = Field(5.0, gt=0)
    health_check_timeout_s: float = Field(30.0, gt=0)
    graceful_shutdown_timeout_s: float = Field(20.0, ge=0)
    # How often Serve's controller pulls each replica's routing stats (Serve's default, 10 s, is far too
    # slow for LLM load); the router ages them and ranks replicas with older ones after the rest.
    routing_stats_period_s: float = Field(0.25, gt=0)
    router: Literal["sla", "pow2", "round_robin"] = "sla"
    # SLA classes by name (router/sla.py): {ttft_ms, tpot_ms, priority, may_shed}; a request picks one
    # with `sla_class` or the x-sla-class header, and may override its targets with x-slo-*-ms headers.
    sla_classes: dict[str, SlaClass] = Field(default_factory=lambda: dict(DEFAULT_CLASSES))
    default_sla_class: str = DEFAULT_CLASS
    # router/policy.py PolicyConfig fields (tie_margin, stale_after_s, min_retry_s, max_retry_s), plus
    # prior_acceptance (drafter acceptance assumed before a replica has verified drafts) and seed.
    router_options: dict = Field(default_factory=dict)
    # OpenTelemetry for every process of the app, as OTEL_* variables of the deployments' runtime_env
    # (deployments/telemetry.py); unset fields leave whatever the environment says.
    telemetry: TelemetryConfig = Field(default_factory=TelemetryConfig)
    controller: ControllerSettings | None = Field(None, description="the cluster controller; None: none")

    @field_validator("autoscaling_config", "ingress_autoscaling_config")
    @classmethod
    def _serve_autoscaling(cls, value: dict | None) -> dict | None:
        if value is None:
            return None
        # Serve's own model ignores unknown keys; a misspelt delay must not pass silently.
        if unknown := sorted(set(value) - set(AutoscalingConfig.model_fields)):
            raise ValueError(
                f"unknown field {unknown[0]!r}; Serve's fields: {sorted(AutoscalingConfig.model_fields)}"
            )
        AutoscalingConfig(**value)  # Serve validates the values (min <= max, positive delays, ...)
        return value

    @field_validator("replica_resources")
    @classmethod
    def _custom_resources(cls, value: dict[str, float]) -> dict[str, float]:
        if reserved := sorted(set(value) & {"CPU", "GPU", "memory", "object_store_memory"}):
            raise ValueError(f"{reserved[0]!r} is set by replica_num_cpus / the engine device, not here")
        if negative := sorted(k for k, v in value.items() if v < 0):
            raise ValueError(f"{negative[0]!r} must be >= 0")
        return value

    @model_validator(mode="after")
    def _one_replica_count(self) -> AppConfig:
        if self.autoscaling_config is not None and self.num_replicas != 1:
            raise ValueError(
                "num_replicas: autoscaling_config decides the replica count; leave num_replicas unset"
            )
        if self.ingress_autoscaling_config is not None and "num_ingress_replicas" in self.model_fields_set:
            raise ValueError(
                "num_ingress_replicas: ingress_autoscaling_config decides the ingress count; leave it unset"
            )
        return self

    @model_validator(mode="after")
    def _one_engine_thread(self) -> AppConfig:
        if self.engine_cpu is not None and self.torch_num_threads != 1:
            raise ValueError(
                "engine_cpu: pins the engine's one thread to one CPU; set torch_num_threads: 1 "
                "(torch's other threads would share that CPU)"
            )
        return self

    @model_validator(mode="after")
    def _sla_classes(self) -> AppConfig:
        if not self.sla_classes:
            raise ValueError("sla_classes: at least one class is needed")
        if self.default_sla_class not in self.sla_classes:
            raise ValueError(
                f"default_sla_class: {self.default_sla_class!r} is not one of {sorted(self.sla_classes)}"
            )
        known = {f.name for f in fields(PolicyConfig)} | {"prior_acceptance", "seed"}
        if unknown := sorted(set(self.router_options) - known):
            raise ValueError(f"router_options: unknown option {unknown[0]!r}; known: {sorted(known)}")
        try:
            PolicyConfig(**self._policy_options()[0])
        except (TypeError, ValueError) as exc:
            raise ValueError(f"router_options: {exc}") from None
        return self

    def _policy_options(self) -> tuple[dict, dict]:
        """router_options split into PolicyConfig's fields and the router's own arguments."""
        options = dict(self.router_options)
        extra = {k: options.pop(k) for k in ("prior_acceptance", "seed") if k in options}
        # Stats a few periods old have missed several updates: rank that replica after fresh ones.
        options.setdefault("stale_after_s", max(1.0, 4 * self.routing_stats_period_s))
        return options, extra

    def request_router_config(self) -> dict:
        """Serve's RequestRouterConfig for the target replicas: the router class and its arguments."""
        config: dict = {
            "request_router_class": ROUTERS[self.router],
            "request_routing_stats_period_s": self.routing_stats_period_s,
        }
        if self.router == "sla":
            options, extra = self._policy_options()
            config["request_router_kwargs"] = {
                "classes": {name: c.model_dump() for name, c in self.sla_classes.items()},
                "default_class": self.default_sla_class,
                "options": options,
                **extra,
            }
        return config

    @model_validator(mode="after")
    def _engine_fields(self) -> AppConfig:
        if "model" in self.engine:
            raise ValueError("engine.model: set the top-level `model` instead")
        if any("model" in extra for extra in self.engine_by_rank):
            raise ValueError("engine_by_rank: every replica serves the top-level `model`")
        for rank in range(max(1, len(self.engine_by_rank))):
            name = f"engine_by_rank[{rank}]" if self.engine_by_rank else "engine"
            try:
                self.engine_config(rank)  # EngineConfig names the field if an option is wrong
            except TypeError as exc:  # an unknown option
                raise ValueError(f"{name}: {exc}") from None
        return self

    @model_validator(mode="after")
    def _sglang_fields(self) -> AppConfig:
        if self.backend != "sglang":
            if self.sglang is not None:
                raise ValueError("sglang: SGLang's options apply with backend: sglang only")
            return self
        if self.engine_by_rank:
            raise ValueError("engine_by_rank: engines that differ by rank need backend: builtin")
        from deployments.sglang_args import translate

        translate(self, {})  # refuses, by name, what SGLang has no counterpart for
        return self

    def engine_config(self, rank: int = 0) -> EngineConfig:
        """The engine of the replica of Serve rank `rank` (they differ only with engine_by_rank)."""
        extra = self.engine_by_rank[rank % len(self.engine_by_rank)] if self.engine_by_rank else {}
        return EngineConfig(model=str(Path(self.model).expanduser().resolve()), **(self.engine | extra))

    def engine_configs(self) -> list[EngineConfig]:
        """Every distinct replica engine."""
        return [self.engine_config(rank) for rank in range(max(1, len(self.engine_by_rank)))]

    @property
    def max_replicas(self) -> int:
        """The most target replicas this app runs at once (what capacity is sized for)."""
        if self.autoscaling_config is None:
            return self.num_replicas
        return AutoscalingConfig(**self.autoscaling_config).max_replicas

    @property
    def replica_max_ongoing(self) -> int:
        """Requests one target replica runs at once (Serve's max_ongoing_requests for it)."""
        return self.max_ongoing_requests or max(e.max_num_seqs for e in self.engine_configs())

    @property
    def stream_mux_applies(self) -> bool:
        """Whether streams travel multiplexed. Not from the SGLang replica, which streams per request.
        Over the socket transport with any router and under Serve's autoscaler: a subscription is a
        connection, neither routed nor counted as a request, while each request's own call still runs
        until the request ends (the autoscaler and the routers count it, Serve's drain waits for it).
        Through Serve ("serve") only with our router, the one that honours a subscription's pin
        (router/serve_router.py), and not under the autoscaler, which would count every subscription
        as an ongoing request (one more per ingress on each busy replica) and keep replicas it should
        take away."""
        if not self.stream_mux or self.backend != "builtin":
            return False
        return self.stream_mux_transport == "socket" or (
            self.router == "sla" and self.autoscaling_config is None
        )

    @property
    def replica_max_calls(self) -> int:
        """Serve's max_ongoing_requests for a target replica: its requests, plus one subscription per
        ingress replica when streams are multiplexed through Serve (those calls hold no engine capacity;
        over the socket transport subscriptions are no Serve calls)."""
        serve_subscriptions = self.stream_mux_applies and self.stream_mux_transport == "serve"
        return self.replica_max_ongoing + (self.max_ingress_replicas if serve_subscriptions else 0)

    @property
    def ingress_running(self) -> int:
        """Streams one ingress replica can have running on the target replicas at once."""
        return self.replica_max_ongoing * self.max_replicas

    @property
    def max_ingress_replicas(self) -> int:
        """The most ingress replicas this app runs at once."""
        if self.ingress_autoscaling_config is None:
            return self.num_ingress_replicas
        return AutoscalingConfig(**self.ingress_autoscaling_config).max_replicas

    def accepted_api_keys(self) -> list[str]:
        """`api_keys` plus the tokens in `api_keys_file` (read now: call once, at start)."""
        keys = list(self.api_keys)
        if self.api_keys_file:
            lines = Path(self.api_keys_file).read_text(encoding="utf-8").splitlines()
            from_file = [line.strip() for line in lines if line.strip()]
            if not from_file:  # an empty Secret must not open the service to everyone
                raise ValueError(f"api_keys_file: {self.api_keys_file} holds no tokens")
            keys += from_file
        return keys

    @property
    def model_name(self) -> str:
        return self.served_model_name or Path(self.model).resolve().name

    @property
    def uses_gpu(self) -> bool:
        default = "cuda" if self.backend == "sglang" else "cpu"
        return str(self.engine.get("device", default)).startswith("cuda")
