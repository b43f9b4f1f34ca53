"""bench/route_decision.py: the drawn path and the all-scored contrast, reported and plotted."""

from __future__ import annotations

import gc

from bench import route_decision


def test_the_report_sets_the_draw_beside_every_replica_scored(tmp_path):
    before = gc.get_threshold(), gc.get_freeze_count()
    result = route_decision.run(replicas=(2, 12), decisions=40)
    assert (gc.get_threshold(), gc.get_freeze_count()) == before  # the collector left as it was found
    assert result["candidates"] == 8
    assert "serving_gc_threshold 10000" in result["gc"]["cases"]
    for case in route_decision.CASES:
        assert set(result["cases"][case]) == {"2", "12"}
        assert set(result["cases_python_gc"][case]) == {"12"}  # the largest fleet, for contrast
        assert 0 <= result["cases"][case]["12"]["held_collection"] <= 1
        assert set(result["cases_all_scored"][case]) == {"12"}  # a fleet of 2 is scored whole either way
        assert result["cases_all_scored"][case]["12"]["cpu_p50_ms"] > 0
    assert route_decision.all_scored_decisions(1000, 2000) == 200
    assert route_decision.all_scored_decisions(32, 2000) == 2000
    route_decision.plot(result, tmp_path / "decision.png")
    assert (tmp_path / "decision.png").stat().st_size > 10_000
