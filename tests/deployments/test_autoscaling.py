"""Serve's autoscaler on the target replicas: a burst of requests scales 1 -> 2 and back, and every
request of the burst and of the traffic that goes on while the extra replica drains completes intact.
The streams are multiplexed (socket subscriptions, which the autoscaler does not count as load): both
replicas, the one taken away too, show muxed events.

The delays are small so the test is short; what is exercised is Serve's own policy on the handle
metrics of the ingress, with the app built by build_app from an `autoscaling_config` in its args.
"""

from __future__ import annotations

from ray import serve
from serving import Traffic, app_args, wait_until

import dspark_client
from deployments.app import build_app
from deployments.config import AppConfig

APP = "auto"
PROMPT = "import bisect\n"
REQUEST = dict(temperature=0.0, max_tokens=48, ignore_eos=True)
AUTOSCALING = {
    "min_replicas": 1,
    "max_replicas": 2,
    "target_ongoing_requests": 1,
    "upscale_delay_s": 0.5,
    "downscale_delay_s": 2.0,
    "metrics_interval_s": 0.2,  # deprecated by Serve for env variables, still honoured; keeps this short
    "look_back_period_s": 1.0,
}


def replica_states() -> dict[str, int]:
    return dict(serve.status().applications[APP].deployments["TargetReplica"].replica_states)


def muxed_events() -> dict[str, int]:
    """Events each running target replica sent on its ingress' subscriptions since it started."""
    handle = serve.get_deployment_handle("TargetReplica", APP)
    states = handle.broadcast("get_state").results(timeout_s=60)
    return {state["replica_id"]: state["stream_mux"]["events"] for state in states}


def greedy(client) -> str:
    return client.generate(PROMPT, **REQUEST).text


def greedy_clients(target: str, clients: int) -> Traffic:
    # No retries: a request the autoscaler disturbed shows up as a failure.
    return Traffic(target, clients, greedy, application=APP, retry=dspark_client.NO_RETRY, timeout_s=60)


def test_burst_scales_targets_up_and_back_without_losing_a_request(serve_stack):
    args = app_args(
        serve_stack.model_dir,
        num_replicas=1,
        autoscaling_config=AUTOSCALING,
        graceful_shutdown_timeout_s=10.0,  # a draining replica finishes what it holds
    )
    assert AppConfig(**args).stream_mux_applies  # over the socket transport, the default
    serve.run(build_app(args), name=APP, route_prefix="/auto")
    try:
        assert replica_states() == {"RUNNING": 1}
        with dspark_client.Client(serve_stack.grpc_target, application=APP, timeout_s=60) as client:
            expected = greedy(client)

        burst = greedy_clients(serve_stack.grpc_target, clients=6)
        try:
            wait_until(
                lambda: replica_states().get("RUNNING") == 2,
                timeout_s=90,
                interval_s=0.2,
                what="a second replica",
            )
            # Both replicas stream muxed, the one the autoscaler will take away too.
            wait_until(
                lambda: (events := muxed_events()) and len(events) == 2 and min(events.values()) > 0,
                timeout_s=60,
                interval_s=0.2,
                what="muxed events from both replicas",
            )
        finally:
            burst.finish()

        # Light traffic goes on while the autoscaler takes the extra replica away and it drains.
        trickle = greedy_clients(serve_stack.grpc_target, clients=1)
        try:
            wait_until(
                lambda: replica_states() == {"RUNNING": 1},
                timeout_s=90,
                interval_s=0.2,
                what="back to one replica",
            )
            served_before = len(trickle.texts)
            wait_until(
                lambda: len(trickle.texts) > served_before, timeout_s=30, what="a request after the drain"
            )
        finally:
            trickle.finish()

        for traffic in (burst, trickle):
            assert traffic.failures == []
            assert traffic.texts and set(traffic.texts) == {expected}
    finally:
        serve.delete(APP)
