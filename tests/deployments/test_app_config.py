"""configs/local.yaml is a valid Serve config whose args build the application (no Ray started)."""

from __future__ import annotations

from pathlib import Path

import pydantic
import pytest
import yaml
from ray.serve.schema import ServeDeploySchema

from deployments.app import GRPC_SERVICERS, build_app
from deployments.config import AppConfig
from dspark.errors import ModelLoadError

LOCAL = Path(__file__).resolve().parents[2] / "configs" / "local.yaml"


def test_local_config_is_a_serve_config_with_valid_args():
    raw = yaml.safe_load(LOCAL.read_text())
    schema = ServeDeploySchema.model_validate(raw)
    assert schema.grpc_options.port == 9000 and schema.http_options.port == 8000
    assert list(schema.grpc_options.grpc_servicer_functions) == GRPC_SERVICERS
    (app,) = raw["applications"]
    assert app["import_path"] == "deployments.app:build_app"
    config = AppConfig(**app["args"])
    assert config.num_replicas == 2 and config.num_ingress_replicas == 2 and config.model == "models/target"


def test_build_app_binds_both_deployments(qwen3_dir):
    app = build_app({"model": str(qwen3_dir), "tensor_parallel_size": 2, "engine": {"drafter": "ngram"}})
    assert app is not None


def test_ingress_and_replicas_run_user_code_on_serves_main_loop(qwen3_dir):
    """The streaming path's Serve flags reach the ingress and the target replicas, beside telemetry's."""
    env = {"RAY_SERVE_RUN_USER_CODE_IN_SEPARATE_THREAD": "0", "RAY_SERVE_RUN_ROUTER_IN_SEPARATE_LOOP": "0"}
    app = build_app({"model": str(qwen3_dir), "telemetry": {"service_name": "svc"}})
    ingress = app._bound_deployment
    replica = ingress.init_args[0]._bound_deployment
    for deployment in (ingress, replica):
        env_vars = deployment.ray_actor_options["runtime_env"]["env_vars"]
        assert env.items() <= env_vars.items()
        assert env_vars["OTEL_SERVICE_NAME"] == "svc"


def test_ingress_replicas_default_to_two_and_follow_the_config(qwen3_dir):
    assert AppConfig(model=str(qwen3_dir)).num_ingress_replicas == 2
    ingress = build_app({"model": str(qwen3_dir), "num_ingress_replicas": 3})._bound_deployment
    assert (ingress.name, ingress.num_replicas) == ("Ingress", 3)
    with pytest.raises(pydantic.ValidationError, match="num_ingress_replicas"):
        AppConfig(model="m", num_ingress_replicas=0)
    scaled = AppConfig(model="m", ingress_autoscaling_config={"min_replicas": 1, "max_replicas": 4})
    assert scaled.max_ingress_replicas == 4
    with pytest.raises(pydantic.ValidationError, match="num_ingress_replicas"):
        AppConfig(model="m", num_ingress_replicas=3, ingress_autoscaling_config={"max_replicas": 4})


def test_bad_args_name_the_field(tmp_path):
    with pytest.raises(ModelLoadError, match="make models"):
        build_app({"model": str(tmp_path / "missing")})
    with pytest.raises(pydantic.ValidationError, match="dtype"):
        AppConfig(model="m", engine={"dtype": "float8"})
    with pytest.raises(pydantic.ValidationError, match="no_such_option"):
        AppConfig(model="m", engine={"no_such_option": 1})
    with pytest.raises(pydantic.ValidationError, match="tensor_parallel_size"):
        AppConfig(model="m", tensor_parallel_size=0)


def test_autoscaling_config_is_serves_own():
    config = AppConfig(model="m", autoscaling_config={"min_replicas": 1, "max_replicas": 3})
    assert config.max_replicas == 3 and AppConfig(model="m", num_replicas=2).max_replicas == 2
    assert AppConfig(**config.model_dump()) == config  # what the replicas receive round-trips
    with pytest.raises(
        pydantic.ValidationError, match="(?s)autoscaling_config.*unknown field 'upscale_delay'"
    ):
        AppConfig(model="m", autoscaling_config={"upscale_delay": 1})
    with pytest.raises(pydantic.ValidationError, match="(?s)autoscaling_config.*min_replicas"):
        AppConfig(model="m", autoscaling_config={"min_replicas": 3, "max_replicas": 2})
    with pytest.raises(pydantic.ValidationError, match="num_replicas: autoscaling_config decides"):
        AppConfig(model="m", num_replicas=2, autoscaling_config={"max_replicas": 2})
    with pytest.raises(pydantic.ValidationError, match="ingress_autoscaling_config"):
        AppConfig(model="m", ingress_autoscaling_config={"max_replicas": -1})


def test_replica_resources_are_custom_only():
    assert AppConfig(model="m", replica_resources={"accelerator_type:H100": 0.001}).replica_resources
    with pytest.raises(pydantic.ValidationError, match="'GPU' is set by"):
        AppConfig(model="m", replica_resources={"GPU": 1})
    with pytest.raises(pydantic.ValidationError, match="'slot' must be >= 0"):
        AppConfig(model="m", replica_resources={"slot": -1})


def _router_config(args: dict):
    """The RequestRouterConfig build_app gives the target replicas."""
    replica = build_app(args)._bound_deployment.init_args[0]._bound_deployment
    return replica._deployment_config.request_router_config


def test_the_sla_router_is_the_default_and_serves_routers_are_one_word_away(qwen3_dir):
    sla = _router_config({"model": str(qwen3_dir), "router_options": {"seed": 3, "tie_margin": 0.1}})
    assert sla.request_router_class == "router.serve_router:SLARequestRouter"
    assert sla.request_routing_stats_period_s == 0.25  # sub-second: Serve's 10 s is too slow for LLM load
    kwargs = sla.request_router_kwargs
    assert kwargs["default_class"] == "standard" and set(kwargs["classes"]) == {
        "interactive",
        "standard",
        "batch",
    }
    assert kwargs["options"] == {"tie_margin": 0.1, "stale_after_s": 1.0} and kwargs["seed"] == 3
    pow2 = _router_config({"model": str(qwen3_dir), "router": "pow2"})
    assert pow2.request_router_class == "ray.serve._private.request_router:PowerOfTwoChoicesRequestRouter"
    robin = _router_config({"model": str(qwen3_dir), "router": "round_robin", "routing_stats_period_s": 2.0})
    assert robin.request_router_class == "ray.serve.experimental.round_robin_router:RoundRobinRouter"
    assert robin.get_request_router_class().__name__ == "RoundRobinRouter"


def test_sla_classes_are_checked_by_name():
    classes = {"gold": {"ttft_ms": 200, "tpot_ms": 20, "may_shed": True}}
    assert (
        AppConfig(model="m", sla_classes=classes, default_sla_class="gold").sla_classes["gold"].priority == 0
    )
    with pytest.raises(pydantic.ValidationError, match="default_sla_class: 'standard' is not one of"):
        AppConfig(model="m", sla_classes=classes)
    with pytest.raises(pydantic.ValidationError, match="tpot_ms"):
        AppConfig(model="m", sla_classes={"gold": {"ttft_ms": 200}}, default_sla_class="gold")
    with pytest.raises(pydantic.ValidationError, match="router_options: unknown option 'margin'"):
        AppConfig(model="m", router_options={"margin": 1})
    with pytest.raises(pydantic.ValidationError, match="router_options: tie_margin must be >= 0"):
        AppConfig(model="m", router_options={"tie_margin": -1})
    with pytest.raises(pydantic.ValidationError, match="router_options: candidates must be a whole number"):
        AppConfig(model="m", router_options={"candidates": 0})
    assert AppConfig(model="m", router_options={"candidates": None}).router_options == {"candidates": None}
    with pytest.raises(pydantic.ValidationError, match="router"):
        AppConfig(model="m", router="least_loaded")


def test_engine_options_by_rank_make_heterogeneous_replicas(qwen3_dir):
    config = AppConfig(
        model="m", engine={"max_num_seqs": 8}, engine_by_rank=[{}, {"max_num_seqs": 4, "drafter": "none"}]
    )
    assert [e.max_num_seqs for e in config.engine_configs()] == [8, 4]
    assert config.engine_config(3).drafter == "none" and config.engine_config(2).max_num_seqs == 8
    with pytest.raises(pydantic.ValidationError, match=r"engine_by_rank\[1\]: .*no_such_option"):
        AppConfig(model="m", engine_by_rank=[{}, {"no_such_option": 1}])
    with pytest.raises(pydantic.ValidationError, match="max_num_seqs"):
        AppConfig(model="m", engine_by_rank=[{"max_num_seqs": 0}])
    # Serve admits as many requests per replica as the largest engine takes (the router keeps to each),
    # plus, with subscriptions through Serve, one per ingress replica (2 by default; stream_mux.py);
    # over the socket transport (the default) subscriptions are no Serve calls.
    by_rank = [{"max_num_seqs": 3}, {"max_num_seqs": 5}]
    app = build_app({"model": str(qwen3_dir), "engine_by_rank": by_rank})
    replica = app._bound_deployment.init_args[0]._bound_deployment
    assert replica._deployment_config.max_ongoing_requests == 5
    through_serve = build_app(
        {"model": str(qwen3_dir), "engine_by_rank": by_rank, "stream_mux_transport": "serve"}
    )
    assert (
        through_serve._bound_deployment.init_args[0]._bound_deployment._deployment_config.max_ongoing_requests
        == 5 + 2
    )
    unmuxed = build_app({"model": str(qwen3_dir), "engine_by_rank": by_rank, "stream_mux": False})
    assert (
        unmuxed._bound_deployment.init_args[0]._bound_deployment._deployment_config.max_ongoing_requests == 5
    )
    with pytest.raises(pydantic.ValidationError, match="stream_mux_transport"):
        AppConfig(model="m", stream_mux_transport="ray")
    # The router's settings stay out of the replicas' arguments (changing them restarts no replica).
    assert "router" not in replica.init_args[0] and "sla_classes" not in replica.init_args[0]


@pytest.mark.parametrize("router", ["sla", "pow2", "round_robin"])
def test_socket_streams_are_multiplexed_with_any_router_and_under_the_autoscaler(qwen3_dir, router):
    """A socket subscription is no Serve call: no router has to pin it and the autoscaler never sees it.
    Through Serve a subscription needs the SLA router's pin and must not count as load."""
    autoscaling = {"min_replicas": 1, "max_replicas": 2}
    for autoscaling_config in (None, autoscaling):
        socket = AppConfig(model="m", router=router, autoscaling_config=autoscaling_config)
        assert socket.stream_mux_transport == "socket" and socket.stream_mux_applies
        through_serve = socket.model_copy(update={"stream_mux_transport": "serve"})
        assert through_serve.stream_mux_applies == (router == "sla" and autoscaling_config is None)
        assert not socket.model_copy(update={"stream_mux": False}).stream_mux_applies
    assert not AppConfig(model=str(qwen3_dir), backend="sglang", router=router).stream_mux_applies
    # Under the autoscaler a replica admits its engine's requests only: no subscription holds a Serve
    # call that would count as load (and keep a replica the autoscaler should take away).
    app = build_app({"model": str(qwen3_dir), "router": router, "autoscaling_config": autoscaling})
    replica = app._bound_deployment.init_args[0]._bound_deployment
    assert replica._deployment_config.max_ongoing_requests == AppConfig(model="m").replica_max_ongoing == 64
