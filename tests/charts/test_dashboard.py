"""The Grafana dashboard the chart ships (charts/dspark/dashboards/dspark.json): every query names
metrics that exist, with labels they carry. Our names are derived from the instrument definitions
(dspark/telemetry/metrics.py) through the Prometheus names the endpoint exposes (a real scrape checks
that derivation in tests/dspark/telemetry/test_telemetry_export.py); our labels come from a real
scrape of a replica's endpoint here; Ray's names from the queries of Ray's own dashboards."""

from __future__ import annotations

import json
import re
import urllib.request
from pathlib import Path

import pytest
import ray
from prometheus_client.parser import text_string_to_metric_families
from serving import free_port

from dspark.config import EngineConfig
from dspark.cost_table import CostTable
from dspark.engine import Engine
from dspark.sampling_params import SamplingParams
from dspark.telemetry import semconv as sc
from dspark.telemetry.engine_telemetry import EngineTelemetry
from dspark.telemetry.metrics import INSTRUMENTS
from dspark.telemetry.prometheus import prometheus_series
from dspark.telemetry.setup import setup_telemetry

DASHBOARD = Path(__file__).resolve().parents[2] / "charts" / "dspark" / "dashboards" / "dspark.json"
# Metric names in PromQL: our namespace, the GenAI conventions', Ray's (label names look alike, so
# label matchers and by/without clauses are taken out first).
METRIC = re.compile(r"\b(?:dspark:[a-z_:]+|gen_ai_[a-z_]+|ray_[a-z_]+)\b")
LABELS = re.compile(r"\{[^}]*\}|\b(?:by|without)\s*\([^)]*\)|,\s*[a-z_]+\)")
# Label names a query relies on: matchers, grouping clauses, and {{label}} in the legend.
MATCHER_LABELS = re.compile(r"([a-z_]+)\s*(?:=~|!~|!=|=)")
GROUPING = re.compile(r"\b(?:by|without)\s*\(([^)]*)\)")
LEGEND_LABELS = re.compile(r"\{\{\s*([a-z_]+)\s*\}\}")
# Labels Prometheus adds to every scraped series (the target's), and the histogram bucket bound.
TARGET_LABELS = {"instance", "job", "pod", "ray_node_type", "le"}


def metrics_in(expr: str) -> list[str]:
    return METRIC.findall(LABELS.sub(" ", expr))


def ours() -> set[str]:
    return {name for instrument in INSTRUMENTS for name in prometheus_series(instrument)}


def rays() -> set[str]:
    """Ray's metrics: what Ray's own Grafana dashboards query, and the Serve metrics Ray's source
    defines by a literal name (exported with Ray's `ray_` prefix)."""
    root = Path(ray.__file__).parent
    panels = root / "dashboard" / "modules" / "metrics" / "dashboards"
    names = {name for f in panels.glob("*_panels.py") for name in re.findall(r"\bray_[a-z_]+", f.read_text())}
    defined = re.compile(r"metrics\.(Counter|Gauge|Histogram)\(\s*(?:name=)?\"(serve_[a-z_]+)\"")
    suffixes = {"Counter": ("_total",), "Gauge": ("",), "Histogram": ("_bucket", "_sum", "_count")}
    for f in (root / "serve" / "_private").glob("*.py"):
        for kind, name in defined.findall(f.read_text()):
            names |= {f"ray_{name}{suffix}" for suffix in suffixes[kind]}
    return names


def labels_in(expr: str, legend: str = "") -> set[str]:
    used = {name for group in re.findall(r"\{([^}]*)\}", expr) for name in MATCHER_LABELS.findall(group)}
    used |= {name.strip() for group in GROUPING.findall(expr) for name in group.split(",") if name.strip()}
    return used | set(LEGEND_LABELS.findall(legend))


@pytest.fixture(scope="module")
def scraped(qwen3_dir) -> dict[str, set[str]]:
    """Series name -> label names, from a real replica endpoint: an engine with the kit's telemetry
    serving a request of SLA class "gold" and failing another, as a target replica does."""
    with pytest.MonkeyPatch.context() as env:
        for name in ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_SDK_DISABLED"):
            env.delenv(name, raising=False)
        env.setenv("DSPARK_PROMETHEUS_PORT", str(free_port()))
        telemetry = setup_telemetry("replica", {sc.REPLICA_ID: "r0"}, set_global=False)
    try:
        config = EngineConfig(model=str(qwen3_dir), drafter="ngram", scheduler="dspark", num_kv_pages=32)
        engine = Engine(config, cost_table=CostTable([1, 8, 64], [200.0, 150.0, 40.0], 64))
        traced = EngineTelemetry(telemetry, engine, "target", "r0")
        params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, sla_class="gold")
        rid = engine.add_request([5, 6, 7, 5, 6, 7, 5, 6], params)
        trace = traced.start(rid, "label", sc.TEXT_COMPLETION, params)
        while engine.has_unfinished():
            for out in engine.step():
                if out.finished:
                    trace.finished(out)
        # A request that failed (its duration carries error.type), and confidences for the calibration
        # gauge (n-gram drafts carry none).
        traced.start("failed", "label2", sc.CHAT, params).failed(RuntimeError("engine stopped"))
        traced.metrics.calibration.add([0.9, 0.5], 1)
        url = f"http://127.0.0.1:{telemetry.prometheus.port}/metrics"
        text = urllib.request.urlopen(url, timeout=10).read().decode()
    finally:
        telemetry.shutdown()
    labels: dict[str, set[str]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels.setdefault(sample.name, set()).update(sample.labels)
    return labels


def dashboard() -> dict:
    return json.loads(DASHBOARD.read_text())


def queries(board: dict) -> list[tuple[str, str]]:
    """(panel title, expr) for every target, and the variables' queries."""
    return [(where, expr) for where, expr, _ in targets(board)]


def targets(board: dict) -> list[tuple[str, str, str]]:
    """(panel title, expr, legend) for every target, and (name, query, "") for the variables."""
    found = [
        (p["title"], t["expr"], t.get("legendFormat", ""))
        for p in board["panels"]
        for t in p.get("targets", [])
    ]
    found += [(v["name"], v["query"], "") for v in board["templating"]["list"] if v["type"] == "query"]
    return found


def test_every_panel_queries_metrics_that_are_exported():
    board, exported = dashboard(), ours() | rays()
    assert len(ours()) > 20 and len(rays()) > 50  # both derivations found something
    for panel in board["panels"]:
        assert panel["type"] == "row" or panel.get("targets"), f"panel {panel['title']!r} has no query"
    for where, expr in queries(board):
        names = metrics_in(expr)
        assert names, f"{where!r}: {expr!r} names no metric"
        unknown = sorted(set(names) - exported)
        assert not unknown, f"{where!r} queries {unknown}, which nothing exports"


def test_every_label_a_query_uses_is_on_the_series_a_replica_exposes(scraped):
    """A query on a label the series lack shows nothing, silently: every label a query on our metrics
    matches, groups by or shows in its legend is on one of its series in a real scrape."""
    assert scraped.keys() >= ours()  # the scrape has every series (so the check below has labels)
    checked = 0
    for where, expr, legend in targets(dashboard()):
        names = [n for n in metrics_in(expr) if n in scraped]
        if not names:  # Ray's metrics: labels not checked here
            continue
        carried = set().union(*(scraped[n] for n in names)) | TARGET_LABELS
        missing = labels_in(expr, legend) - carried
        assert not missing, f"{where!r}: {expr!r} uses labels {sorted(missing)} its series lack"
        checked += 1
    assert checked >= 15


def test_the_label_reader_finds_matchers_groupings_and_legends():
    expr = 'sum by (position) (rate(x_total{model_name=~"$m", le="0.5"}[5m])) / sum without (job, pod) (y)'
    assert labels_in(expr, "{{ instance }} at {{dspark_batch_tokens}}") == {
        "position",
        "model_name",
        "le",
        "job",
        "pod",
        "instance",
        "dspark_batch_tokens",
    }


def test_the_dashboard_shows_what_the_kit_measures():
    used = {name for _, expr in queries(dashboard()) for name in metrics_in(expr)}
    for wanted in (
        "gen_ai_server_time_to_first_token_seconds_bucket",
        "gen_ai_server_time_per_output_token_seconds_bucket",
        "dspark:spec_decode_num_accepted_tokens_per_pos_total",
        "dspark:spec_decode_num_drafts_total",
        "dspark:draft_budget_request_tokens",
        "dspark:confidence_calibration_error",
        "dspark:sps_measured_per_second",
    ):
        assert wanted in used


def test_slo_choices_are_bucket_boundaries_as_exposed():
    """An SLA query reads one histogram bucket (le="$ttft_slo"), so every choice must be a boundary,
    written as the exporter writes it."""
    variables = {v["name"]: v for v in dashboard()["templating"]["list"]}
    for name, buckets in (("ttft_slo", sc.TTFT_BUCKETS), ("tpot_slo", sc.TPOT_BUCKETS)):
        choices = variables[name]["query"].split(",")
        assert choices and set(choices) <= {f"{float(b)}" for b in buckets}
        assert variables[name]["current"]["value"] in choices


def test_panel_ids_are_unique_and_the_grid_does_not_overlap():
    panels = dashboard()["panels"]
    assert len({p["id"] for p in panels}) == len(panels)
    cells = set()
    for p in panels:
        g = p["gridPos"]
        mine = {(x, y) for x in range(g["x"], g["x"] + g["w"]) for y in range(g["y"], g["y"] + g["h"])}
        assert not mine & cells, f"panel {p['title']!r} overlaps another"
        cells |= mine
