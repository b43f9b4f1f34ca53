"""Our files beside a DeepSpec config.json, for what DeepSpec's layout has no field for.

- `dspark_serve.json`: {"drafter": kind, "training": provenance}. Only the kind matters to loading, and
  only to tell MTP-1 from EAGLE-3 (both are Qwen3Eagle3Model); without the file, as in a checkpoint
  DeepSpec wrote, the kind is derived from config.json.
- `sts_temperature_<T>.json`: the confidence head's STS temperatures fitted at serving temperature T, in
  SGLang's STS format (`{"temperatures": [T_1 .. T_gamma], "num_samples": N}`, SGLang's
  `DSparkStsCalibration`), so `--speculative-dspark-confidence-sts-path` takes the file as it is.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from dspark.errors import ModelLoadError

EXTRAS_FILE = "dspark_serve.json"
STS_PREFIX = "sts_temperature_"


def sts_path(directory: str | Path, serving_temperature: float) -> Path:
    return Path(directory) / f"{STS_PREFIX}{float(serving_temperature)}.json"


def write_sts(path: str | Path, temperatures: list[float], num_samples: int | None = None) -> None:
    """One serving temperature's STS temperatures as SGLang reads them (every one > 0)."""
    if not temperatures or any(not (t > 0 and math.isfinite(t)) for t in temperatures):
        raise ValueError(f"STS temperatures must be finite and > 0, got {temperatures}")
    body: dict = {"temperatures": [float(t) for t in temperatures]}
    if num_samples is not None:
        body["num_samples"] = int(num_samples)
    Path(path).write_text(json.dumps(body, indent=2) + "\n")


def read_sts(path: str | Path) -> list[float]:
    raw = json.loads(Path(path).read_text())
    temps = raw.get("temperatures") if isinstance(raw, dict) else None
    if (
        not isinstance(temps, list)
        or not temps
        or any(not isinstance(t, int | float) or not t > 0 for t in temps)
    ):
        raise ModelLoadError(f"{path}: 'temperatures' must be a non-empty list of numbers > 0")
    return [float(t) for t in temps]


def save_extras(directory: str | Path, kind: str, training: dict, sts: dict[float, list[float]]) -> None:
    directory = Path(directory)
    (directory / EXTRAS_FILE).write_text(json.dumps({"drafter": kind, "training": training}, indent=2) + "\n")
    for old in directory.glob(f"{STS_PREFIX}*.json"):
        old.unlink()
    for temperature, temps in sts.items():
        write_sts(sts_path(directory, temperature), temps)


def load_extras(directory: str | Path) -> tuple[str | None, dict, dict[float, list[float]]]:
    """(kind or None, training provenance, serving temperature -> STS temperatures)."""
    directory = Path(directory)
    kind, training = None, {}
    extras = directory / EXTRAS_FILE
    if extras.is_file():
        raw = json.loads(extras.read_text())
        unknown = sorted(set(raw) - {"drafter", "training"}) if isinstance(raw, dict) else ["<not an object>"]
        if unknown:
            raise ModelLoadError(f"{extras}: unknown fields {unknown}")
        kind, training = raw.get("drafter"), raw.get("training", {})
    sts = {}
    for path in sorted(directory.glob(f"{STS_PREFIX}*.json")):
        try:
            temperature = float(path.name[len(STS_PREFIX) : -len(".json")])
        except ValueError:
            raise ModelLoadError(f"{path}: the name must be {STS_PREFIX}<serving temperature>.json") from None
        sts[temperature] = read_sts(path)
    return kind, training, sts
