"""Replay a recorded run through the policy offline, to tune it before deploying it.

    python -m controller.replay RECORD.jsonl [--config '{"slack": 0.05}'] [--decisions] [--compare]

The policy is rebuilt from the record's header, with `--config` fields overriding it, and fed every
period's snapshots at the recorded `now`, with the recorded pins and pauses. Output: a summary per
replica (changes, reasons, the caps it ended with); `--decisions` prints every decision as JSONL;
`--compare` counts the decisions that differ from the recorded ones (0 for an unchanged policy).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from collections.abc import Iterable, Mapping

from controller import record
from controller.decision import Caps, Decision
from controller.policy import Policy


def replay(entries: Iterable[Mapping], overrides: Mapping | None = None) -> tuple[list[Decision], list[dict]]:
    """(the replayed decisions, the recorded ones) of a record's entries."""
    policy: Policy | None = None
    replayed, recorded = [], []
    for entry in entries:
        kind = entry["kind"]
        if kind == "header":
            policy = Policy(record.config_from_dict({**entry["policy"], **(overrides or {})}))
            continue
        if policy is None:  # a record without its header: the defaults, with the overrides
            policy = Policy(record.config_from_dict(dict(overrides or {})))
        if kind == "period":
            replayed.extend(policy.decide(record.snapshots_of(entry), now=entry["now"]))
        elif kind == "decision":
            recorded.append(entry["decision"])
        elif kind == "admin":
            _admin(policy, entry)
    return replayed, recorded


def _admin(policy: Policy, entry: Mapping) -> None:
    action = entry["action"]
    if action == "pin":
        policy.pins[entry["replica_id"]] = Caps.from_dict(entry["caps"])
    elif action == "unpin":
        policy.pins.pop(entry["replica_id"], None)
    elif action in ("pause", "resume"):
        policy.paused = action == "pause"


def summary(decisions: list[Decision]) -> dict:
    out: dict[str, dict] = {}
    for d in decisions:
        s = out.setdefault(d.replica_id, {"periods": 0, "changes": 0, "reasons": Counter()})
        s["periods"] += 1
        s["changes"] += d.changed
        s["reasons"][d.reason.value] += 1
        s["final_caps"] = d.caps.to_dict()
    return {rid: {**s, "reasons": dict(s["reasons"])} for rid, s in out.items()}


def differences(replayed: list[Decision], recorded: list[dict]) -> int:
    """Decisions whose reason or caps differ from the recorded ones (pairs in order)."""
    mine = [(d.replica_id, d.period, d.reason.value, d.caps.to_dict()) for d in replayed]
    theirs = [(d["replica_id"], d["period"], d["reason"], d["caps"]) for d in recorded]
    return sum(a != b for a, b in zip(mine, theirs)) + abs(len(mine) - len(theirs))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m controller.replay", description=__doc__.split("\n")[0])
    parser.add_argument("record", help="a JSONL record written by the controller")
    parser.add_argument("--config", default="{}", help="PolicyConfig fields as JSON, over the header's")
    parser.add_argument("--decisions", action="store_true", help="print every decision as JSONL")
    parser.add_argument("--compare", action="store_true", help="count decisions differing from the record")
    args = parser.parse_args(argv)
    try:
        overrides = json.loads(args.config)
        with open(args.record, encoding="utf-8") as f:
            replayed, recorded = replay(record.read(f), overrides)
    except (OSError, ValueError, TypeError, KeyError) as exc:
        print(f"replay: {exc}", file=sys.stderr)
        return 2
    if args.decisions:
        for d in replayed:
            print(json.dumps(d.to_dict(), sort_keys=True))
    print(json.dumps({"replicas": summary(replayed)}, sort_keys=True, indent=1))
    if args.compare:
        print(json.dumps({"differences": differences(replayed, recorded), "recorded": len(recorded)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
