"""bench/host_sharing.py: each engine's measured stretch beside the two host laws', its steps alone and
beside the other engine apart, and the committed report is what the script writes from its result."""

import json
from pathlib import Path

import pytest

from bench.host_sharing import engine_report, markdown, overlap, summary

RESULTS = Path(__file__).resolve().parents[2] / "bench" / "results"


def test_a_step_overlaps_the_other_engines_steps_that_cross_it():
    other = [(0.5, 1.5, 1.0), (1.8, 2.2, 0.4), (3.0, 4.0, 1.0)]
    assert overlap((1.0, 2.0, 0.5), other) == (pytest.approx(0.7), 0)
    assert overlap((2.5, 2.9, 0.4), other, 1) == (0.0, 2)  # between the other's steps: alone


def test_an_engines_stretch_is_its_steps_wall_over_their_cpu_and_each_law_mixes_by_the_overlap():
    """One step alone (1 s of wall for 0.5 s of CPU), one beside the other engine (1 s for 0.8 s), on 2
    cores with 0.5 cores of path load: the fluid law mixes 2 / 1.5 beside and 1 alone half and half, the
    per-core law is 2 / 1.5 either way."""
    steps = [(0.0, 1.0, 0.5), (2.0, 3.0, 0.8)]
    other = [(1.5, 3.5, 2.0)]
    report = engine_report(steps, other, load=0.5, cores=2, seconds=10.0)
    assert report["measured"] == round(2.0 / 1.3, 3)
    assert (report["measured_alone"], report["measured_beside"]) == (2.0, 1.25)
    assert (report["stepping_share"], report["beside_other_share"]) == (0.2, 0.5)
    assert report["fluid"] == round(0.5 * 2 / 1.5 + 0.5, 3)
    assert report["per_core"] == round(2 / 1.5, 3)
    assert report["law_alone"] == {"fluid": 1.0, "per_core": round(2 / 1.5, 3)}


def test_the_committed_report_is_what_the_script_writes_from_its_result():
    result = json.loads((RESULTS / "host_sharing.json").read_text())
    assert (RESULTS / "host_sharing.md").read_text() == markdown(result)
    assert result["summary"] == summary(result["regimes"])
    assert len(result["regimes"]) == 3 and all(len(r["engines"]) == 2 for r in result["regimes"])
