"""Recording what the controller saw and did, and replaying it offline (controller/record.py, replay.py)."""

from __future__ import annotations

import json
import subprocess
import sys

from synthetic_telemetry import snap

from controller import record, replay
from controller.decision import Caps
from controller.policy import Policy, PolicyConfig, SlaTarget
from controller.telemetry import ClassStats

PERIOD = 2.0
CONFIG = PolicyConfig(period_s=PERIOD, sla_classes={"chat": SlaTarget(0.012, interactive=True)})


def live_run(path) -> list:
    """A controller's run over a load ramp on two replicas, recorded as it goes, with a pin and a pause."""
    policy, recorder, decisions = Policy(CONFIG), record.Recorder(path, CONFIG), []
    loads = [2] * 3 + [60] * 4 + [220] * 5 + [2] * 4
    classes = {"chat": ClassStats(running=10, tpot_s=0.02), "batch": ClassStats(running=50)}
    for i, load in enumerate(loads):
        now = i * PERIOD
        if i == 5:
            policy.pins["b"] = Caps(max_step_tokens=3)
            recorder.write(record.admin(now, "pin", "b", policy.pins["b"].to_dict()))
        if i in (9, 11):
            policy.paused = i == 9
            recorder.write(record.admin(now, "pause" if i == 9 else "resume"))
        snapshots = {
            "a": snap(load, now, replica_id="a"),
            "b": snap(load, now, replica_id="b", classes=classes),
        }
        recorder.write(record.period(now, snapshots.values()))
        for d in policy.decide(snapshots, now):
            decisions.append(d)
            recorder.write(record.decision(now, d))
    recorder.close()
    return decisions


def test_snapshots_round_trip_through_the_record():
    s = snap(7, 1.5, classes={"chat": ClassStats(running=3, tpot_s=0.01)})
    (entry,) = record.read([json.dumps(record.period(1.5, [s]))])
    assert record.snapshots_of(entry) == {"r0": s}
    assert record.config_from_dict(record.config_to_dict(CONFIG)) == CONFIG


def test_replay_reproduces_the_live_decisions(tmp_path):
    path = tmp_path / "run.jsonl"
    live = live_run(path)
    with open(path) as f:
        replayed, recorded = replay.replay(record.read(f))
    assert [d.to_dict() for d in replayed] == [d.to_dict() for d in live] == recorded
    assert replay.differences(replayed, recorded) == 0
    reasons = {d.reason.value for d in replayed}
    assert {"pinned", "paused", "load_up_shrink", "sla_interactive_priority"} <= reasons


def test_the_cli_replays_a_file_with_a_tuned_policy(tmp_path, capsys):
    path = tmp_path / "run.jsonl"
    live_run(path)
    same = subprocess.run(
        [sys.executable, "-m", "controller.replay", str(path), "--compare"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert json.loads(same.stdout.strip().splitlines()[-1]) == {"differences": 0, "recorded": 32}
    capsys.readouterr()
    code = replay.main([str(path), "--compare", "--config", '{"slack": 0.3, "confirm_windows": 1}'])
    assert code == 0
    tuned = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert tuned["differences"] > 0  # a looser slack and no confirmation decide otherwise


def test_the_cli_refuses_a_record_of_another_version(tmp_path, capsys):
    path = tmp_path / "old.jsonl"
    path.write_text(json.dumps({"kind": "header", "version": 0, "policy": {}}) + "\n")
    assert replay.main([str(path)]) == 2
    assert "record version 0" in capsys.readouterr().err
