"""The controller's record: one JSON object per line (JSONL), what it saw and did, to replay offline.

    {"kind": "header", "version": 1, "policy": {...PolicyConfig...}}
    {"kind": "period", "now": 12.0, "replicas": [{...ReplicaTelemetry...}, ...]}
    {"kind": "decision", "now": 12.0, "decision": {...Decision.to_dict()...}}
    {"kind": "admin", "now": 12.5, "action": "pin", "replica_id": "r1", "caps": {...}}

(admin actions: pin, unpin, pause, resume)

A period line holds every snapshot the policy was given that period and `now`, the controller's clock
when it decided, so a replay makes the same decisions (controller/replay.py). Decision lines are what
the live controller decided, for comparison; admin lines are operators' pins and pauses, replayed too.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import asdict
from pathlib import Path
from typing import IO

from controller.decision import Decision
from controller.policy import PolicyConfig, SlaTarget
from controller.stability import Limits
from controller.telemetry import ReplicaTelemetry

VERSION = 1


def config_to_dict(config: PolicyConfig) -> dict:
    return asdict(config)


def config_from_dict(data: Mapping) -> PolicyConfig:
    data = dict(data)
    if "limits" in data:
        data["limits"] = Limits(**data["limits"])
    if "sla_classes" in data:
        data["sla_classes"] = {name: SlaTarget(**t) for name, t in data["sla_classes"].items()}
    return PolicyConfig(**data)


def header(config: PolicyConfig) -> dict:
    return {"kind": "header", "version": VERSION, "policy": config_to_dict(config)}


def period(now: float, snapshots: Iterable[ReplicaTelemetry]) -> dict:
    return {"kind": "period", "now": now, "replicas": [s.to_dict() for s in snapshots]}


def decision(now: float, d: Decision) -> dict:
    return {"kind": "decision", "now": now, "decision": d.to_dict()}


def admin(now: float, action: str, replica_id: str | None = None, caps: Mapping | None = None) -> dict:
    return {"kind": "admin", "now": now, "action": action, "replica_id": replica_id, "caps": caps}


def read(lines: Iterable[str]) -> Iterator[dict]:
    """The record's entries; a record of another version is refused by name, a blank line skipped."""
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        entry = json.loads(line)
        if entry.get("kind") == "header" and entry.get("version") != VERSION:
            raise ValueError(f"line {number}: record version {entry.get('version')!r}, expected {VERSION}")
        yield entry


def snapshots_of(entry: Mapping) -> dict[str, ReplicaTelemetry]:
    return {s.replica_id: s for s in (ReplicaTelemetry.from_dict(r) for r in entry["replicas"])}


class Recorder:
    """Appends entries to a JSONL file, one flushed line each (a crash loses at most the line it was on)."""

    def __init__(self, path: str | Path, config: PolicyConfig) -> None:
        self._file: IO[str] = open(path, "a", encoding="utf-8")  # noqa: SIM115 (closed in close())
        self.write(header(config))

    def write(self, entry: Mapping) -> None:
        self._file.write(json.dumps(entry, sort_keys=True) + "\n")
        self._file.flush()

    def close(self) -> None:
        self._file.close()
