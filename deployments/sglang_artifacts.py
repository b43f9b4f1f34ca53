"""Our artefacts in the formats SGLang's DSpark loads, and SGLang's SPS table read back.

- SPS table (`--speculative-dspark-sps-table-path`): SGLang's `SpsCostTable` JSON,
  {"sample_batch_tokens": [...], "sample_steps_per_sec": [...], "max_batch_tokens": N}
  (sglang/srt/speculative/dspark_components/dspark_sps.py). SGLang looks a batch up at the probe at or
  below it (a floor step); ours interpolates between measured points (dspark/cost_table.py). Exported
  at every B from 1 to max_tokens, SGLang's lookup returns exactly our SPS(B) for every batch.
  A table describes the engine that measured it: ours times the built-in engine, so for SGLang's own
  speed profile SGLang (`python -m sglang.benchmark.dspark_sps_profiler`); this export is for moving a
  table between the two, e.g. to compare them, or to score SGLang replicas with SGLang's table.
- STS temperatures (`--speculative-dspark-confidence-sts-path`): a drafter directory already holds them
  in SGLang's format, one `sts_temperature_<T>.json` per serving temperature
  (drafter_service/models/extras.py); pass one file as `sglang.sts`.
- Drafter checkpoints: saved in DeepSpec's layout, which SGLang's Qwen3DSparkModel reads as it is
  (drafter_service/models/checkpoint.py).

    python -m deployments.sglang_artifacts sps COST_TABLE.json OUT.json

COST_TABLE.json is one of the engine's cached tables ($DSPARK_CACHE_DIR/sps-*.json).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from dspark.cost_table import CostTable


def sps_table_json(table: CostTable) -> dict:
    """`table` as SGLang's SpsCostTable: one probe per batch size, so its floor lookup is exact."""
    sizes = list(range(1, table.max_tokens + 1))
    return {
        "sample_batch_tokens": sizes,
        "sample_steps_per_sec": [round(table(b), 6) for b in sizes],
        "max_batch_tokens": table.max_tokens,
    }


def write_sps_table(table: CostTable, path: str | Path) -> Path:
    path = Path(path)
    path.write_text(json.dumps(sps_table_json(table)) + "\n")
    return path


def read_sps_points(path: str | Path) -> list[list[float]] | None:
    """An SGLang SPS table as [[batch_tokens, steps_per_s], ...] (what routing stats publish); None for
    SGLang's additive table, whose step time depends on the batch's requests and budget apart."""
    data = json.loads(Path(path).read_text())
    if "bias_seconds" in data:
        return None
    return [[b, r] for b, r in zip(data["sample_batch_tokens"], data["sample_steps_per_sec"])]


def is_profiled_sps_table(path: str | Path | None) -> bool:
    """Whether SGLang schedules verify budgets with this table, by SGLang's own loader and test: without
    one, or with a flat one (a single probe), its compact mode verifies every drafted token."""
    if not path:
        return False
    from sglang.srt.speculative.dspark_components.dspark_sps import (
        SpsCostTable,
        is_uninitialized_sps_table,
        load_sps_table_from_path,
    )

    table = load_sps_table_from_path(str(path))
    return not (isinstance(table, SpsCostTable) and is_uninitialized_sps_table(table))


def read_cost_table(path: str | Path) -> CostTable:
    """One of the engine's cached tables (cost_table.load_or_profile writes them)."""
    data = json.loads(Path(path).read_text())
    return CostTable(data["points"], data["rates"], data["max_tokens"], source="cache")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m deployments.sglang_artifacts", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    sps = commands.add_parser("sps", help="export one of our SPS tables as SGLang's SpsCostTable JSON")
    sps.add_argument("cost_table", help="a cached table of ours ($DSPARK_CACHE_DIR/sps-*.json)")
    sps.add_argument("out", help="where to write SGLang's JSON")
    args = parser.parse_args(argv)
    table = read_cost_table(args.cost_table)
    print(f"wrote {write_sps_table(table, args.out)} ({table.max_tokens} probes)")


if __name__ == "__main__":
    main()
