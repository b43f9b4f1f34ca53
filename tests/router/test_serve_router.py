"""The SLA router inside real Ray Serve: placement by the policy, refusals with a computed retry hint,
and SLA class selection on the HTTP and gRPC surfaces.

Placement is checked from a handle in this process: Serve runs a handle's router in the caller's
process, so the decisions the router records (router/decisions.py) are readable here, next to the
replicas' own counters. Two replicas of the tiny test model, without a drafter, with 32 KV pages
of 16 tokens each: one 460-token request leaves a replica 3 pages, too few for a 60-token request.
"""

from __future__ import annotations

import asyncio
import http.client
import json
import uuid
from urllib.parse import urlparse

import grpc
import pytest
from ray import serve
from serving import APP, ENGINE, app_args, wait_until

from deployments import replicas
from deployments.app import build_app
from deployments.events import received
from dspark.errors import AdmissionError
from dspark.sampling_params import SamplingParams
from dspark_client.proto import GenerationStub, pb
from router import decisions
from router.policy import Newcomer, Sla

ROUTED = "routed"
STANDARD = Sla("standard", ttft_s=5.0, tpot_s=0.25, priority=1)


@pytest.fixture(scope="module")
def routed(serve_stack):
    engine = {**ENGINE, "drafter": "none", "num_kv_pages": 32}
    # Heterogeneous on purpose: the replica of rank 1 holds at most 6 requests.
    args = app_args(
        serve_stack.model_dir,
        engine=engine,
        engine_by_rank=[{}, {"max_num_seqs": 6}],
        routing_stats_period_s=0.1,
    )
    serve.run(build_app(args), name=ROUTED, route_prefix="/routed")
    handle = serve.get_deployment_handle("TargetReplica", ROUTED)
    wait_until(lambda: len(stats()) == 2 and all("sps_table" in s for s in stats().values()), what="stats")
    # The replicas publish before this handle's router has heard of them (Serve's controller pulls the
    # stats on its own period and broadcasts them): until it has, the router ranks them by its ledger
    # alone ("unknown" tier) and cannot tell a full KV cache, which the tests below rely on.
    wait_until(
        lambda: router_knows_every_replica(handle), what="the handle's router to hold both replicas' stats"
    )
    yield handle
    serve.delete(ROUTED)


def stats() -> dict[str, dict]:
    """Each replica's routing stats, read from the replica itself (not through the router)."""
    return {s["replica_id"]: s for s in asyncio.run(replicas.routing_stats(ROUTED, "TargetReplica"))}


def send(handle, prompt_tokens: int, max_tokens: int, sla: Sla = STANDARD):
    """Start a sampled request through the handle's router; its Newcomer names its decision."""
    route = Newcomer(prompt_tokens, max_tokens, sla, key=uuid.uuid4().hex)
    params = SamplingParams(temperature=1.0, max_tokens=max_tokens, ignore_eos=True)
    stream = handle.options(stream=True).generate.remote(
        [5] * prompt_tokens, params, uuid.uuid4().hex, route=route
    )
    return route, stream


def router_knows_every_replica(handle) -> bool:
    """Whether a request's decision saw both replicas with stats (one short request, consumed)."""
    route, stream = send(handle, 4, 1)
    assert sum(len(received(event).token_ids) for event in stream) == 1
    scores = decisions.pop(route.key)["scores"]
    return len(scores) == 2 and all(score["tier"] != "unknown" for score in scores.values())


def finished() -> dict[str, int]:
    return {rid: s["finished_requests"] for rid, s in stats().items()}


def test_replicas_differ_by_rank_and_publish_what_the_policy_reads(routed):
    published = list(stats().values())
    assert sorted(s["max_num_seqs"] for s in published) == [6, 8]
    for s in published:
        assert s["kv_total_pages"] == 32 and s["sps_table"][0][0] == 1 and s["ts"] > 0
        assert {"recent_tau", "mean_verified", "step_overhead", "running_keys", "remaining_tokens"} <= set(s)


def test_requests_go_where_the_policy_says(routed):
    before = finished()
    long_route, long_stream = send(routed, 20, 440)  # 460 tokens: 29 of the replica's 32 pages
    next(iter(long_stream))
    holder = decisions.pop(long_route.key)["placed_on"]
    (other,) = set(before) - {holder}
    shorts = [send(routed, 10, 50) for _ in range(4)]  # 60 tokens: 4 pages each
    for route, stream in shorts:
        assert sum(len(received(event).token_ids) for event in stream) == 50
        decision = decisions.pop(route.key)
        assert decision["ranking"] == [other] and decision["placed_on"] == other
        assert decision["excluded"] == {holder: "no KV room"}
    wait_until(lambda: finished()[other] == before[other] + 4, what="the short requests counted")
    assert finished()[holder] == before[holder]  # the long one still runs there, alone
    long_stream.cancel()


def test_no_room_anywhere_is_refused_with_a_retry_hint_from_the_predictions(routed):
    wait_until(lambda: not any(s["running_requests"] for s in stats().values()), what="idle replicas")
    # Sent back to back: the second is decided before Serve confirms the first, from the router's ledger.
    holders = [send(routed, 20, 440) for _ in range(2)]
    for _, stream in holders:
        next(iter(stream))
    placed = {decisions.pop(route.key)["placed_on"] for route, _ in holders}
    assert len(placed) == 2  # the second could not fit beside the first
    route, stream = send(routed, 10, 50)
    with pytest.raises(AdmissionError) as err:
        next(iter(stream))
    decision = decisions.pop(route.key)
    assert decision["action"] == "shed" and err.value.reason == "no replica has room"
    assert set(decision["excluded"].values()) == {"no KV room"}
    # Computed: when the first holder will have finished, at the pace its replica runs now; not a cap.
    assert 0.25 <= err.value.retry_after_s < 30.0
    assert decision["retry_after_s"] == round(err.value.retry_after_s, 3)
    for _, held in holders:
        held.cancel()
    wait_until(lambda: admitted(routed), what="a request admitted once the holders are gone")


# Two system prompts of 12 full pages (16 tokens each), as token ids (the tiny model's vocabulary):
# long enough that their prefill, not the noise in two replicas' predicted speed, decides the TTFT.
SYSTEMS = ([10 + k % 50 for k in range(192)], [70 + k % 50 for k in range(192)])


def served(serve_stack, system: list[int], i: int) -> None:
    """A question after the system prompt through the ingress: HTTP for even i, gRPC for odd."""
    ids = [*system, 200 + i, 201, 202]
    if i % 2:
        with grpc.insecure_channel(serve_stack.grpc_target) as channel:
            request = pb.GenerateRequest(
                prompt_token_ids=ids, sampling=pb.SamplingOptions(max_tokens=4, ignore_eos=True)
            )
            events = list(GenerationStub(channel).Generate(request, metadata=(("application", ROUTED),)))
        assert events[-1].final.finish_reason == "length"
    else:
        body = {"prompt": ids, "max_tokens": 4, "ignore_eos": True}
        status, _, payload = post(serve_stack, body, {}, path="/routed/v1/completions")
        assert status == 200, payload


def test_repeats_of_a_shared_system_prompt_go_to_the_replica_that_cached_it(routed, serve_stack):
    """Through the ingress, which names each prompt's pages; one ingress, so one router.

    Each round steers its system prompt's first request away from one replica (a long request holds
    it), then sends repeats to two idle replicas: they follow the cached prefix. The two rounds cache
    their prompts on different replicas, so whatever else the router prefers between idle replicas
    cannot pass both."""

    def idle() -> None:
        wait_until(lambda: not any(s["running_requests"] for s in stats().values()), what="idle replicas")

    def running() -> str:
        wait_until(lambda: sum(s["running_requests"] for s in stats().values()) == 1, what="the long request")
        (rid,) = [rid for rid, s in stats().items() if s["running_requests"]]
        return rid

    # The previous test filled both replicas through this process' handle: the ingress' router saw that
    # only in the replicas' stats, and may not have heard yet that they were freed.
    wait_until(lambda: ingress_sees_room_on_both(serve_stack), what="the ingress' router to see both free")
    idle()
    start = stats()
    holders: list[str] = []
    with grpc.insecure_channel(serve_stack.grpc_target) as channel:
        for r, system in enumerate(SYSTEMS):
            # Round 0: holds whichever replica the router picks (29 of its 32 pages). Round 1: starts
            # with round 0's system prompt, so it goes to round 0's holder, which it then holds.
            ids, max_tokens = ([5] * 20, 440) if r == 0 else ([*SYSTEMS[0], 5, 5, 5, 5], 200)
            request = pb.GenerateRequest(
                prompt_token_ids=ids, sampling=pb.SamplingOptions(max_tokens=max_tokens, ignore_eos=True)
            )
            long = GenerationStub(channel).Generate(request, metadata=(("application", ROUTED),))
            next(long)
            busy = running()
            if r == 1:
                assert busy == holders[0]
            before = stats()
            served(serve_stack, system, 0)
            (holder,) = [
                rid for rid in before if stats()[rid]["finished_requests"] > before[rid]["finished_requests"]
            ]
            assert holder != busy
            holders.append(holder)
            assert list(long)[-1].final.finish_reason == "length"  # runs to its end
            idle()
            done, total = stats()[holder]["finished_requests"], sum_finished(stats())
            cached = stats()[holder]["prefix_cache"]["cached_prompt_tokens"]
            for i in range(1, 5):
                served(serve_stack, system, i)
                wait_until(lambda n=total + i: sum_finished(stats()) == n, what=f"repeat {i} counted")
                finished = {rid: s["finished_requests"] for rid, s in stats().items()}
                assert finished[holder] == done + i, (r, i, holder, finished)
            # Each repeat skipped the system prompt's 12 pages there.
            assert stats()[holder]["prefix_cache"]["cached_prompt_tokens"] - cached == 4 * 192
    assert holders[0] != holders[1]
    assert sum_finished(stats()) == sum_finished(start) + 2 * 6


def ingress_sees_room_on_both(serve_stack) -> bool:
    """Whether the ingress' router sees room for a 460-token request on both replicas: two sent back to
    back are both admitted only on different replicas (the first holds its replica's pages until both are
    admitted). Cancelled once admitted, which the router sees, as it sent them."""
    request = pb.GenerateRequest(
        prompt_token_ids=[5] * 20, sampling=pb.SamplingOptions(max_tokens=440, ignore_eos=True)
    )
    with grpc.insecure_channel(serve_stack.grpc_target) as channel:
        stub = GenerationStub(channel)
        calls = [stub.Generate(request, metadata=(("application", ROUTED),)) for _ in range(2)]
        try:
            for call in calls:
                next(call)
            return True
        except grpc.RpcError as err:
            if err.code() != grpc.StatusCode.RESOURCE_EXHAUSTED:
                raise
            return False
        finally:
            for call in calls:
                call.cancel()


def sum_finished(snapshot: dict[str, dict]) -> int:
    return sum(s["finished_requests"] for s in snapshot.values())


def admitted(handle) -> bool:
    route, stream = send(handle, 10, 50)
    try:
        return sum(len(received(event).token_ids) for event in stream) == 50
    except AdmissionError:
        return False
    finally:
        decisions.pop(route.key)


def post(serve_stack, body: dict, headers: dict, path: str = "/v1/completions") -> tuple[int, dict, dict]:
    """POST a completion: status, response headers (lower-case names), JSON body."""
    conn = http.client.HTTPConnection(urlparse(serve_stack.http_url).netloc, timeout=60)
    try:
        conn.request(
            "POST", path, body=json.dumps(body), headers={"content-type": "application/json", **headers}
        )
        response = conn.getresponse()
        payload = json.loads(response.read())
        return response.status, {k.lower(): v for k, v in response.getheaders()}, payload
    finally:
        conn.close()


def test_http_class_selection_by_body_and_header_and_a_429_with_retry_after(serve_stack):
    body = {"prompt": "def f(x):", "max_tokens": 8}
    unreachable = {"x-slo-tpot-ms": "0.001"}  # no replica makes a token in a microsecond
    status, headers, payload = post(serve_stack, {**body, "sla_class": "interactive"}, unreachable)
    assert status == 429 and headers["retry-after"] == "30" and payload["error"]["type"] == "overloaded_error"
    assert payload["error"]["message"] == "no replica can meet SLA class 'interactive'; retry in 30s"
    assert post(serve_stack, body, {**unreachable, "x-sla-class": "interactive"})[0] == 429
    # The batch class never sheds: the same targets are missed, and it runs anyway.
    assert post(serve_stack, {**body, "sla_class": "batch"}, unreachable)[0] == 200
    assert post(serve_stack, body, {**unreachable, "x-sla-class": "batch"})[0] == 200
    status, _, payload = post(serve_stack, body, {"x-sla-class": "gold"})
    assert status == 400 and payload["error"]["param"] == "sla_class"
    status, _, payload = post(serve_stack, {**body, "sla_class": "interactive"}, {"x-slo-ttft-ms": "soon"})
    assert status == 400 and payload["error"]["param"] == "x-slo-ttft-ms"


def test_grpc_class_selection_by_field_and_metadata(serve_stack):
    with grpc.insecure_channel(serve_stack.grpc_target) as channel:
        stub = GenerationStub(channel)

        def generate(sla_class: str, *metadata: tuple[str, str]) -> list:
            request = pb.GenerateRequest(
                prompt="def f(x):",
                sampling=pb.SamplingOptions(max_tokens=4, ignore_eos=True),  # sampled: EOS could end it early
                sla_class=sla_class,
            )
            return list(stub.Generate(request, metadata=(("application", APP), *metadata), timeout=60))

        unreachable = ("x-slo-tpot-ms", "0.001")
        with pytest.raises(grpc.RpcError) as err:
            generate("interactive", unreachable)
        assert (
            err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and "retry in 30s" in err.value.details()
        )
        assert generate("batch", unreachable)[-1].final.finish_reason == "length"
        with pytest.raises(grpc.RpcError) as err:
            generate("", ("x-sla-class", "interactive"), unreachable)  # the header when the field is empty
        assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        with pytest.raises(grpc.RpcError) as err:
            generate("gold")
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert err.value.details().startswith("sla_class: unknown class 'gold'")
