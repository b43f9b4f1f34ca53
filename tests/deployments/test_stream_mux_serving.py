"""Multiplexed streams through real Ray Serve (deployments/stream_mux.py, deployments/mux_client.py): a
real Frontend in this process, with a handle to an app of one target replica, so every stream lands
on that replica (through Serve, this process' SLA router pins the subscription there). Concurrent
streams travel on one subscription, greedy output stays identical to the offline engine, and a stream
whose client leaves or that is aborted by id ends alone, on the replica too, while the others run on.
A replica that dies ends its own streams with an error and no other (its socket subscription breaks);
one that Serve stops (scale-in, a redeploy) drains them and they end intact. With Serve's own
power-of-two router, which pins nothing, the socket subscriptions carry the streams just the same."""

from __future__ import annotations

import asyncio
import time

import pytest
import ray
from ray import serve
from serving import ENGINE, app_args, wait_until

from deployments.app import build_app
from deployments.config import AppConfig
from deployments.errors import classify
from deployments.frontend import Frontend
from deployments.mux_socket import StreamLostError
from deployments.replicas import SERVE_NAMESPACE, replica_actor_names, routing_stats
from deployments.validation import Limits, completion_request
from dspark import LLM, SamplingParams

MUXED, DYING, POW2, STOPPED = "muxed", "dying", "pow2", "stopped"
LONG = dict(max_tokens=480, temperature=1.0, ignore_eos=True)  # cannot finish within the test's patience
GREEDY = dict(max_tokens=40, temperature=0.0, ignore_eos=True)
PROMPT = "def wrap(text, width):"


@pytest.fixture(scope="module", params=["socket", "serve"])
def muxed(serve_stack, request):
    """The app with subscriptions on a direct connection (mux_socket, the default) or through Serve."""
    args = app_args(
        serve_stack.model_dir, num_replicas=1, ingress_num_cpus=0, stream_mux_transport=request.param
    )  # its ingress stays idle
    serve.run(build_app(args), name=MUXED, route_prefix="/muxed")
    handle = serve.get_deployment_handle("TargetReplica", MUXED)
    yield handle, AppConfig(**args)
    serve.delete(MUXED)


def replica_stats() -> dict:
    (stats,) = asyncio.run(routing_stats(MUXED, "TargetReplica"))
    return stats


def idle() -> bool:
    s = replica_stats()
    return s["running_requests"] == 0 and s["kv_unreserved_pages"] == s["kv_total_pages"]


def test_concurrent_streams_share_one_subscription_and_end_apart(muxed, serve_stack):
    handle, config = muxed
    assert config.stream_mux_applies
    frontend = Frontend(handle, config)
    limits = Limits()
    expected = LLM(str(serve_stack.model_dir), **ENGINE).generate([PROMPT], SamplingParams(**GREEDY))[0]
    before = handle.get_state.remote().result()
    aborted_before = before["aborted_requests"]

    async def run():
        leaving = await frontend.open(completion_request({"prompt": "import os\n", **LONG}, limits))
        aborted = await frontend.open(
            completion_request({"prompt": "class A:", "request_id": "mux-abort", **LONG}, limits)
        )
        greedy = await frontend.open(completion_request({"prompt": PROMPT, **GREEDY}, limits))
        # All three run on the one replica, behind one subscription of this ingress.
        placed = {frontend.mux.demux._replica_of[s._key] for s in (leaving, aborted, greedy)}
        subscribing = set(frontend.mux._tasks)
        addresses = dict(frontend.mux._addresses)  # where the socket subscriptions connect

        leaving_events = leaving.events()
        taken = [await leaving_events.__anext__() for _ in range(2)]
        await leaving_events.aclose()  # the client hangs up: the replica aborts that request alone

        assert await frontend.abort("mux-abort") is True
        aborted_last = [e async for e in aborted.events()][-1]

        greedy_events = [e async for e in greedy.events()]
        for _ in range(1000):  # the subscription ends with the last stream: no connection or call stays
            if not frontend.mux._tasks:
                break
            await asyncio.sleep(0.01)
        assert frontend.mux._tasks == {} and frontend.mux._addresses == {}
        return placed, subscribing, addresses, taken, aborted_last, greedy_events

    placed, subscribing, addresses, taken, aborted_last, greedy_events = asyncio.run(run())
    assert len(placed) == 1 and subscribing == placed
    if config.stream_mux_transport == "socket":
        ((host, port, token),) = [addresses[r] for r in placed]
        assert host == ray.util.get_node_ip_address() and port > 0 and len(token) == 32
    else:
        assert addresses == {}
    assert len(taken) == 2 and not taken[-1].finished
    assert aborted_last.finished and aborted_last.finish_reason == "abort"
    token_ids = [t for e in greedy_events for t in e.token_ids]
    assert token_ids == list(expected.token_ids)
    assert "".join(e.text for e in greedy_events) == expected.text
    assert greedy_events[-1].finish_reason == "length"

    wait_until(idle, timeout_s=30, what="the abandoned and aborted requests to be freed")
    assert replica_stats()["aborted_requests"] == aborted_before + 2
    after = handle.get_state.remote().result()["stream_mux"]
    # One subscription carried every stream's events after its first; it ended with the last stream.
    assert after["subscriptions"] - before["stream_mux"]["subscriptions"] == 1
    events = after["events"] - before["stream_mux"]["events"]
    messages = after["messages"] - before["stream_mux"]["messages"]
    assert events >= len(greedy_events)  # at least the greedy stream's after its first, and the abort
    assert messages < events  # steps that advanced several streams sent them in one message
    assert after["channels"] == 0


def test_a_stream_placed_while_its_subscription_reads_gets_its_first_event_on_it_too(muxed, serve_stack):
    """The replica copies a first event onto the subscription open at that moment; the ingress takes
    whichever copy comes first (the subscription's, but either gives the same stream)."""
    handle, config = muxed
    frontend = Frontend(handle, config)
    limits = Limits()
    expected = LLM(str(serve_stack.model_dir), **ENGINE).generate([PROMPT], SamplingParams(**GREEDY))[0]
    before = handle.get_state.remote().result()["stream_mux"]

    async def run():
        running = await frontend.open(completion_request({"prompt": "import os\n", **LONG}, limits))
        running_events = running.events()
        for _ in range(2):  # its second event came on the subscription: the replica has a reader now
            await running_events.__anext__()
        greedy = await frontend.open(completion_request({"prompt": PROMPT, **GREEDY}, limits))
        got = [e async for e in greedy.events()]
        await running_events.aclose()
        return got

    got = asyncio.run(run())
    assert [t for e in got for t in e.token_ids] == list(expected.token_ids)
    assert "".join(e.text for e in got) == expected.text and got[-1].finish_reason == "length"
    wait_until(idle, timeout_s=30, what="the abandoned request to be freed")
    after = handle.get_state.remote().result()["stream_mux"]
    assert after["first_copies"] - before["first_copies"] == 1  # the greedy stream's, not the first one's


def test_a_replica_dying_ends_its_streams_with_an_error_and_spares_the_others(serve_stack):
    args = app_args(serve_stack.model_dir, num_replicas=2, ingress_num_cpus=0, routing_stats_period_s=0.1)
    serve.run(build_app(args), name=DYING, route_prefix="/dying")
    try:
        wait_until(lambda: len(asyncio.run(routing_stats(DYING, "TargetReplica"))) == 2, what="two replicas")
        frontend = Frontend(serve.get_deployment_handle("TargetReplica", DYING), AppConfig(**args))
        params = dict(max_tokens=400, temperature=0.0, ignore_eos=True)  # outlives the kill below
        expected = LLM(str(serve_stack.model_dir), **ENGINE).generate([PROMPT], SamplingParams(**params))[0]
        request = completion_request({"prompt": PROMPT, **params}, Limits())

        async def outcome(stream):
            try:
                return [t for e in [e async for e in stream.events()] for t in e.token_ids]
            except Exception as exc:
                return exc

        async def run():
            streams, placed = [], set()
            while len(placed) < 2:  # the router spreads concurrent streams over both replicas
                assert len(streams) < 8, "every stream went to one replica"
                streams.append(await frontend.open(request))
                placed.add(frontend.mux.demux._replica_of[streams[-1]._key])
            on = [frontend.mux.demux._replica_of[s._key] for s in streams]
            (name,) = [n for n in replica_actor_names(DYING, "TargetReplica") if n.endswith(f"#{on[0]}")]
            ray.kill(ray.get_actor(name, namespace=SERVE_NAMESPACE))
            return on, await asyncio.gather(*(outcome(s) for s in streams))

        on, outcomes = asyncio.run(run())
        for replica_id, got in zip(on, outcomes):
            if replica_id == on[0]:  # ended with the replica's death, reported as the service's fault
                assert isinstance(got, StreamLostError) and classify(got).http_status == 503, repr(got)
            else:
                assert got == list(expected.token_ids)
    finally:
        serve.delete(DYING)


def mux_counts(handle) -> dict[str, dict]:
    """Every replica's stream_mux counters (get_state), by replica id."""
    states = handle.broadcast("get_state").results(timeout_s=60)
    return {state["replica_id"]: state["stream_mux"] for state in states}


def test_serves_own_router_streams_through_the_socket_subscriptions(serve_stack):
    args = app_args(serve_stack.model_dir, num_replicas=2, ingress_num_cpus=0, router="pow2")
    config = AppConfig(**args)
    assert config.stream_mux_applies and config.stream_mux_transport == "socket"
    serve.run(build_app(args), name=POW2, route_prefix="/pow2")
    try:
        handle = serve.get_deployment_handle("TargetReplica", POW2)
        wait_until(lambda: len(mux_counts(handle)) == 2, what="two replicas")
        before = mux_counts(handle)
        frontend = Frontend(handle, config)
        params = dict(max_tokens=300, temperature=0.0, ignore_eos=True)  # every stream outlives the opens
        expected = LLM(str(serve_stack.model_dir), **ENGINE).generate([PROMPT], SamplingParams(**params))[0]
        request = completion_request({"prompt": PROMPT, **params}, Limits())

        async def run():
            streams, placed = [], set()
            while len(placed) < 2:  # pow2 sends a stream to the less busy of the two replicas
                assert len(streams) < 8, "every stream went to one replica"
                streams.append(await frontend.open(request))
                placed.add(frontend.mux.demux._replica_of[streams[-1]._key])
            on = [frontend.mux.demux._replica_of[s._key] for s in streams]
            subscribing, addresses = set(frontend.mux._tasks), dict(frontend.mux._addresses)

            async def read(stream):
                return [e async for e in stream.events()]

            events = await asyncio.gather(*(read(s) for s in streams))
            for _ in range(1000):  # each subscription ends with its replica's last stream
                if not frontend.mux._tasks:
                    break
                await asyncio.sleep(0.01)
            assert frontend.mux._tasks == {} and frontend.mux._addresses == {}
            return on, subscribing, addresses, events

        on, subscribing, addresses, events = asyncio.run(run())
        assert subscribing == set(on) == set(before) and set(addresses) == set(on)
        for got in events:
            assert [t for e in got for t in e.token_ids] == list(expected.token_ids)
            assert "".join(e.text for e in got) == expected.text and got[-1].finish_reason == "length"
        after = mux_counts(handle)
        for replica_id in before:
            counted = ("subscriptions", "events", "first_copies")
            delta = {k: after[replica_id][k] - before[replica_id][k] for k in counted}
            # One socket subscription per replica carried every event after each stream's first, and a
            # copy of the first of a later stream placed there while it read (stream_mux.Outbox; whether
            # it was reading yet when that stream's first event came is a race, so they are counted).
            got_here = [got for got, r in zip(events, on) if r == replica_id]
            later = sum(len(got) - 1 for got in got_here)
            assert delta["subscriptions"] == 1, (replica_id, delta)
            assert delta["first_copies"] <= len(got_here) - 1, (replica_id, delta)
            assert delta["events"] == later + delta["first_copies"], (replica_id, delta)
            assert after[replica_id]["channels"] == 0
    finally:
        serve.delete(POW2)


def test_a_replica_being_stopped_drains_its_streams_intact(serve_stack):
    """Serve stops a replica (the autoscaler's scale-in, a redeploy, a deleted app) by draining it: it
    waits for the requests' own calls, each open until its request ends, before the replica goes. A
    stream running then still ends intact on its socket subscription, which no drain waits for."""
    args = app_args(
        serve_stack.model_dir, num_replicas=1, ingress_num_cpus=0, graceful_shutdown_timeout_s=60.0
    )
    serve.run(build_app(args), name=STOPPED, route_prefix="/stopped")
    frontend = Frontend(serve.get_deployment_handle("TargetReplica", STOPPED), AppConfig(**args))
    params = dict(max_tokens=480, temperature=0.0, ignore_eos=True)
    expected = LLM(str(serve_stack.model_dir), **ENGINE).generate([PROMPT], SamplingParams(**params))[0]
    greedy = completion_request({"prompt": PROMPT, **params}, Limits())
    # Sampled streams beside it keep the replica busy for longer (few drafts accepted; the KV pages
    # hold three such streams).
    sampled = completion_request({"prompt": "import os\n", **LONG}, Limits())

    def deleting() -> bool:  # the controller now stops the app's replica
        app = serve.status().applications.get(STOPPED)
        return app is None or app.status == "DELETING"

    async def run():
        streams = [await frontend.open(greedy)] + [await frontend.open(sampled) for _ in range(2)]

        async def read(stream):
            events = [e async for e in stream.events()]
            return events, time.monotonic()

        reading = asyncio.gather(*(read(s) for s in streams))
        await asyncio.to_thread(serve.delete, STOPPED, False)
        await asyncio.to_thread(wait_until, deleting, 30, 0.05, "the app to be deleting")
        stopping_at = time.monotonic()
        return await reading, stopping_at

    try:
        outcomes, stopping_at = asyncio.run(run())
        # The sampled streams still ran when Serve began to stop the replica (a drain to go through:
        # with graceful_shutdown_timeout_s 0.3 the replica is killed under them and they end with
        # StreamLostError instead), and every stream ended intact.
        assert all(stopping_at < ended_at for _, ended_at in outcomes[1:])
        greedy_events = outcomes[0][0]
        assert [t for e in greedy_events for t in e.token_ids] == list(expected.token_ids)
        for events, _ in outcomes:
            assert events[-1].finish_reason == "length"
            assert sum(len(e.token_ids) for e in events) == events[-1].completion_tokens == 480
        wait_until(lambda: STOPPED not in serve.status().applications, what="the drained replica to go")
    finally:
        if STOPPED in serve.status().applications:
            serve.delete(STOPPED)
