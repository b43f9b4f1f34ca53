"""Routing decisions waiting to be attached to their request's trace, by the request's route key.

The router decides in the ingress process but on Serve's routing thread; the ingress code that owns the
request (deployments/frontend.py) picks its decision up here once the first event (or the refusal)
arrives, logs it with the request id and keeps it on the stream for the trace. Bounded: decisions of
requests nobody collects (a client gone mid-routing) fall out oldest first.
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict

from router.policy import Decision

MAX_KEPT = 4096
EVENT = "dspark.route"  # the span event of the ingress request span that records a decision

_lock = threading.Lock()
_decisions: OrderedDict[str, dict] = OrderedDict()


def record(key: str, decision: Decision, placed_on: str | None = None) -> None:
    """Keep the latest decision for `key` (Serve may ask the router again while it waits)."""
    if not key:
        return
    entry = {"decision": decision, "placed_on": placed_on}
    with _lock:
        _decisions[key] = entry
        _decisions.move_to_end(key)
        while len(_decisions) > MAX_KEPT:
            _decisions.popitem(last=False)


def placed(key: str, replica_id: str) -> None:
    """Serve sent the request to `replica_id` (the first choice, or the next when that one was full)."""
    with _lock:
        if key in _decisions:
            _decisions[key]["placed_on"] = replica_id


def pop(key: str, answered_by: str | None = None) -> dict | None:
    """The request's decision as trace-ready data, or None when no SLA router decided it.

    `answered_by`: the replica the request's first event came from, where the ingress knows it. It
    stands for Serve's confirmation when that has not come yet: Serve confirms only once its own loop
    has read the replica's accept, and the first event, sent on the multiplexed stream
    (deployments/stream_mux.py), can overtake it."""
    with _lock:
        entry = _decisions.pop(key, None)
    if entry is None:
        return None
    out = entry["decision"].to_dict()
    placed_on = entry["placed_on"] if entry["placed_on"] is not None else answered_by
    if placed_on is not None:
        out["placed_on"] = placed_on
    return out


def event_attributes(decision: dict) -> dict:
    """A decision (as `pop` returns it) as span-event attributes, which hold only scalars and lists of
    them: the outcome flat, the per-replica scores and exclusions as JSON objects keyed by replica id."""
    out: dict = {
        f"{EVENT}.action": decision["action"],
        f"{EVENT}.reason": decision["reason"],
        f"{EVENT}.ranking": list(decision["ranking"]),
        f"{EVENT}.scores": json.dumps(decision["scores"], sort_keys=True, separators=(",", ":")),
    }
    if "excluded" in decision:
        out[f"{EVENT}.excluded"] = json.dumps(decision["excluded"], sort_keys=True, separators=(",", ":"))
    if "retry_after_s" in decision:
        out[f"{EVENT}.retry_after_s"] = decision["retry_after_s"]
    if "placed_on" in decision:
        out[f"{EVENT}.placed_on"] = decision["placed_on"]
    return out
