"""Learned drafters serving inside the engine (the `dspark.drafters` entry points)."""
