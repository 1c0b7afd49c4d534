"""Webhook bodies and pacing: pure functions, no HTTP (signatures: test_webhooks_signing.py)."""

from __future__ import annotations

import random
import re
from datetime import UTC, datetime
from typing import Any

import orjson
import pytest

from detectors.alerts import Alert, Evidence
from webhooks.pacing import TokenBucket, backoff_seconds, retry_after_seconds
from webhooks.payloads import ZERO_TIME, render, slack_text

TS_MS = 1_800_000_000_123
RFC3339 = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z$")


def spec_alert(status: str = "firing", **changes: Any) -> dict[str, Any]:
    """A SPEC 3 alert as the detector writes it (``Alert.to_dict``)."""
    fired = Evidence("view", "quorum_state", TS_MS - 60_000, 2, None, "quorum:7", "node 2 leads epoch 5")
    alert = Alert(
        alert_id="0123456789abcdef0123" if status == "firing" else "fedcba98765432100123",
        rule="QUORUM_ZOMBIE_LEADER",
        severity="critical",
        status=status,
        cluster="prod-eu-1",
        topic="orders",
        topic_id="qG8hUlWTTJ2eRb_bFvWRXg",
        partition=3,
        node=2,
        ts_ms=TS_MS,
        detected_ms=TS_MS + 500,
        message="node 2 still acts as leader of epoch 5",
        evidence=(fired,),
        links=("https://cwiki.apache.org/confluence/display/KAFKA/KIP-595",),
    ).to_dict()
    return {**alert, **changes}


def test_json_format_is_the_alert_dict_itself() -> None:
    alert = spec_alert()
    assert orjson.loads(render("json", alert, "hook")) == alert


def test_alertmanager_v4_payload_has_every_field_with_the_right_type() -> None:
    alert = spec_alert()
    body = orjson.loads(render("alertmanager", alert, "oncall", "http://am.example"))
    assert body["version"] == "4"
    assert isinstance(body["groupKey"], str) and body["groupKey"]
    assert body["truncatedAlerts"] == 0
    assert body["status"] == "firing"
    assert body["receiver"] == "oncall"
    assert body["groupLabels"] == {}
    assert body["externalURL"] == "http://am.example"
    [am] = body["alerts"]
    assert set(am) == {
        "status",
        "labels",
        "annotations",
        "startsAt",
        "endsAt",
        "generatorURL",
        "fingerprint",
    }
    assert am["status"] == "firing"
    assert am["labels"] == {
        "alertname": "QUORUM_ZOMBIE_LEADER",
        "rule": "QUORUM_ZOMBIE_LEADER",
        "severity": "critical",
        "cluster": "prod-eu-1",
        "topic": "orders",
        "partition": "3",
        "node": "2",
    }
    assert all(isinstance(v, str) for v in am["labels"].values())
    assert all(isinstance(v, str) for v in am["annotations"].values())
    assert am["annotations"]["summary"] == alert["message"]
    assert am["annotations"]["alert_id"] == alert["alert_id"]
    assert "KIP-595" in am["annotations"]["links"]
    assert am["annotations"]["description"] == (
        "[FIRING critical] prod-eu-1 QUORUM_ZOMBIE_LEADER orders-3 node 2 at 2027-01-15T08:00:00.123Z: "
        "node 2 still acts as leader of epoch 5"
    )
    assert RFC3339.match(am["startsAt"])
    starts = datetime.fromisoformat(am["startsAt"].replace("Z", "+00:00"))
    assert starts == datetime.fromtimestamp(TS_MS / 1000, UTC)
    assert am["endsAt"] == ZERO_TIME
    assert am["generatorURL"] == alert["links"][0]
    assert re.fullmatch(r"[0-9a-f]{16}", am["fingerprint"])
    assert body["commonLabels"] == am["labels"]
    assert body["commonAnnotations"] == am["annotations"]


def test_alertmanager_resolved_alert_ends_and_pairs_with_its_firing_alert() -> None:
    firing = orjson.loads(render("alertmanager", spec_alert("firing"), "oncall"))["alerts"][0]
    body = orjson.loads(render("alertmanager", spec_alert("resolved"), "oncall"))
    resolved = body["alerts"][0]
    assert body["status"] == resolved["status"] == "resolved"
    assert resolved["endsAt"] == datetime.fromtimestamp(TS_MS / 1000, UTC).isoformat(
        timespec="milliseconds"
    ).replace("+00:00", "Z")
    # It started when the evidence (the event that fired it) happened.
    assert resolved["startsAt"] < resolved["endsAt"]
    assert resolved["fingerprint"] == firing["fingerprint"]
    assert resolved["annotations"]["alert_id"] != firing["annotations"]["alert_id"]
    # A receiver that shows only the annotations still reads a resolution, not a second alert.
    assert resolved["annotations"]["description"].startswith("[RESOLVED critical] ")
    assert firing["annotations"]["description"].startswith("[FIRING critical] ")


def test_alertmanager_leaves_out_labels_of_missing_fields() -> None:
    alert = spec_alert(topic=None, topic_id=None, partition=None)
    labels = orjson.loads(render("alertmanager", alert, "x"))["alerts"][0]["labels"]
    assert "topic" not in labels and "partition" not in labels
    assert labels["node"] == "2"


def test_slack_text_is_one_readable_line() -> None:
    body = orjson.loads(render("slack", spec_alert(), "chat"))
    assert set(body) == {"text"}
    assert body["text"] == (
        "[FIRING critical] prod-eu-1 QUORUM_ZOMBIE_LEADER orders-3 node 2 at 2027-01-15T08:00:00.123Z: "
        "node 2 still acts as leader of epoch 5"
    )


def test_slack_text_escapes_markup_flattens_lines_and_marks_resolved() -> None:
    text = slack_text(spec_alert("resolved", message="epoch <5> & then\nmore"))
    assert "\n" not in text
    assert text.startswith("[RESOLVED critical] ")
    assert text.endswith("epoch &lt;5&gt; &amp; then more")


class TopOfRange(random.Random):
    """Draws the upper bound of every range: the jitter ceiling shows."""

    def uniform(self, a: float, b: float) -> float:
        return b


def test_backoff_ceiling_doubles_per_failure_up_to_the_cap() -> None:
    ceilings = [backoff_seconds(n, 1.0, 60.0, TopOfRange()) for n in range(1, 10)]
    assert ceilings == [1, 2, 4, 8, 16, 32, 60, 60, 60]
    # Very long outages neither overflow nor exceed the cap.
    assert backoff_seconds(5000, 1.0, 60.0, TopOfRange()) == 60.0


def test_backoff_is_jittered_within_zero_and_the_ceiling() -> None:
    rng = random.Random(7)
    for n in range(1, 12):
        ceiling = min(30.0, 0.5 * 2 ** (n - 1))
        draws = [backoff_seconds(n, 0.5, 30.0, rng) for _ in range(200)]
        assert all(0.0 <= d <= ceiling for d in draws)
        # Full jitter spreads over the whole range, not just near the ceiling.
        assert min(draws) < ceiling * 0.2 and max(draws) > ceiling * 0.8


def test_token_bucket_allows_a_burst_then_the_rate() -> None:
    bucket = TokenBucket(rate_per_second=2.0, burst=3, now=100.0)
    assert [bucket.take(100.0) for _ in range(3)] == [0.0, 0.0, 0.0]
    assert bucket.take(100.0) == pytest.approx(0.5)
    assert bucket.take(100.25) == pytest.approx(0.25)
    assert bucket.take(100.5) == 0.0
    # A long pause refills only up to the burst.
    assert [bucket.take(1000.0) for _ in range(4)][-1] > 0


def test_retry_after_accepts_seconds_and_http_dates() -> None:
    now = datetime(2027, 1, 15, 8, 0, 0, tzinfo=UTC).timestamp()
    assert retry_after_seconds("120", now, 300.0) == 120.0
    assert retry_after_seconds("Fri, 15 Jan 2027 08:01:30 GMT", now, 300.0) == 90.0
    assert retry_after_seconds("Fri, 15 Jan 2027 07:00:00 GMT", now, 300.0) == 0.0
    assert retry_after_seconds("soon", now, 300.0) is None
    assert retry_after_seconds(None, now, 300.0) is None
