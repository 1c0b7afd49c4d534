"""The Grafana dashboards (dashboards/grafana/) are valid, consistent, and read
only metrics the job exports.

Every panel's PromQL is checked by the real promtool (as recording rules of a
temporary rules file), and every metric and label a panel or a Prometheus rule
reads is checked against what streaming.metrics.Metrics exports on a fresh
registry fed a real detector snapshot.
"""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import CollectorRegistry
from prometheus_client.metrics import MetricWrapperBase

# tests/ holds the helper shared with the end-to-end tier.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from dashboard_queries import (
    REPO_ROOT,
    all_dashboards,
    grouping_labels,
    iter_panels,
    panel_queries,
    require_tool,
    selectors,
    substitute,
    variable_values,
)

DASHBOARDS = REPO_ROOT / "dashboards"
BUILDER = DASHBOARDS / "build_dashboards.py"
RULES_FILE = DASHBOARDS / "prometheus" / "rules" / "fencewatch.rules.yml"
PROVISIONING = DASHBOARDS / "grafana" / "provisioning"
PROMETHEUS_CONFIG = DASHBOARDS / "prometheus" / "prometheus.yml"
COMPOSE_FILE = REPO_ROOT / "docker-compose.yml"
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
# Series Prometheus makes itself: (name -> labels it always has; None: any labels).
PROMETHEUS_SERIES: dict[str, frozenset[str] | None] = {
    "up": frozenset({"job", "instance"}),
    "ALERTS": None,
}
TARGET_LABELS = frozenset({"job", "instance"})  # added by the scrape


def load(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text(encoding="utf-8"))


def dashboard_ids() -> list[str]:
    return [p.name for p in all_dashboards()]


@pytest.fixture(params=all_dashboards(), ids=dashboard_ids())
def dashboard_path(request: pytest.FixtureRequest) -> Path:
    return request.param


def test_there_is_a_dashboard():
    assert [p.name for p in all_dashboards()] == ["fencewatch-overview.json"]


# ---- what the job exports ------------------------------------------------------------------


def real_snapshot() -> dict[str, Any]:
    """A snapshot from a real detector (the shape detectors.stats produces), with
    every counter family non-empty so that each family shows its labels."""
    from detectors.engine import Detector
    from detectors.envelope import DeadLetter, DeadLetterClass, envelope_from_obj
    from producers import shapes as s

    detector = Detector(now_ms=lambda: 0)
    raw = [
        s.envelope("c1", "metadata", 1000, s.feature_level(21), offset=1),
        s.envelope("c1", "metadata", 1000, s.register_broker(1, 10, fenced=False), offset=2),
        s.envelope("c1", "request", 2000, s.produce("unknown-topic", 0, 0), node=1),
    ]
    for index, obj in enumerate(raw):
        assert detector.ingest(envelope_from_obj(obj, f"test:{index}", index)) == []
    detector.dead_letter(
        DeadLetter("test:9", "malformed JSON: truncated", "", kind=DeadLetterClass.MALFORMED_JSON)
    )
    detector.flush()
    snapshot = detector.snapshot("c1")
    for key in ("events", "unverified", "dead_letters"):
        assert snapshot[key], f"the test history should give a non-empty {key}: {snapshot}"
    return snapshot


def exported_series() -> dict[str, frozenset[str]]:
    """Sample name -> label names, for every series the job's registry can export."""
    from streaming.metrics import Metrics

    registry = CollectorRegistry()
    metrics = Metrics(registry)
    metrics.build.info({"version": "0.0.0"})
    snapshot = real_snapshot()
    # Clock offsets are exported for measured nodes only, which so short a history
    # may not give: one measured node, so that their families show their labels.
    offsets = dict(snapshot.get("clock_offsets") or {})
    if not any(offset.get("measured") for offset in offsets.values()):
        offsets["1"] = {"low_ms": -40, "high_ms": 60, "measured": True, "evidence": 3}
    # Possible violations and contradicted clock bounds are exported where there
    # are some: one of each, so that their series show their labels.
    possible = [["STOP_REPLICA_STALE_EPOCH_APPLIED", "info", "firing", 1]]
    contradicted = {"1": [2900, 3100, 200]}
    metrics.detector.update(
        {
            **snapshot,
            "clock_offsets": offsets,
            "possible_alerts": possible,
            "clock_bound_contradicted": contradicted,
        }
    )
    # Labelled metrics export nothing until a child exists: create one of each.
    for metric in vars(metrics).values():
        if isinstance(metric, MetricWrapperBase) and metric._labelnames:
            metric.labels(*["x"] * len(metric._labelnames))
    series: dict[str, set[str]] = {}
    for family in registry.collect():
        assert family.samples, f"{family.name} exported no sample"
        for sample in family.samples:
            series.setdefault(sample.name, set()).update(sample.labels)
    return {name: frozenset(labels) for name, labels in series.items()}


def recorded_series() -> dict[str, frozenset[str]]:
    """Recording rules of the Prometheus rules file -> the labels they keep."""
    doc = yaml.safe_load(RULES_FILE.read_text(encoding="utf-8"))
    return {
        rule["record"]: frozenset(grouping_labels(rule["expr"]))
        for group in doc["groups"]
        for rule in group["rules"]
        if "record" in rule
    }


@pytest.fixture(scope="module")
def known_series() -> dict[str, frozenset[str] | None]:
    known: dict[str, frozenset[str] | None] = {
        name: labels | TARGET_LABELS for name, labels in exported_series().items()
    }
    known.update(recorded_series())
    known.update(PROMETHEUS_SERIES)
    return known


def test_the_registry_exports_what_the_metrics_module_documents(known_series):
    # A sanity check of exported_series itself: these must be there, with their suffixes.
    for name in (
        "fencewatch_alerts_total",
        "fencewatch_events_total",
        "fencewatch_batch_duration_seconds_bucket",
        "fencewatch_batch_duration_seconds_count",
        "fencewatch_build_info",
        "fencewatch_webhook_failures_total",
        "fencewatch_open_alerts",
        "fencewatch_clock_offset_seconds",
        "fencewatch_clock_offset_evidence",
    ):
        assert name in known_series
    assert known_series["fencewatch_alerts_total"] >= {"cluster", "rule", "severity", "status", "confidence"}
    assert known_series["fencewatch_clock_offset_seconds"] >= {"cluster", "node", "bound"}
    assert "fencewatch_alerts" not in known_series  # the family name is not a series
    assert "le" in known_series["fencewatch_batch_duration_seconds_bucket"]


def test_every_exported_metric_is_documented():
    text = (REPO_ROOT / "docs" / "operations.md").read_text(encoding="utf-8")
    documented = set(re.findall(r"`(fencewatch_\w+)`", text))
    names = {re.sub(r"_(created|bucket|count|sum)$", "", name) for name in exported_series()}
    # A histogram is documented by its base name, a counter by its _total series.
    names = {n for n in names if f"{n}_total" not in names}
    assert names - documented == set()


def check_reads(where: str, expr: str, known: dict[str, frozenset[str] | None]) -> list[str]:
    """Problems with the series and labels ``expr`` reads."""
    problems = []
    read_labels: set[str] = set()
    for sel in selectors(expr):
        if sel.metric not in known:
            problems.append(f"{where}: unknown metric {sel.metric!r} in {expr}")
            continue
        labels = known[sel.metric]
        if labels is None:
            read_labels.add("*")
            continue
        read_labels |= labels
        unknown = sel.labels - labels - {"__name__"}
        if unknown:
            problems.append(f"{where}: {sel.metric} has no label(s) {sorted(unknown)} in {expr}")
    if "*" not in read_labels:
        unknown = grouping_labels(expr) - read_labels
        if unknown:
            problems.append(
                f"{where}: grouping by label(s) {sorted(unknown)} none of its metrics has: {expr}"
            )
    return problems


def test_every_panel_reads_exported_metrics_and_labels(dashboard_path, known_series):
    problems = []
    for title, ref, expr in panel_queries(dashboard_path):
        problems += check_reads(f"{title}/{ref}", expr, known_series)
    assert problems == []


def test_every_rule_reads_exported_metrics_and_labels(known_series):
    doc = yaml.safe_load(RULES_FILE.read_text(encoding="utf-8"))
    problems = []
    for group in doc["groups"]:
        for rule in group["rules"]:
            problems += check_reads(rule.get("alert") or rule["record"], rule["expr"], known_series)
    assert problems == []


def test_the_metric_check_catches_unknown_names_and_labels(known_series):
    assert check_reads("t", 'sum by (cluster) (fencewatch_alerts_total{cluster="a"})', known_series) == []
    assert check_reads("t", "rate(fencewatch_alert_total[5m])", known_series)
    assert check_reads("t", 'fencewatch_webhook_backlog{cluster="a"}', known_series)
    assert check_reads("t", "sum by (endpoint) (fencewatch_alerts_total)", known_series)
    assert check_reads("t", "fencewatch_batch_duration_seconds", known_series)  # histograms need a suffix


# ---- structure -----------------------------------------------------------------------------


def test_dashboard_is_valid_json_with_identity(dashboard_path):
    dashboard = load(dashboard_path)
    assert dashboard["uid"] and dashboard["title"]
    assert 36 <= dashboard["schemaVersion"] <= 41
    assert dashboard["panels"]


def test_panel_ids_are_unique_and_the_grid_has_no_overlap(dashboard_path):
    panels = list(iter_panels(load(dashboard_path)["panels"]))
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids)), ids
    taken: dict[tuple[int, int], str] = {}
    for panel in panels:
        grid = panel["gridPos"]
        assert all(isinstance(grid[k], int) and grid[k] >= 0 for k in "hwxy"), panel["title"]
        assert grid["w"] >= 1 and grid["h"] >= 1 and grid["x"] + grid["w"] <= 24, panel["title"]
        for x in range(grid["x"], grid["x"] + grid["w"]):
            for y in range(grid["y"], grid["y"] + grid["h"]):
                assert (x, y) not in taken, f"{panel['title']!r} overlaps {taken[(x, y)]!r}"
                taken[(x, y)] = panel["title"]


def test_panels_query_prometheus_through_the_datasource_variable(dashboard_path):
    for panel in iter_panels(load(dashboard_path)["panels"]):
        if panel["type"] == "row":
            continue
        assert panel.get("description"), f"{panel['title']!r} has no description"
        assert panel["datasource"] == DATASOURCE, panel["title"]
        refs = [t["refId"] for t in panel["targets"]]
        assert refs and len(refs) == len(set(refs)), panel["title"]
        for t in panel["targets"]:
            assert t["datasource"] == DATASOURCE and t["expr"].strip(), panel["title"]


def test_variables_datasource_and_cluster(dashboard_path):
    variables = {v["name"]: v for v in load(dashboard_path)["templating"]["list"]}
    ds = variables["datasource"]
    assert (ds["type"], ds["query"]) == ("datasource", "prometheus")
    cluster = variables["cluster"]
    assert cluster["type"] == "query"
    assert cluster["datasource"] == DATASOURCE
    assert cluster["definition"] == "label_values(fencewatch_events_total, cluster)"
    assert cluster["query"]["query"] == cluster["definition"]
    assert cluster["multi"] and cluster["includeAll"] and cluster["allValue"] == ".*"


def test_every_query_is_filtered_by_cluster_and_uses_grafana_intervals(dashboard_path):
    dashboard = load(dashboard_path)
    exprs = [(p["title"], t["expr"]) for p in iter_panels(dashboard["panels"]) for t in p.get("targets", [])]
    exprs += [(a["name"], a["expr"]) for a in dashboard["annotations"]["list"] if "expr" in a]
    assert exprs
    for title, expr in exprs:
        assert "$cluster" in expr, f"{title!r} ignores the cluster variable: {expr}"
        for window in re.findall(r"\[([^\]]*)\]", expr):
            # Fixed windows break at other zoom levels and scrape intervals.
            assert window in ("$__rate_interval", "$__range"), f"{title!r}: window [{window}] in {expr}"


def test_legends_name_labels_the_query_keeps(dashboard_path, known_series):
    for panel in iter_panels(load(dashboard_path)["panels"]):
        for t in panel.get("targets", []):
            legend_labels = set(re.findall(r"\{\{\s*(\w+)\s*\}\}", t.get("legendFormat", "")))
            assert legend_labels <= grouping_labels(t["expr"]), (panel["title"], t["legendFormat"])


def test_panel_queries_substitutes_every_variable(dashboard_path):
    queries = panel_queries(dashboard_path, cluster_regex="prod|staging", rate_interval="2m")
    targets = [t for p in iter_panels(load(dashboard_path)["panels"]) for t in p.get("targets", [])]
    assert len(queries) == len(targets)
    for _title, _ref, expr in queries:
        assert "$" not in expr and "[[" not in expr, expr
    assert any('cluster=~"prod|staging"' in expr for _, _, expr in queries)
    assert any("[2m]" in expr for _, _, expr in queries)
    with pytest.raises(KeyError):
        substitute("rate(x[$__unknown])", variable_values())


def test_every_query_is_valid_promql(dashboard_path, tmp_path):
    dashboard = load(dashboard_path)
    values = variable_values()
    exprs = [expr for _, _, expr in panel_queries(dashboard_path)]
    exprs += [substitute(a["expr"], values) for a in dashboard["annotations"]["list"] if "expr" in a]
    rules = {
        "groups": [
            {
                "name": "dashboard",
                "rules": [{"record": f"dashboard_query_{i}", "expr": e} for i, e in enumerate(exprs)],
            }
        ]
    }
    path = tmp_path / "dashboard.rules.yml"
    path.write_text(yaml.safe_dump(rules), encoding="utf-8")
    done = subprocess.run(
        [require_tool("promtool"), "check", "rules", str(path)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"{len(exprs)} rules found" in done.stdout


def test_the_promql_check_rejects_bad_promql(tmp_path):
    path = tmp_path / "bad.rules.yml"
    path.write_text(
        yaml.safe_dump({"groups": [{"name": "g", "rules": [{"record": "r", "expr": "sum by (x (y)"}]}]}),
        encoding="utf-8",
    )
    done = subprocess.run([require_tool("promtool"), "check", "rules", str(path)], capture_output=True)
    assert done.returncode != 0


# ---- provisioning --------------------------------------------------------------------------


def compose_service(name: str) -> dict[str, Any]:
    return yaml.safe_load(COMPOSE_FILE.read_text(encoding="utf-8"))["services"][name]


def test_datasource_provisioning_points_at_prometheus():
    doc = yaml.safe_load((PROVISIONING / "datasources" / "prometheus.yml").read_text(encoding="utf-8"))
    assert doc["apiVersion"] == 1
    (source,) = doc["datasources"]
    assert source["type"] == "prometheus" and source["isDefault"] is True
    assert source["url"] == "http://prometheus:9090"
    assert "9090" in compose_service("prometheus")["expose"]
    # $__rate_interval must know the scrape interval.
    scrape = yaml.safe_load(PROMETHEUS_CONFIG.read_text(encoding="utf-8"))["global"]["scrape_interval"]
    assert source["jsonData"]["timeInterval"] == scrape


def test_dashboard_provisioning_loads_the_mounted_dashboards():
    doc = yaml.safe_load((PROVISIONING / "dashboards" / "fencewatch.yml").read_text(encoding="utf-8"))
    assert doc["apiVersion"] == 1
    (provider,) = doc["providers"]
    assert provider["type"] == "file"
    folder = provider["options"]["path"]
    mounts = {}
    for volume in compose_service("grafana")["volumes"]:
        source, target, *_ = volume.split(":")
        mounts[target] = source
    assert mounts["/etc/grafana/provisioning"] == "./dashboards/grafana/provisioning"
    for dashboard in all_dashboards():
        target = f"{folder}/{dashboard.name}"
        assert (REPO_ROOT / mounts[target]).resolve() == dashboard, (
            f"{dashboard.name} is not mounted at {target}"
        )


# ---- the builder ---------------------------------------------------------------------------


def load_builder() -> Any:
    spec = importlib.util.spec_from_file_location("build_dashboards", BUILDER)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_json_on_disk_is_what_the_builder_makes():
    done = subprocess.run(
        [sys.executable, str(BUILDER), "--check"], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_builder_check_fails_on_a_stale_dashboard(tmp_path, monkeypatch, capsys):
    builder = load_builder()
    monkeypatch.setattr(builder, "GRAFANA_DIR", tmp_path)
    assert builder.main([]) == 0
    assert builder.main(["--check"]) == 0
    stale = tmp_path / "fencewatch-overview.json"
    stale.write_text(stale.read_text().replace("Violations by rule", "Violations"), encoding="utf-8")
    assert builder.main(["--check"]) == 1
    assert "is stale" in capsys.readouterr().err
