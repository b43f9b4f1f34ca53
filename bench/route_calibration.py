"""Whether the SLA router's predictions came true, as pure functions over the requests' traces.

The SLA router records each decision on the request's ingress span (the `dspark.route` event,
router/decisions.py): every candidate replica's predicted TTFT and TPOT for the newcomer at decision
time. The replica's span of the same trace names the replica that ran it and the client's request id,
by which the benchmark knows what the client measured. Per replica, the median of predicted / realised
over the requests it ran says how far off the policy's model of this machine is (1: calibrated; < 1:
optimistic, the replica was slower than predicted). Under Serve's routers nothing is predicted; the
realised medians and the requests per replica still say where the load went.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from bench.route_workload import Outcome, SlaTarget, met, percentile

ROUTE_EVENT = "dspark.route"  # router/decisions.py EVENT (not imported: that would load the router here)
REQUEST_ID = "dspark.request_id"  # dspark/telemetry/semconv.py
REPLICA_ID = "dspark.replica.id"


@dataclass(frozen=True)
class Traced:
    """One request as its trace tells it: where it ran and what the router predicted for it there."""

    replica_id: str
    predicted_ttft_s: float | None = None  # None: no SLA router decided it
    predicted_tpot_s: float | None = None


def request_id(tag: str, index: int) -> str:
    """The request id the benchmark gives the `index`-th request of a window (tag: setting, arm, ...)."""
    return f"{tag}.{index}"


def traced_requests(spans: Iterable) -> dict[str, Traced]:
    """Request id -> Traced, from received spans (dspark.telemetry.receiver.ReceivedSpan: name,
    trace_id, attributes, events). A trace counts once its replica span has arrived; the prediction is
    the decision's score for the replica the request ran on (Serve may have placed it on the next
    choice when the first was full)."""
    ran: dict[str, tuple[str, str]] = {}  # trace id -> (request id, replica id)
    scores: dict[str, dict] = {}  # trace id -> the decision's scores by replica id
    for span in spans:
        attrs = span.attributes
        if REQUEST_ID in attrs and REPLICA_ID in attrs:
            ran[span.trace_id] = (str(attrs[REQUEST_ID]), str(attrs[REPLICA_ID]))
        for name, _, event in span.events:
            if name == ROUTE_EVENT and f"{ROUTE_EVENT}.scores" in event:
                scores[span.trace_id] = json.loads(event[f"{ROUTE_EVENT}.scores"])
    out = {}
    for trace_id, (rid, replica) in ran.items():
        score = scores.get(trace_id, {}).get(replica, {})
        ttft, tpot = score.get("ttft_ms"), score.get("tpot_ms")
        out[rid] = Traced(replica, ttft and ttft / 1e3, tpot and tpot / 1e3)
    return out


def _median(values: Sequence[float]) -> float | None:
    return statistics.median(values) if values else None


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1e3, 2)


def predicted_vs_realised(
    requests: Sequence[tuple[str, Outcome]],
    traced: Mapping[str, Traced],
    kinds: Mapping[str, str],
    targets: Sequence[SlaTarget] = (),
) -> dict[str, dict]:
    """Per replica (named by its kind, e.g. "drafter x8", then its id), over the completed `requests`
    (request id, what the client measured) whose trace arrived: how many ran there, the median realised
    and predicted TTFT and TPOT, and the median ratio predicted / realised of each. `kinds`: replica id
    -> kind. With `targets`, per SLA class too: how many of each ran there, the share that met its
    targets and their realised TPOT p50 / p99 (which class missed where)."""
    by_replica: dict[str, list[tuple[Outcome, Traced]]] = {}
    for rid, outcome in requests:
        found = traced.get(rid)
        if outcome.status == "ok" and found is not None:
            by_replica.setdefault(found.replica_id, []).append((outcome, found))
    out = {}
    for replica, pairs in sorted(by_replica.items()):
        ttfts = [(o.ttft_s, t.predicted_ttft_s) for o, t in pairs if o.ttft_s]
        tpots = [(o.tpot_s, t.predicted_tpot_s) for o, t in pairs if o.tpot_s]
        entry = {
            "requests": len(pairs),
            "realised_ttft_p50_ms": _ms(_median([r for r, _ in ttfts])),
            "realised_tpot_p50_ms": _ms(_median([r for r, _ in tpots])),
            "predicted_ttft_p50_ms": _ms(_median([p for _, p in ttfts if p is not None])),
            "predicted_tpot_p50_ms": _ms(_median([p for _, p in tpots if p is not None])),
            "ttft_ratio_p50": _ratio(ttfts),
            "tpot_ratio_p50": _ratio(tpots),
        }
        if targets:
            entry["by_class"] = _by_class([o for o, _ in pairs], targets)
        out[f"{kinds.get(replica, '?')} {replica}"] = entry
    return out


def _by_class(outcomes: Sequence[Outcome], targets: Sequence[SlaTarget]) -> dict[str, dict]:
    out = {}
    for target in targets:
        mine = [o for o in outcomes if o.arrival.sla_class == target.name]
        if not mine:
            continue
        tpots = [o.tpot_s for o in mine if o.tpot_s is not None]
        p50, p99 = percentile(tpots, 50), percentile(tpots, 99)
        out[target.name] = {
            "requests": len(mine),
            "attainment": round(sum(met(o, target) for o in mine) / len(mine), 4),
            "realised_tpot_p50_ms": _ms(p50),
            "realised_tpot_p99_ms": _ms(p99),
        }
    return out


def _ratio(pairs: Sequence[tuple[float, float | None]]) -> float | None:
    """The median of predicted / realised over the pairs with a prediction."""
    ratio = _median([p / r for r, p in pairs if p is not None])
    return None if ratio is None else round(ratio, 3)
