"""Alerts as people read them: one line with the status first
(detectors.render.alert_line), resolutions counted apart from violations in
every summary and in the ground-truth comparison, topic names and ISO-8601 UTC
times in messages, and an explanation for every unverified reason."""

from __future__ import annotations

import ast
import io
import re
from pathlib import Path

import orjson

from detectors.alerts import RESOLVED
from detectors.cluster import Counters
from detectors.engine import Detector
from detectors.envelope import envelope_from_obj
from detectors.render import alert_line
from detectors.stats import UNVERIFIED_EXPLANATIONS, UnverifiedReason
from detectors.truth import MATCH_FIELDS, confusion
from fencewatch.cli import main
from fencewatch.summaries import print_confusion, print_summary
from producers.simulator import SimConfig, Simulator
from tests.unit.test_end_to_end_native import summary_tables
from tests.unit.test_rules_quorum import OBSERVER, follow, lead, serve_fetch

DETECTORS = Path(__file__).resolve().parents[2] / "detectors"
ISO_UTC = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z"
EPOCH_MS = re.compile(r"\b1\d{12}\b")  # a raw epoch-milliseconds time (2001..2286)


def zombie_fires_then_resolves(quorum):
    """Leader 1 of epoch 5 still serves fetches 4.5 s after node 2 began epoch 6
    (past the grace window of each clock: clocks are not measured), then steps down."""
    lead(quorum, 1000, 1, 5)
    lead(quorum, 2000, 2, 6)
    serve_fetch(quorum, 6500, 1, 5, OBSERVER)
    follow(quorum, 7000, 1, 2, 6)
    return quorum.run()


def test_a_resolved_alert_renders_as_resolved_and_the_firing_one_as_firing(make_history):
    firing, resolved = (a.to_dict() for a in zombie_fires_then_resolves(make_history(standard=False)).alerts)
    assert alert_line(firing) == (
        "[FIRING critical] c1 QUORUM_ZOMBIE_LEADER node 1 at 1970-01-01T00:00:06.500Z: "
        "node 1 still acts as leader of epoch 5: node 2 has led epoch 6 since 1970-01-01T00:00:02.000Z"
    )
    assert alert_line(resolved) == (
        "[RESOLVED critical] c1 QUORUM_ZOMBIE_LEADER node 1 at 1970-01-01T00:00:07.000Z: "
        "node 1 stepped down as leader of epoch 5"
    )


def test_alert_line_is_one_line_and_names_the_partition_and_a_missing_status_fires():
    alert = {
        "rule": "PRODUCE_ACCEPTED_BY_NON_LEADER",
        "severity": "warning",
        "cluster": "prod",
        "topic": "orders",
        "topic_id": "qG8hUlWTTJ2eRb_bFvWRXg",
        "partition": 3,
        "node": 2,
        "ts_ms": 1763720022358,
        "message": "two\nlines",
    }
    assert alert_line(alert) == (
        "[FIRING warning] prod PRODUCE_ACCEPTED_BY_NON_LEADER orders-3 node 2 at 2025-11-21T10:13:42.358Z: "
        "two lines"
    )
    # Without a name the topic id is all there is to show.
    assert " qG8hUlWTTJ2eRb_bFvWRXg-3 " in alert_line({**alert, "topic": None})


def test_a_resolution_is_counted_apart_from_violations_in_the_summary(make_history):
    outcome = zombie_fires_then_resolves(make_history(standard=False))
    counters = outcome.counters
    assert counters.alerts_by_rule() == {"QUORUM_ZOMBIE_LEADER": 1}
    assert counters.alerts_by_rule(RESOLVED) == {"QUORUM_ZOMBIE_LEADER": 1}
    out = io.StringIO()
    print_summary(counters, 0, out)
    assert summary_tables(out.getvalue())["alerts: 1 violation and 1 resolution"] == {
        "violations": ["count"],
        "QUORUM_ZOMBIE_LEADER": ["1"],  # one row per rule name: the section below overwrote it
        "total violations": ["1"],
        "resolutions": ["count"],
        "total resolutions": ["1"],
    }
    rows = out.getvalue().split("alerts: ")[1].splitlines()
    assert [r.split() for r in rows[1:]] == [
        ["violations", "count"],
        ["QUORUM_ZOMBIE_LEADER", "1"],
        ["total", "violations", "1"],
        ["resolutions", "count"],
        ["QUORUM_ZOMBIE_LEADER", "1"],
        ["total", "resolutions", "1"],
    ]


def test_the_truth_comparison_counts_resolutions_apart_and_misses_one(make_history):
    alerts = [a.to_dict() for a in zombie_fires_then_resolves(make_history(standard=False)).alerts]
    truth = [{k: a[k] for k in MATCH_FIELDS} for a in alerts]
    table = confusion(alerts, truth)
    assert table == {
        ("QUORUM_ZOMBIE_LEADER", "firing"): {"tp": 1, "fp": 0, "fn": 0},
        ("QUORUM_ZOMBIE_LEADER", "resolved"): {"tp": 1, "fp": 0, "fn": 0},
    }
    out = io.StringIO()
    assert print_confusion(table, out)
    lines = [line.split() for line in out.getvalue().splitlines()[1:]]
    assert ["total", "violations", "1", "0", "0"] in lines
    assert ["total", "resolutions", "1", "0", "0"] in lines
    # The resolution missing from the detections is a missed resolution, not a missed violation.
    out = io.StringIO()
    assert not print_confusion(confusion(alerts[:1], truth), out)
    lines = [line.split() for line in out.getvalue().splitlines()[1:]]
    assert ["total", "violations", "1", "0", "0"] in lines
    assert ["total", "resolutions", "0", "0", "1"] in lines


def test_simulate_reports_violations_and_resolutions_as_its_truth_holds(tmp_path, capsys, monkeypatch):
    for name in ("FENCEWATCH_GRACE_MS",):
        monkeypatch.delenv(name, raising=False)
    events = tmp_path / "events.jsonl"
    args = ["simulate", "--seed", "3", "--events", "24000", "--fault-rate", "0.01"]
    assert main([*args, "--faults", "QUORUM_ZOMBIE_LEADER", "-o", str(events)]) == 0
    truth = [orjson.loads(line) for line in Path(f"{events}.truth.jsonl").read_text().splitlines()]
    fired = sum(t["status"] == "firing" for t in truth)
    resolved = sum(t["status"] == "resolved" for t in truth)
    assert fired and resolved, "no zombie leader injected and resolved: the test would show nothing"
    assert (
        f"injected {fired} violation{'s' * (fired != 1)} and {resolved} resolution{'s' * (resolved != 1)}; "
        f"violations: QUORUM_ZOMBIE_LEADER={fired}; resolutions: QUORUM_ZOMBIE_LEADER={resolved};"
    ) in capsys.readouterr().err


def test_messages_name_topics_and_give_times_in_iso_8601_utc():
    """Over a simulated cluster with faults of every rule: each alert about a
    partition names its topic by name in its message, never by id, and no
    message holds a raw epoch-milliseconds time."""
    sim = Simulator(SimConfig(seed=5, fault_rate=0.01, warmup_ms=5_000))
    detector = Detector(now_ms=lambda: 0)
    for i, raw in enumerate(sim.events(30_000)):
        detector.ingest(envelope_from_obj(raw, f"sim:{i}", i))
    detector.flush()
    alerts = detector.drain()
    partitioned = [a for a in alerts if a.partition is not None]
    assert len(partitioned) >= 10, "too few partition alerts: the test would show little"
    for alert in partitioned:
        assert alert.topic is not None
        assert f"{alert.topic}-{alert.partition}" in alert.message, alert.message
        # (A topic deleted before the event is known by its name alone.)
        assert alert.topic_id is None or alert.topic_id not in alert.message, alert.message
    assert sum(a.topic_id is not None for a in partitioned) >= 10
    for alert in alerts:
        assert not EPOCH_MS.search(alert.message), alert.message
    zombies = [a for a in alerts if a.rule == "QUORUM_ZOMBIE_LEADER" and " has led epoch " in a.message]
    assert zombies, "no zombie leader with a newer leader: the ISO time check would show nothing"
    for alert in zombies:
        assert re.search(rf" since {ISO_UTC}$", alert.message), alert.message


def test_every_unverified_reason_has_a_one_line_explanation_of_what_to_do():
    assert set(UNVERIFIED_EXPLANATIONS) == set(UnverifiedReason)
    for reason, text in UNVERIFIED_EXPLANATIONS.items():
        assert "\n" not in text and ": " in text, reason
        assert "ship" in text or "raise" in text, f"{reason}: says nothing about what to do"


def _reason_is_a_member(arg: ast.expr, constants: dict[str, ast.expr]) -> bool:
    """``UnverifiedReason.X``, a module constant bound to one, or ``exc.reason``
    passing on an Unverified raised with one."""
    if isinstance(arg, ast.Name) and arg.id in constants:
        arg = constants[arg.id]
    if isinstance(arg, ast.Attribute):
        return (
            isinstance(arg.value, ast.Name) and arg.value.id == "UnverifiedReason"
        ) or arg.attr == "reason"
    return False


def test_every_unverified_count_in_detectors_uses_a_reason_with_an_explanation():
    """A rule that counts a reason as a plain string, outside UnverifiedReason,
    would have no explanation in the summaries: this fails for it."""
    calls = []
    for path in sorted(DETECTORS.rglob("*.py")):
        tree = ast.parse(path.read_text())
        constants = {
            t.id: node.value
            for node in tree.body
            if isinstance(node, ast.Assign)
            for t in node.targets
            if isinstance(t, ast.Name)
        }
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call):
                continue
            name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
            if name in ("unverified", "Unverified") and node.args:
                calls.append((f"{path.name}:{node.lineno}", _reason_is_a_member(node.args[0], constants)))
    assert len(calls) >= 15, calls  # every rule, the view and the engine count reasons
    assert [where for where, ok in calls if not ok] == []


def test_the_summary_explains_each_unverified_reason_and_survives_an_unknown_one():
    counters = Counters(unverified={"unknown partition": 3, "a retired reason": 1})
    out = io.StringIO()
    print_summary(counters, 0, out)
    text = out.getvalue()
    assert "  unverified: unknown partition  3" in text
    assert (
        "  unknown partition: no metadata record for this partition before the request: ship the cluster's "
        "metadata log from its start (`fencewatch ship metadata-dump`) or a snapshot\n"
    ) in text
    assert "  a retired reason: a reason this release does not know" in text
