"""build_app(config): the one way to build the application.

Used by `serve run configs/local.yaml` (import_path: deployments.app:build_app, with `args`), by a
RayService's serveConfigV2 (the same application entry), and from Python:
`serve.run(build_app({"model": "models/target"}))`.
"""

from __future__ import annotations

import importlib.util
import logging
import os
from pathlib import Path

from ray.serve import Application
from ray.serve.config import BackpressureConfig

from deployments import sglang_args
from deployments.config import AppConfig
from deployments.controller import Controller
from deployments.ingress import Ingress
from deployments.ingress_admission import MIN_RETRY_S
from deployments.replica import TargetReplica
from deployments.sglang_replica import SGLangReplica
from dspark.errors import ModelLoadError

log = logging.getLogger(__name__)

# AppConfig fields the target replicas never read.
ROUTING_FIELDS = {"router", "router_options", "routing_stats_period_s", "sla_classes", "default_sla_class"}
# Serve runs a replica's user code on an event loop thread of its own, and a handle's router on a third:
# every streamed message then crosses threads once in the target replica and twice in the ingress, under
# the GIL the engine thread needs. Neither our ingress nor our replica blocks its event loop (prompts are
# tokenized and the engine runs on threads of their own), so both run on Serve's main loop instead.
STREAMING_ENV = {
    "RAY_SERVE_RUN_USER_CODE_IN_SEPARATE_THREAD": "0",
    "RAY_SERVE_RUN_ROUTER_IN_SEPARATE_LOOP": "0",
}
# The same for Serve's proxies, which an app cannot configure: whoever starts Ray passes it to every Ray
# process (`make serve` and bench/serve.py do, in ray.init's runtime_env).
PROXY_ENV = {"RAY_SERVE_RUN_ROUTER_IN_SEPARATE_LOOP": "0"}
# Calls an ingress replica serves besides the generation streams it admits.
INGRESS_HEADROOM = 16
# What the Serve config's grpc_options.grpc_servicer_functions must list for the gRPC surface.
GRPC_SERVICERS = [
    "dspark_client.proto.add_GenerationServicer_to_server",
    "dspark_client.proto.add_ControllerAdminServicer_to_server",
    "grpc_health.v1.health_pb2_grpc.add_HealthServicer_to_server",
]


def build_app(args: dict | AppConfig) -> Application:
    config = args if isinstance(args, AppConfig) else AppConfig(**args)
    if not (Path(config.model) / "config.json").is_file():
        raise ModelLoadError(
            f"model directory {config.model!r} has no config.json (build it with `make models`)"
        )
    if config.backend == "sglang":
        replica_class, placement = _sglang_replica(config)
    else:
        replica_class, placement = TargetReplica, _builtin_placement(config)
    # The app's telemetry settings reach every replica process as OTEL_* variables.
    env = config.telemetry.env_vars()
    runtime_env = {"runtime_env": {"env_vars": env}} if env else {}
    replica_env = {**env, **controller_export_env(config)}
    if replica_env:
        actor = placement["ray_actor_options"]
        own = actor.get("runtime_env", {})
        actor["runtime_env"] = {**own, "env_vars": {**replica_env, **own.get("env_vars", {})}}
    data = config.model_dump()
    # What only the ingress and the router read stays out of the replicas' arguments: the replicas never
    # depend on the router or the SLA classes. (It does not spare them a restart when those change: Ray
    # 2.60 gives every deployment a new code version on each `serve.run`, and a config-file deploy hashes
    # the whole `args` into the app's code version, so any redeploy restarts the replicas.)
    replica_data = config.model_dump(exclude=ROUTING_FIELDS)
    replica = replica_class.options(
        **_replica_count(config.num_replicas, config.autoscaling_config),
        max_ongoing_requests=config.replica_max_calls,
        health_check_period_s=config.health_check_period_s,
        health_check_timeout_s=config.health_check_timeout_s,
        graceful_shutdown_timeout_s=config.graceful_shutdown_timeout_s,
        request_router_config=config.request_router_config(),
        **placement,
    ).bind(replica_data)
    # The cluster controller, one replica beside the targets; the ingress serves its admin routes.
    controller = None
    if config.controller is not None:
        placed = {"resources": dict(config.controller.resources)} if config.controller.resources else {}
        controller = Controller.options(ray_actor_options={"num_cpus": 0, **placed, **runtime_env}).bind(
            replica, data
        )
    return Ingress.options(
        **_replica_count(config.num_ingress_replicas, config.ingress_autoscaling_config),
        # Streams wait on the replicas, not on this process: each ingress replica admits every replica's
        # requests plus max_queued_requests itself (deployments/ingress_admission.py), and Serve lets
        # that many reach it, with room for the calls that are no generation (health, model info, abort).
        # Serve's own queue only holds those beyond that room; its overflow is a 429 too.
        max_ongoing_requests=config.ingress_running + max(config.max_queued_requests, 0) + INGRESS_HEADROOM,
        max_queued_requests=config.max_queued_requests or 1,  # Serve's must be -1 or positive
        backpressure_config=BackpressureConfig(status_code=429, retry_after_s=MIN_RETRY_S),
        ray_actor_options={
            "num_cpus": config.ingress_num_cpus,
            "runtime_env": {"env_vars": {**env, **STREAMING_ENV}},
        },
    ).bind(replica, data, controller)


def controller_export_env(config: AppConfig) -> dict[str, str]:
    """The target replicas' exporter pointed at the controller's OTLP receiver, when it has one and the
    app names no collector of its own (a Collector then fans out to the controller); metrics are
    exported once per controller period unless the app sets its own interval."""
    settings = config.controller
    if settings is None or settings.otlp_endpoint is None or config.telemetry.otlp_endpoint is not None:
        return {}
    env = {
        "OTEL_EXPORTER_OTLP_ENDPOINT": settings.otlp_endpoint,
        "OTEL_EXPORTER_OTLP_PROTOCOL": settings.otlp_protocol,
    }
    if config.telemetry.metric_export_interval_ms is None:
        env["OTEL_METRIC_EXPORT_INTERVAL"] = str(int(settings.period_s * 1000))
    return env


def _builtin_placement(config: AppConfig) -> dict:
    tp = config.tensor_parallel_size
    gpus = 1 if config.uses_gpu else 0
    actor = {
        "num_cpus": config.replica_num_cpus,
        "num_gpus": gpus,
        "resources": dict(config.replica_resources),
        "runtime_env": {"env_vars": dict(STREAMING_ENV)},
    }
    placement: dict = {"ray_actor_options": actor}
    if tp > 1:
        # Rank 0 (the replica, with the drafter) takes bundle 0; the other shards take the rest.
        shard = {"CPU": config.replica_num_cpus, **config.replica_resources} | ({"GPU": 1} if gpus else {})
        placement |= {"placement_group_bundles": [shard] * tp, "placement_group_strategy": "STRICT_PACK"}
    return placement


def _sglang_replica(config: AppConfig) -> tuple:
    """SGLang's replica and its placement. Its environment (verify mode, GPU visibility) travels as the
    actor's runtime_env, which Ray hands on to the scheduler actors a RayEngine starts."""
    launch = sglang_args.translate(config, os.environ)
    if importlib.util.find_spec("sglang") is not None:
        try:  # fail here, naming the field, rather than in every replica start
            sglang_args.check_with_sglang(launch)
        except ImportError as exc:  # sglang present, its GPU dependencies not (a CPU head node)
            log.warning("SGLang cannot resolve arguments here (%r); replicas will", exc)
    actor = {
        "num_cpus": config.replica_num_cpus,
        "resources": dict(config.replica_resources),
        "runtime_env": {"env_vars": launch.env},
    }
    options = config.sglang or sglang_args.SGLangOptions()
    if not launch.uses_ray_engine:
        return SGLangReplica, {"ray_actor_options": actor | {"num_gpus": options.num_gpus}}
    # RayEngine: the replica (tokenizer manager, detokenizer) holds no GPU; rank i's scheduler actor
    # takes bundle i's, all on one node (SGLang's ranks talk over local ipc sockets).
    first = {"CPU": config.replica_num_cpus, "GPU": 1, **config.replica_resources}
    rest = {"GPU": 1, **config.replica_resources}
    return SGLangReplica, {
        "ray_actor_options": actor | {"num_gpus": 0},
        "placement_group_bundles": [first] + [rest] * (config.tensor_parallel_size - 1),
        "placement_group_strategy": "STRICT_PACK",
    }


def _replica_count(fixed: int, autoscaling: dict | None) -> dict:
    """Serve's options for a fixed count, or for its autoscaler deciding the count."""
    return {"num_replicas": fixed} if autoscaling is None else {"autoscaling_config": autoscaling}
