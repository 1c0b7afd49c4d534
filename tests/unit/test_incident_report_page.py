"""The incident report without a browser: the timeline gathered from a real
Detector's view, the page's summary, cap and escaping, the alerts-topic
record checks, and the ``--report`` option's refusals. The page in Chromium:
tests/integration/test_incident_report.py."""

from __future__ import annotations

from typing import Any

from plotly.offline import get_plotlyjs
from test_option_paths import fencewatch
from test_rules_remote import elect_broker_2, update, upload

from detectors.engine import Detector
from incidents.alert_records import not_an_alert
from incidents.page import IncidentReport, Timeline
from incidents.timelines import FROM_EVIDENCE, FROM_VIEW, from_detector, from_evidence
from producers import shapes as s

GRACE_MS = 2000


def gathered(history: Any) -> list[tuple[dict[str, Any], Timeline]]:
    """Replay's loop: each alert's timeline gathered as it leaves the detector."""
    detector = Detector(history.config, now_ms=lambda: 1_800_000_000_000)
    out = []
    for env in history.envelopes:
        detector.ingest(env)
        out += [(a.to_dict(), from_detector(detector, a.to_dict())) for a in detector.drain()]
    detector.flush()
    out += [(a.to_dict(), from_detector(detector, a.to_dict())) for a in detector.drain()]
    return out


def spans_at(timeline: Timeline, lane: str, ts_ms: int) -> set[str]:
    return {sp.state for sp in timeline.spans if sp.lane == lane and sp.start_ms <= ts_ms < sp.end_ms}


def test_a_partition_timeline_shows_the_view_the_rule_judged(cluster):
    """Broker 3 leaves the ISR at 5000, is fenced at 6000 and is added back at
    7000 (ISR_INELIGIBLE_REPLICA_ADMITTED): its lane shows it out of the ISR,
    then in it, fenced throughout the violation; the records are marked."""
    cluster.change(5000, isr=[1, 2])
    cluster.metadata(6000, s.broker_change(3, 12, fenced=1))
    cluster.change(7000, isr=[1, 2, 3])
    [(alert, timeline)] = gathered(cluster)
    assert alert["rule"] == "ISR_INELIGIBLE_REPLICA_ADMITTED"
    assert timeline.source == FROM_VIEW
    assert timeline.lo_ms < 5000 and timeline.hi_ms > 7000 + GRACE_MS
    assert (timeline.violation_ms, timeline.grace_ms) == (7000, GRACE_MS)
    assert timeline.lanes == ("node 1", "node 2", "node 3", "metadata log")
    assert spans_at(timeline, "node 1", 7000) == {"leader"}
    assert spans_at(timeline, "node 3", 5500) == {"replica, out of ISR"}
    assert spans_at(timeline, "node 3", 6500) == {"replica, out of ISR", "fenced"}
    assert spans_at(timeline, "node 3", 7000) == {"in ISR", "fenced"}
    assert spans_at(timeline, "node 2", 7000) == {"in ISR"}
    # feature level 21 (3.9): ISR changes bump no leader epoch
    assert {step.epoch for step in timeline.epochs} == {0}
    marks = {(m.lane, m.ts_ms, m.role) for m in timeline.marks}
    assert {
        ("metadata log", 5000, "record"),
        ("node 3", 6000, "record"),
        ("metadata log", 6000, "view"),  # the evidence names no node: a metadata record
        ("metadata log", 7000, "violation"),
    } <= marks


def test_a_leader_change_steps_the_leader_epoch(cluster):
    """A new leader (epoch 1) then a produce accepted by the old leader with the
    old epoch: the epoch line steps 0 -> 1 where the change record is."""
    cluster.change(5000, leader=2)
    cluster.request(8000, 1, s.produce(cluster.topic, 0, 0, epoch=0))
    alerts = gathered(cluster)
    assert alerts, "the stale produce must alert"
    for _, timeline in alerts:
        steps = [(step.ts_ms, step.epoch) for step in timeline.epochs]
        assert steps[0][1] == 0 and (5000, 1) in steps
        assert spans_at(timeline, "node 2", 8000) == {"leader"}
        assert spans_at(timeline, "node 1", 8000) == {"in ISR"}


def alert(
    rule: str = "PRODUCE_STALE_EPOCH_ACCEPTED", severity: str = "warning", **changes: Any
) -> dict[str, Any]:
    base = {
        "alert_id": f"id-{rule}-{changes.get('ts_ms', 1000)}",
        "rule": rule,
        "severity": severity,
        "status": "firing",
        "cluster": "c1",
        "topic": "orders",
        "topic_id": None,
        "partition": 0,
        "node": 2,
        "ts_ms": 1000,
        "detected_ms": 9000,
        "message": "broker 2 accepted it",
        "evidence": [
            {
                "role": "view",
                "kind": "metadata",
                "ts_ms": 400,
                "node": None,
                "offset": 7,
                "position": "f:1",
                "summary": "partition changed",
            },
            {
                "role": "violation",
                "kind": "request",
                "ts_ms": 1000,
                "node": 2,
                "offset": None,
                "position": "f:2",
                "summary": "accepted",
            },
        ],
        "links": ["https://cwiki.apache.org/confluence/display/KAFKA/KIP-359%3A+Verify+leader+epoch"],
    }
    return {**base, **changes}


def test_an_evidence_timeline_places_each_event_on_its_lane():
    timeline = from_evidence(alert(), GRACE_MS)
    assert timeline.source == FROM_EVIDENCE
    assert [(m.lane, m.ts_ms, m.role) for m in timeline.marks] == [
        ("metadata log", 400, "view"),
        ("node 2", 1000, "violation"),
    ]
    assert timeline.lanes == ("node 2", "metadata log")
    assert timeline.lo_ms < 1000 - GRACE_MS and timeline.hi_ms > 1000 + GRACE_MS


def test_a_node_s_events_are_drawn_in_the_metadata_log_s_clock_with_the_correction_said():
    """Broker 2's clock measured 2.9-3.1 s ahead: its violation, stamped 4000 by
    its clock, is drawn at 1000 in the metadata log's clock, and says so; the
    clock evidence itself is no event of its own."""
    clock = {
        "role": "clock",
        "kind": "clock",
        "ts_ms": 4000,
        "node": 2,
        "offset": None,
        "position": "f:2",
        "summary": "node 2's clock is 2.9-3.1 s ahead of the metadata log's",
        "offset_low_ms": 2900,
        "offset_high_ms": 3100,
    }
    base = alert()
    violation = {**base["evidence"][1], "ts_ms": 4000}
    timeline = from_evidence(
        {**base, "ts_ms": 4000, "evidence": [base["evidence"][0], clock, violation]}, GRACE_MS
    )
    assert [(m.lane, m.ts_ms, m.role) for m in timeline.marks] == [
        ("metadata log", 400, "view"),
        ("node 2", 1000, "violation"),
    ]
    assert timeline.violation_ms == 1000
    assert "moved -3000 ms into the metadata log's clock (its offset measured 2900..3100 ms)" in (
        timeline.marks[1].text
    )
    assert timeline.hi_ms < 4000 + GRACE_MS  # the window follows the corrected times


def test_the_page_counts_every_alert_and_draws_the_first_of_each_rule():
    report = IncidentReport(title="t", grace_ms=GRACE_MS, max_per_rule=2)
    gathered_for: list[int] = []

    def gather(a: dict[str, Any]) -> Timeline:
        gathered_for.append(a["ts_ms"])
        return from_evidence(a, GRACE_MS)

    alerts = [alert(ts_ms=1000 + i) for i in range(5)]
    alerts += [
        alert("LEADER_INELIGIBLE_ELECTED", "critical", status=status, ts_ms=2000 + i)
        for i, status in enumerate(["firing", "resolved"])
    ]
    for a in alerts:
        report.add(a, lambda a=a: gather(a))
    assert gathered_for == [1000, 1001, 2000, 2001]  # gathering costs: only for drawn alerts
    assert report.total == 7 and report.not_drawn("PRODUCE_STALE_EPOCH_ACCEPTED") == 3
    page = report.html()
    assert page.count('<section class="alert-timeline"') == 4
    assert page.count('class="timeline-chart"') == 4 and page.count('-spec">{"data":') == 4
    assert '<p class="left-out" data-rule="PRODUCE_STALE_EPOCH_ACCEPTED">3 more alerts' in page
    # the most severe rule first, with its firing and resolved counts
    assert page.index('data-rule="LEADER_INELIGIBLE_ELECTED" data-severity="critical"') < page.index(
        'data-rule="PRODUCE_STALE_EPOCH_ACCEPTED" data-severity="warning"'
    )
    assert '<td class="firing">5</td><td class="possible">0</td><td class="resolved">0</td>' in page
    assert '<td class="firing">1</td><td class="possible">0</td><td class="resolved">1</td>' in page
    assert ">KIP-359</a>" in page


def test_the_page_inlines_plotly_once_and_loads_nothing():
    report = IncidentReport(title="t", grace_ms=GRACE_MS)
    for i in range(3):
        a = alert(ts_ms=1000 + i)
        report.add(a, lambda a=a: from_evidence(a, GRACE_MS))
    page = report.html()
    assert page.count(get_plotlyjs()) == 1
    assert "<script src" not in page and "cdn.plot.ly" not in page.replace(get_plotlyjs(), "")


def test_what_the_alert_says_is_escaped():
    hostile = alert(message="<script>alert(1)</script>", cluster="c&<b>")
    report = IncidentReport(title="<i>t</i>", grace_ms=GRACE_MS)
    report.add(hostile, lambda: from_evidence(hostile, GRACE_MS))
    page = report.html().replace(get_plotlyjs(), "")
    assert "<script>alert(1)" not in page and "&lt;script&gt;alert(1)" in page
    assert "<i>t</i>" not in page and "c&amp;&lt;b&gt;" in page


def test_each_alert_is_headed_by_its_one_line_rendering():
    resolved = alert(status="resolved", ts_ms=1763720011202)
    report = IncidentReport(title="t", grace_ms=GRACE_MS)
    report.add(resolved, lambda: from_evidence(resolved, GRACE_MS))
    assert (
        '<h3 class="sev warning">[RESOLVED warning] c1 PRODUCE_STALE_EPOCH_ACCEPTED orders-0 node 2 at '
        "2025-11-21T10:13:31.202Z: broker 2 accepted it</h3>"
    ) in report.html()


def test_records_that_are_not_alerts_are_named():
    assert not_an_alert(alert()) is None
    assert not_an_alert(b"\xff") == "not a JSON object"
    assert not_an_alert([1]) == "not a JSON object"
    assert not_an_alert({"rule": "X"}) == "no alert_id, severity, ts_ms, detected_ms, message"
    assert not_an_alert(alert(ts_ms="1")) == "ts_ms and detected_ms must be integers"
    assert not_an_alert(alert(alert_id=["x"])) == "alert_id, rule, severity and message must be strings"
    assert not_an_alert(alert(status="pending")) == "status must be one of firing, resolved"
    assert not_an_alert(alert(node="2")) == "node and partition must be integers or null"
    assert not_an_alert(alert(links="KIP-359")) == "links must be a list of strings"
    bad_evidence = (
        "evidence must be a list of objects with an integer ts_ms, and node and offset integers or null"
    )
    assert not_an_alert(alert(evidence=[{"ts_ms": None}])) == bad_evidence
    assert not_an_alert(alert(evidence=[{"ts_ms": 1, "node": "x"}])) == bad_evidence


def test_replay_refuses_a_report_path_it_cannot_write_before_any_work(tmp_path):
    events = tmp_path / "e.jsonl"
    events.write_text("")
    missing_dir = tmp_path / "no-such-dir" / "r.html"
    result = fencewatch(["replay", "--report", str(missing_dir), str(events)], tmp_path)
    assert result.returncode == 1 and result.stdout == ""
    assert result.stderr.startswith(f"fencewatch replay: cannot write --report {missing_dir}")
    result = fencewatch(["replay", "--report", "-", str(events)], tmp_path)
    assert result.returncode == 1
    assert "fencewatch replay: --report - would mix the page with the alerts on stdout" in result.stderr


def test_a_remote_segment_timeline_marks_the_partitions_finished_uploads(cluster):
    """A zombie upload (REMOTE_SEGMENT_ZOMBIE_UPLOAD_ACCEPTED): the remote log
    lane marks when each of the partition's tracked segments finished copying,
    read from the partition's segments in the detector."""
    elect_broker_2(cluster)
    upload(cluster, 9000, "seg-1", 1, {0: 123})
    upload(cluster, 11_000, "seg-2", 2, {0: 100, 1: 155})
    update(cluster, 11_300, "seg-2", 2, "COPY_SEGMENT_FINISHED")
    update(cluster, 11_400, "seg-1", 1, "COPY_SEGMENT_FINISHED")
    [(alert, timeline)] = gathered(cluster)
    assert alert["rule"] == "REMOTE_SEGMENT_ZOMBIE_UPLOAD_ACCEPTED"
    uploads = sorted(
        (m.ts_ms, m.text.split(" (")[0]) for m in timeline.marks if m.text.startswith("segment ")
    )
    assert uploads == [
        (11_300, "segment seg-2 upload by broker 2 finished"),
        (11_400, "segment seg-1 upload by broker 1 finished"),
    ]
    assert {m.lane for m in timeline.marks if m.text.startswith("segment ")} == {"remote log metadata"}
