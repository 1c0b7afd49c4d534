"""The outbox file: a first-release outbox opens and keeps working (its dropped
rows become parked ones), parked rows are never pruned, and a resend makes them
pending again with a fresh start."""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

import orjson
import pytest
from prometheus_client import CollectorRegistry

from streaming.metrics import Metrics
from webhooks import Dispatcher, Endpoint
from webhooks.outbox import DELIVERED, PARKED, PENDING, Answer, Outbox, OutboxError
from webhooks.receiver import WebhookReceiver

# The first release's table, as it created it (schema version 0).
FIRST_RELEASE_SCHEMA = (
    """
CREATE TABLE IF NOT EXISTS outbox (
    seq INTEGER PRIMARY KEY,
    endpoint TEXT NOT NULL,
    alert_id TEXT NOT NULL,
    alert TEXT NOT NULL,
    state TEXT NOT NULL,
    enqueued_at REAL NOT NULL,
    next_attempt_at REAL NOT NULL,
    attempts INTEGER NOT NULL DEFAULT 0,
    last_error TEXT,
    finished_at REAL,
    UNIQUE (endpoint, alert_id)
)""",
    "CREATE INDEX IF NOT EXISTS outbox_due ON outbox (endpoint, state, next_attempt_at)",
    "CREATE INDEX IF NOT EXISTS outbox_finished ON outbox (state, finished_at)",
)
# (alert_id, state, attempts, last_error) as the first release left them.
FIRST_RELEASE_ROWS = [
    ("a-pending", "pending", 3, "ConnectError: [Errno 111] Connection refused"),
    ("a-delivered", "delivered", 1, None),
    ("a-too-old", "dropped", 7, "max age"),
    ("a-rejected", "dropped", 1, "HTTP 400 bad payload (a client error: not retried)"),
    ("a-redirected", "dropped", 1, "HTTP 302 (redirects are not followed: configure the final URL)"),
]


def alert(alert_id: str) -> dict[str, object]:
    return {"alert_id": alert_id, "rule": "QUORUM_ZOMBIE_LEADER", "severity": "critical", "status": "firing"}


def first_release_outbox(path: Path, now: float) -> None:
    with sqlite3.connect(path) as conn:
        for statement in FIRST_RELEASE_SCHEMA:
            conn.execute(statement)
        conn.executemany(
            "INSERT INTO outbox (endpoint, alert_id, alert, state, enqueued_at, next_attempt_at, attempts,"
            " last_error, finished_at) VALUES ('oncall', ?, ?, ?, ?, ?, ?, ?, ?)",
            [
                (
                    i,
                    orjson.dumps(alert(i)).decode(),
                    state,
                    now - 60,
                    now - 1,
                    n,
                    error,
                    None if state == "pending" else now - 30,
                )
                for i, state, n, error in FIRST_RELEASE_ROWS
            ],
        )
    conn.close()


def test_a_first_release_outbox_opens_its_dropped_rows_parked_and_keeps_delivering(tmp_path: Path) -> None:
    path = tmp_path / "old.sqlite"
    now = time.time()
    first_release_outbox(path, now)
    receiver = WebhookReceiver(0)
    try:
        metrics = Metrics(CollectorRegistry())
        dispatcher = Dispatcher([Endpoint("oncall", receiver.url("/hook"))], path, metrics)
        try:
            assert dispatcher.outbox.states("oncall") == {
                "a-pending": PENDING,
                "a-delivered": DELIVERED,
                "a-too-old": PARKED,
                "a-rejected": PARKED,
                "a-redirected": PARKED,
            }
            parked = {row.alert_id: row for row in dispatcher.outbox.parked("oncall")}
            assert {i: row.reason for i, row in parked.items()} == {
                "a-too-old": "max_age",
                "a-rejected": "rejected",
                "a-redirected": "redirect",
            }
            assert parked["a-rejected"].last_error == "HTTP 400 bad payload (a client error: not retried)"
            assert (parked["a-too-old"].attempts, parked["a-too-old"].rule) == (7, "QUORUM_ZOMBIE_LEADER")
            assert metrics.registry.get_sample_value("fencewatch_webhook_parked", {"endpoint": "oncall"}) == 3
            # The pending row goes out; the others de-duplicate a re-run batch as before.
            assert dispatcher.deliver_due() == 1
            assert [r["body"]["alert_id"] for r in receiver.received] == ["a-pending"]
            assert dispatcher.enqueue([alert(i) for i, *_ in FIRST_RELEASE_ROWS]) == 0
            assert dispatcher.outbox.resend(now, "oncall", ["a-rejected"]) == [("oncall", "a-rejected")]
            assert dispatcher.deliver_due() == 1
        finally:
            dispatcher.stop()
    finally:
        receiver.stop()
    # Migrated once: opening it again changes nothing.
    again = Outbox(path, create=False)
    try:
        assert again.states("oncall")["a-rejected"] == DELIVERED
        assert len(again.parked()) == 2
    finally:
        again.close()
    with sqlite3.connect(path) as conn:
        assert conn.execute("PRAGMA user_version").fetchone() == (1,)
        assert conn.execute("PRAGMA integrity_check").fetchone() == ("ok",)
    conn.close()


def test_an_outbox_from_a_newer_release_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "newer.sqlite"
    Outbox(path).close()
    with sqlite3.connect(path) as conn:
        conn.execute("PRAGMA user_version = 99")
    conn.close()
    with pytest.raises(OutboxError, match="newer fencewatch"):
        Outbox(path)


def test_without_create_a_missing_file_or_another_database_is_refused(tmp_path: Path) -> None:
    with pytest.raises(OutboxError, match="no outbox at"):
        Outbox(tmp_path / "missing.sqlite", create=False)
    assert not (tmp_path / "missing.sqlite").exists()
    other = tmp_path / "other.sqlite"
    with sqlite3.connect(other) as conn:
        conn.execute("CREATE TABLE t (x)")
    conn.close()
    with pytest.raises(OutboxError, match="not a fencewatch webhook outbox"):
        Outbox(other, create=False)
    text = tmp_path / "text.sqlite"
    text.write_text("not a database at all, just text that is long enough to have a header")
    with pytest.raises(OutboxError, match="not a usable webhook outbox"):
        Outbox(text, create=False)


def test_pruning_deletes_delivered_rows_only_never_parked_ones(tmp_path: Path) -> None:
    outbox = Outbox(tmp_path / "prune.sqlite")
    try:
        outbox.add(
            [("oncall", i, orjson.dumps(alert(i)).decode()) for i in ("done", "parked", "waiting")], 0.0
        )
        seqs = {e.alert_id: e.seq for e in outbox.due("oncall", 0.0, 10)}
        outbox.delivered(seqs["done"], 1.0)
        outbox.park(seqs["parked"], "rejected", Answer("HTTP 404 gone", 404, "gone"), 1.0)
        assert outbox.prune(finished_before=1e12) == 1
        assert outbox.states("oncall") == {"parked": PARKED, "waiting": PENDING}
    finally:
        outbox.close()


def test_a_resent_row_starts_afresh_and_keeps_its_record(tmp_path: Path) -> None:
    outbox = Outbox(tmp_path / "resend.sqlite")
    try:
        rows = [(name, i, orjson.dumps(alert(i)).decode()) for name in ("a", "b") for i in ("x", "y")]
        outbox.add(rows, 0.0)
        for entry in outbox.due("a", 0.0, 10) + outbox.due("b", 0.0, 10):
            outbox.park(entry.seq, "max_age", Answer("HTTP 500 boom", 500, "boom"), 100.0)
        assert outbox.resend(5000.0, "a", ["y", "nope"]) == [("a", "y")]
        assert outbox.states("a") == {"x": PARKED, "y": PENDING}
        (entry,) = outbox.due("a", 5000.0, 10)
        assert (entry.alert_id, entry.failures, entry.attempts, entry.enqueued_at) == ("y", 0, 1, 5000.0)
        assert outbox.resend(6000.0) == [("a", "x"), ("b", "x"), ("b", "y")]
        assert outbox.parked() == []
    finally:
        outbox.close()
