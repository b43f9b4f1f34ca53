"""The cluster controller's pure logic: per-replica draft-budget caps from telemetry (policy.py), the
closed-loop recalibration decisions (recalibration.py), and replay of recorded telemetry (replay.py).
No Ray and no I/O beyond the replay's file; the Serve glue is deployments/controller.py."""
