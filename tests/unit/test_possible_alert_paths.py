"""Every path an alert takes shows a possible violation otherwise than a
certain one: the JSON line replay prints, its one-line rendering, the incident
report and its timeline, the Prometheus metrics, the webhook payloads and the
alerts topic's row. (The Grafana panel and the Prometheus rules:
test_dashboards.py and dashboards/prometheus/tests/fencewatch.rules.test.yml.)

The two alerts are the sparse incident's (test_possible_violations.py): the
stale StopReplica as a possible violation, and as a certain one with a clock
bound of 200 ms."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from prometheus_client import CollectorRegistry
from test_possible_violations import BROKER, MEASURED, sparse_incident

from detectors.alerts import Alert
from detectors.config import ALL_NODES, DetectorConfig
from detectors.engine import Detector
from detectors.render import alert_line
from incidents.page import IncidentReport
from incidents.timelines import from_evidence
from streaming.metrics import Metrics
from streaming.schema import alert_row
from webhooks.payloads import render

BOUNDED = DetectorConfig(measure_clocks=True, clock_bounds=((ALL_NODES, 200),))


def _run(make_history: Any, config: DetectorConfig) -> tuple[Alert, Detector]:
    outcome = sparse_incident(make_history(config)).run()
    [alert] = [a for a in outcome.alerts if a.rule == "STOP_REPLICA_STALE_EPOCH_APPLIED"]
    return alert, outcome.detector


@pytest.fixture
def possible(make_history: Any) -> tuple[Alert, Detector]:
    return _run(make_history, MEASURED)


@pytest.fixture
def certain(make_history: Any) -> tuple[Alert, Detector]:
    return _run(make_history, BOUNDED)


def test_the_json_line_carries_confidence_and_the_condition(possible, certain):
    p, c = possible[0].to_dict(), certain[0].to_dict()
    assert (p["confidence"], p["severity"]) == ("possible", "info")
    assert p["clock_condition"]["holds_ms"] == [[-1000, 1998]]
    assert (c["confidence"], c["severity"], c["clock_condition"]) == ("certain", "critical", None)
    assert p["alert_id"] != c["alert_id"]


def test_the_one_line_rendering_says_possible(possible, certain):
    p, c = alert_line(possible[0].to_dict()), alert_line(certain[0].to_dict())
    assert p.startswith("[FIRING info POSSIBLE] c1 STOP_REPLICA_STALE_EPOCH_APPLIED orders-0 node 3 ")
    assert "(possible: holds if node 3's clock is at most 1.998 s ahead of the metadata log's" in p
    assert c.startswith("[FIRING critical] c1 STOP_REPLICA_STALE_EPOCH_APPLIED orders-0 node 3 ")
    assert "possible" not in c.lower()


def test_the_incident_report_marks_the_possible_one_and_writes_its_condition_on_the_timeline(
    possible, certain
):
    report = IncidentReport(title="t", grace_ms=MEASURED.grace_ms)
    for alert, _ in (possible, certain):
        record = alert.to_dict()
        report.add(record, lambda record=record: from_evidence(record, MEASURED.grace_ms))
    page = report.html()
    condition = possible[0].condition
    assert condition is not None
    sections = 'data-rule="STOP_REPLICA_STALE_EPOCH_APPLIED" data-confidence='
    assert page.count(f'{sections}"possible"') == 1 and page.count(f'{sections}"certain"') == 1
    assert f'<p class="possible">Possible violation: it {condition.text}.' in page.replace("&#x27;", "'")
    # The chart's own annotation (the timeline's spec is JSON inside the page).
    assert f'"text":"POSSIBLE: {condition.text}"' in page.replace("\\u0027", "'")
    # The summary counts it among the rule's firing alerts, and as possible.
    assert '<td class="sev info">info</td><td class="firing">1</td><td class="possible">1</td>' in page
    assert (
        '<td class="sev critical">critical</td><td class="firing">1</td><td class="possible">0</td>' in page
    )


def test_the_metrics_carry_a_confidence_label(possible, certain):
    metrics = Metrics(CollectorRegistry())
    merged = possible[1].snapshot("c1")
    bounded = certain[1].snapshot("c1")
    metrics.detector.update({**merged, "alerts": bounded["alerts"], "cluster": "c1"})
    value = metrics.registry.get_sample_value
    labels = {"cluster": "c1", "rule": "STOP_REPLICA_STALE_EPOCH_APPLIED", "status": "firing"}
    assert value("fencewatch_alerts_total", {**labels, "severity": "info", "confidence": "possible"}) == 1
    assert value("fencewatch_alerts_total", {**labels, "severity": "critical", "confidence": "certain"}) == 1


def test_a_contradicted_clock_bound_is_a_metric_and_a_log_line_once(make_history, caplog):
    detector = _run(make_history, DetectorConfig(measure_clocks=True, clock_bounds=((BROKER, 200),)))[1]
    cs = detector.cluster("c1")
    assert cs.bound_contradicted == {}  # the broker's -1..+4 s allows 200 ms
    cs.bound_contradicted[BROKER] = [2900.0, 3100.0, 200.0]
    metrics = Metrics(CollectorRegistry())
    metrics.detector.update(detector.snapshot("c1"))
    value = metrics.registry.get_sample_value
    assert value("fencewatch_clock_bound_contradicted", {"cluster": "c1", "node": "3"}) == 1
    metrics.detector.update(detector.snapshot("c1"))
    said = [r.getMessage() for r in caplog.records if "contradicts --clock-bound-ms" in r.getMessage()]
    assert said == [
        "cluster c1: node 3's clock evidence (offset 2900..3100 ms against the metadata log's) contradicts "
        "--clock-bound-ms 200 given for it: the bound is wrong or the clock broke; verdicts use the evidence"
    ]


def test_the_webhook_payloads_tell_them_apart(possible, certain):
    p, c = possible[0].to_dict(), certain[0].to_dict()
    assert orjson.loads(render("json", p, "hook"))["confidence"] == "possible"
    assert orjson.loads(render("json", c, "hook"))["confidence"] == "certain"
    [am_p] = orjson.loads(render("alertmanager", p, "hook"))["alerts"]
    [am_c] = orjson.loads(render("alertmanager", c, "hook"))["alerts"]
    assert am_p["labels"]["confidence"] == "possible" and am_p["labels"]["severity"] == "info"
    assert am_p["annotations"]["clock_condition"] == p["clock_condition"]["text"]
    # A certain alert's labels (and so its fingerprint) are those it always had.
    assert "confidence" not in am_c["labels"] and "clock_condition" not in am_c["annotations"]
    assert orjson.loads(render("slack", p, "hook"))["text"].startswith("[FIRING info POSSIBLE]")
    assert orjson.loads(render("slack", c, "hook"))["text"].startswith("[FIRING critical]")


def test_the_alerts_topic_row_carries_the_marking(possible, certain):
    p, c = alert_row(possible[0]), alert_row(certain[0])
    assert orjson.loads(p["payload"])["confidence"] == "possible"
    assert orjson.loads(p["payload"])["clock_condition"]["text"] == possible[0].condition.text
    assert orjson.loads(c["payload"])["confidence"] == "certain"
