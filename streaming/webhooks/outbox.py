"""The durable outbox: one SQLite row per (endpoint, alert_id).

A row is ``pending`` until it is ``delivered`` or ``dropped`` (too old, or
rejected for good). Finished rows stay for ``retention`` so that the job, which
re-runs a micro-batch after a crash and so enqueues the same alerts again,
finds them and adds nothing: ``INSERT OR IGNORE`` on the primary key makes
enqueueing idempotent. Attempts and the next-attempt time are stored too, so a
restarted job resumes retries where the old one left off.

All times are Unix seconds (wall clock: they must mean the same after a
restart). Every write commits before it returns. One connection is shared by
the dispatcher's threads, behind a lock; SQLite's WAL journal lets another
process read the file meanwhile.
"""

from __future__ import annotations

import os
import sqlite3
import threading
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import orjson

PENDING = "pending"
DELIVERED = "delivered"
DROPPED = "dropped"

_SCHEMA = (
    """
CREATE TABLE IF NOT EXISTS outbox (
    seq INTEGER PRIMARY KEY,          -- enqueue order: delivery is first in, first out
    endpoint TEXT NOT NULL,
    alert_id TEXT NOT NULL,
    alert TEXT NOT NULL,              -- the SPEC 3 alert JSON
    state TEXT NOT NULL,              -- pending | delivered | dropped
    enqueued_at REAL NOT NULL,
    next_attempt_at REAL NOT NULL,
    attempts INTEGER NOT NULL DEFAULT 0,
    last_error TEXT,
    finished_at REAL,                 -- when it was delivered or dropped
    UNIQUE (endpoint, alert_id)
)""",
    "CREATE INDEX IF NOT EXISTS outbox_due ON outbox (endpoint, state, next_attempt_at)",
    "CREATE INDEX IF NOT EXISTS outbox_finished ON outbox (state, finished_at)",
)


@dataclass(frozen=True, slots=True)
class Entry:
    """One pending delivery: ``attempts`` failed attempts so far."""

    seq: int
    endpoint: str
    alert_id: str
    alert: dict[str, Any]
    attempts: int
    enqueued_at: float


class Outbox:
    """The outbox file at ``path``, created on first use."""

    def __init__(self, path: str | os.PathLike[str]):
        self.path = os.fspath(path)
        os.makedirs(os.path.dirname(os.path.abspath(self.path)), exist_ok=True)
        self._lock = threading.Lock()
        # isolation_level=None: transactions are explicit, so each write is one
        # BEGIN IMMEDIATE ... COMMIT and nothing is left open between calls.
        self._conn = sqlite3.connect(self.path, timeout=30.0, isolation_level=None, check_same_thread=False)
        self._conn.execute("PRAGMA journal_mode=WAL")
        # FULL: a committed enqueue survives a power cut, not just a crash of the job.
        self._conn.execute("PRAGMA synchronous=FULL")
        with self._write():
            # Not executescript: it commits first, outside the transaction.
            for statement in _SCHEMA:
                self._conn.execute(statement)

    def _write(self) -> _Transaction:
        return _Transaction(self._conn, self._lock)

    def add(self, rows: Iterable[tuple[str, str, str]], now: float) -> int:
        """Queue ``(endpoint, alert_id, alert_json)`` rows due at ``now``; returns how many were new."""
        with self._write():
            before = self._conn.total_changes
            self._conn.executemany(
                "INSERT OR IGNORE INTO outbox"
                " (endpoint, alert_id, alert, state, enqueued_at, next_attempt_at)"
                " VALUES (?, ?, ?, 'pending', ?, ?)",
                ((endpoint, alert_id, alert, now, now) for endpoint, alert_id, alert in rows),
            )
            return self._conn.total_changes - before

    def due(self, endpoint: str, now: float, limit: int) -> list[Entry]:
        """Up to ``limit`` pending rows of ``endpoint`` whose next attempt is due, oldest first."""
        with self._lock:
            rows = self._conn.execute(
                "SELECT seq, alert_id, alert, attempts, enqueued_at FROM outbox"
                " WHERE endpoint = ? AND state = 'pending' AND next_attempt_at <= ? ORDER BY seq LIMIT ?",
                (endpoint, now, limit),
            ).fetchall()
        return [
            Entry(seq, endpoint, alert_id, orjson.loads(alert), n, at) for seq, alert_id, alert, n, at in rows
        ]

    def next_attempt_at(self, endpoint: str) -> float | None:
        """When the earliest pending row of ``endpoint`` is due (None: nothing pending)."""
        with self._lock:
            (at,) = self._conn.execute(
                "SELECT MIN(next_attempt_at) FROM outbox WHERE endpoint = ? AND state = 'pending'",
                (endpoint,),
            ).fetchone()
        return None if at is None else float(at)

    def finish(self, seq: int, state: str, now: float, error: str | None = None) -> None:
        """Mark a row delivered or dropped."""
        with self._write():
            self._conn.execute(
                "UPDATE outbox SET state = ?, finished_at = ?, attempts = attempts + 1,"
                " last_error = COALESCE(?, last_error) WHERE seq = ?",
                (state, now, error, seq),
            )

    def retry(self, seq: int, attempts: int, next_attempt_at: float, error: str) -> None:
        """Record a failed attempt (``attempts`` failures in all) and when to try next."""
        with self._write():
            self._conn.execute(
                "UPDATE outbox SET attempts = ?, next_attempt_at = ?, last_error = ? WHERE seq = ?",
                (attempts, next_attempt_at, error, seq),
            )

    def expire(self, endpoint: str, enqueued_before: float, now: float) -> list[str]:
        """Drop the pending rows of ``endpoint`` queued before ``enqueued_before``; returns their ids."""
        with self._write():
            rows = self._conn.execute(
                "UPDATE outbox SET state = 'dropped', finished_at = ?, last_error = 'max age'"
                " WHERE endpoint = ? AND state = 'pending' AND enqueued_at < ? RETURNING alert_id",
                (now, endpoint, enqueued_before),
            ).fetchall()
        return sorted(alert_id for (alert_id,) in rows)

    def pending(self) -> dict[str, tuple[int, float]]:
        """endpoint -> (pending rows, enqueued_at of the oldest), for endpoints with any."""
        with self._lock:
            rows = self._conn.execute(
                "SELECT endpoint, COUNT(*), MIN(enqueued_at) FROM outbox WHERE state = 'pending'"
                " GROUP BY endpoint"
            ).fetchall()
        return {endpoint: (int(n), float(oldest)) for endpoint, n, oldest in rows}

    def states(self, endpoint: str) -> dict[str, str]:
        """alert_id -> state, for one endpoint (tests and debugging)."""
        with self._lock:
            rows = self._conn.execute(
                "SELECT alert_id, state FROM outbox WHERE endpoint = ?", (endpoint,)
            ).fetchall()
        return dict(rows)

    def prune(self, finished_before: float) -> int:
        """Delete delivered and dropped rows finished before ``finished_before``; returns how many."""
        with self._write():
            cursor = self._conn.execute(
                "DELETE FROM outbox WHERE state != 'pending' AND finished_at < ?", (finished_before,)
            )
            return cursor.rowcount

    def close(self) -> None:
        with self._lock:
            self._conn.close()


class _Transaction:
    """``BEGIN IMMEDIATE`` ... ``COMMIT`` (``ROLLBACK`` on error) under the outbox lock."""

    def __init__(self, conn: sqlite3.Connection, lock: threading.Lock):
        self._conn = conn
        self._lock = lock

    def __enter__(self) -> None:
        self._lock.acquire()
        try:
            self._conn.execute("BEGIN IMMEDIATE")
        except BaseException:
            self._lock.release()
            raise

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        try:
            self._conn.execute("ROLLBACK" if exc_type is not None else "COMMIT")
        finally:
            self._lock.release()
