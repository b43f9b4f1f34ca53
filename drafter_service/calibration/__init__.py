"""Verify rounds recorded through the engine, and the STS calibration fitted on them."""
