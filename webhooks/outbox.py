"""The durable outbox: one SQLite row per (endpoint, alert_id).

A row is ``pending`` until it is ``delivered`` or ``parked``. Parked rows are
alerts the dispatcher gave up on (a non-retryable answer, too many failed
attempts of their own, or ``max_age_seconds``): each keeps its last answer
(HTTP status, an excerpt of the response body, the error text), its attempt
count and when it was parked, and stays until an operator resends it
(``fencewatch webhooks resend``: back to pending). Pruning deletes only
delivered rows past the retention, never a parked one.

Finished rows stay so that the job, which re-runs a micro-batch after a crash
and so enqueues the same alerts again, finds them and adds nothing: ``INSERT
OR IGNORE`` on (endpoint, alert_id) makes enqueueing idempotent. Attempts and
the next-attempt time are stored too, so a restarted job resumes retries where
the old one left off.

All times are Unix seconds (wall clock: they must mean the same after a
restart). Every write commits before it returns. One connection is shared by
the dispatcher's threads, behind a lock; SQLite's WAL journal lets another
process (``fencewatch webhooks``) read and write the file meanwhile.

Schema versions (``PRAGMA user_version``): 0 is the first release (states
pending | delivered | dropped, no answer columns); 1 adds the answer columns
and turns dropped rows into parked ones. Opening a version-0 file migrates it
in one transaction.
"""

from __future__ import annotations

import os
import sqlite3
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from detectors.alerts import FIRING

PENDING = "pending"
DELIVERED = "delivered"
PARKED = "parked"

# Why a row was parked: the label of fencewatch_webhook_parkings_total.
REJECTED = "rejected"  # a 4xx other than 401, 403, 408, 429: this request will never be accepted
REDIRECT = "redirect"  # a 3xx: redirects are not followed
UNRENDERABLE = "unrenderable"  # the alert cannot be rendered in the endpoint's format
RETRIES_EXHAUSTED = "retries_exhausted"  # max_attempts failures answered about this row
MAX_AGE = "max_age"  # still undelivered max_age_seconds after it was queued
PARK_REASONS = (REJECTED, REDIRECT, UNRENDERABLE, RETRIES_EXHAUSTED, MAX_AGE)

SCHEMA_VERSION = 1

_TABLE = """
CREATE TABLE IF NOT EXISTS outbox (
    seq INTEGER PRIMARY KEY,          -- enqueue order
    endpoint TEXT NOT NULL,
    alert_id TEXT NOT NULL,
    alert TEXT NOT NULL,              -- the SPEC 3 alert JSON
    state TEXT NOT NULL,              -- pending | delivered | parked
    enqueued_at REAL NOT NULL,        -- when it was queued (or resent): max_age counts from here
    next_attempt_at REAL NOT NULL,
    attempts INTEGER NOT NULL DEFAULT 0,  -- requests made for it, whatever their answer
    last_error TEXT,                  -- the last failed attempt, in words
    finished_at REAL,                 -- when it was delivered or parked
    failures INTEGER NOT NULL DEFAULT 0,  -- failures answered about this row (they count toward max_attempts)
    last_status INTEGER,              -- HTTP status of the last failed attempt (NULL: no answer)
    last_body TEXT,                   -- an excerpt of that answer's body
    last_attempt_at REAL,
    park_reason TEXT,                 -- see PARK_REASONS; NULL unless parked
    UNIQUE (endpoint, alert_id)
)"""
_INDEXES = (
    "CREATE INDEX IF NOT EXISTS outbox_due ON outbox (endpoint, state, next_attempt_at)",
    "CREATE INDEX IF NOT EXISTS outbox_finished ON outbox (state, finished_at)",
)
# Columns version 1 added to the first release's table, with their types.
_ADDED_COLUMNS = (
    ("failures", "INTEGER NOT NULL DEFAULT 0"),
    ("last_status", "INTEGER"),
    ("last_body", "TEXT"),
    ("last_attempt_at", "REAL"),
    ("park_reason", "TEXT"),
)
# The first release dropped rows for good; its last_error says why.
_PARK_DROPPED = f"""
UPDATE outbox SET state = '{PARKED}', park_reason = CASE
    WHEN last_error = 'max age' THEN '{MAX_AGE}'
    WHEN last_error LIKE '%redirects are not followed%' THEN '{REDIRECT}'
    WHEN last_error LIKE 'cannot render%' THEN '{UNRENDERABLE}'
    ELSE '{REJECTED}' END
WHERE state = 'dropped'"""


class OutboxError(Exception):
    """The file cannot be used as an outbox; the message says which file and why."""


@dataclass(frozen=True, slots=True)
class Answer:
    """What a failed attempt came to: ``error`` in words, the HTTP ``status`` and
    a ``body`` excerpt when the endpoint answered (None and "" when it did not)."""

    error: str
    status: int | None = None
    body: str = ""


@dataclass(frozen=True, slots=True)
class Entry:
    """One pending delivery: ``attempts`` requests made so far, ``failures`` of
    them answered about this row itself."""

    seq: int
    endpoint: str
    alert_id: str
    alert: dict[str, Any]
    attempts: int
    failures: int
    enqueued_at: float


@dataclass(frozen=True, slots=True)
class ParkedRow:
    """A parked row as an operator sees it."""

    endpoint: str
    alert_id: str
    rule: str | None
    status: str | None  # firing or resolved (SPEC 3); None where the stored alert is not an object
    reason: str
    attempts: int
    enqueued_at: float
    parked_at: float
    last_status: int | None
    last_body: str
    last_error: str


class Outbox:
    """The outbox file at ``path``.

    With ``create`` (the job) the file and its directory are made on first use;
    without it (the ``fencewatch webhooks`` command) a missing file, or one that
    is not an outbox, raises :class:`OutboxError`. Either way a file written by
    an older release is migrated on open.
    """

    def __init__(self, path: str | os.PathLike[str], *, create: bool = True):
        self.path = os.fspath(path)
        if create:
            os.makedirs(os.path.dirname(os.path.abspath(self.path)), exist_ok=True)
        elif not os.path.isfile(self.path):
            raise OutboxError(f"no outbox at {self.path}")
        self._lock = threading.Lock()
        # isolation_level=None: transactions are explicit, so each write is one
        # BEGIN IMMEDIATE ... COMMIT and nothing is left open between calls.
        self._conn = sqlite3.connect(self.path, timeout=30.0, isolation_level=None, check_same_thread=False)
        try:
            self._conn.execute("PRAGMA journal_mode=WAL")
            # FULL: a committed enqueue survives a power cut, not just a crash of the job.
            self._conn.execute("PRAGMA synchronous=FULL")
            self._open_schema(create)
        except sqlite3.DatabaseError as exc:
            self._conn.close()
            raise OutboxError(f"{self.path} is not a usable webhook outbox: {exc}") from None
        except OutboxError:
            self._conn.close()
            raise

    def _open_schema(self, create: bool) -> None:
        with self._write():
            (version,) = self._conn.execute("PRAGMA user_version").fetchone()
            if version > SCHEMA_VERSION:
                raise OutboxError(
                    f"{self.path} was written by a newer fencewatch (outbox schema {version}, this "
                    f"release reads up to {SCHEMA_VERSION}); upgrade fencewatch"
                )
            columns = {row[1] for row in self._conn.execute("PRAGMA table_info(outbox)")}
            if not columns and not create:
                raise OutboxError(f"{self.path} is not a fencewatch webhook outbox (it has no outbox table)")
            # Not executescript: it commits first, outside the transaction.
            self._conn.execute(_TABLE)
            for name, decl in _ADDED_COLUMNS:
                if columns and name not in columns:
                    self._conn.execute(f"ALTER TABLE outbox ADD COLUMN {name} {decl}")
            for statement in _INDEXES:
                self._conn.execute(statement)
            if version < 1:
                self._conn.execute(_PARK_DROPPED)
            self._conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")

    def _write(self) -> _Transaction:
        return _Transaction(self._conn, self._lock)

    # ---- the dispatcher's side ------------------------------------------------------------

    def add(self, rows: Iterable[tuple[str, str, str]], now: float) -> int:
        """Queue ``(endpoint, alert_id, alert_json)`` rows due at ``now``; returns how many were new."""
        with self._write():
            before = self._conn.total_changes
            self._conn.executemany(
                "INSERT OR IGNORE INTO outbox"
                " (endpoint, alert_id, alert, state, enqueued_at, next_attempt_at)"
                f" VALUES (?, ?, ?, '{PENDING}', ?, ?)",
                ((endpoint, alert_id, alert, now, now) for endpoint, alert_id, alert in rows),
            )
            return self._conn.total_changes - before

    def due(self, endpoint: str, now: float, limit: int) -> list[Entry]:
        """Up to ``limit`` pending rows of ``endpoint`` whose next attempt is due:
        those with the fewest failures of their own first, then the oldest, so a
        row known to fail never goes ahead of fresh ones."""
        with self._lock:
            rows = self._conn.execute(
                "SELECT seq, alert_id, alert, attempts, failures, enqueued_at FROM outbox"
                f" WHERE endpoint = ? AND state = '{PENDING}' AND next_attempt_at <= ?"
                " ORDER BY failures, seq LIMIT ?",
                (endpoint, now, limit),
            ).fetchall()
        return [
            Entry(seq, endpoint, alert_id, orjson.loads(alert), attempts, failures, at)
            for seq, alert_id, alert, attempts, failures, at in rows
        ]

    def next_attempt_at(self, endpoint: str) -> float | None:
        """When the earliest pending row of ``endpoint`` is due (None: nothing pending)."""
        with self._lock:
            (at,) = self._conn.execute(
                f"SELECT MIN(next_attempt_at) FROM outbox WHERE endpoint = ? AND state = '{PENDING}'",
                (endpoint,),
            ).fetchone()
        return None if at is None else float(at)

    def delivered(self, seq: int, now: float) -> None:
        """Mark a row delivered (its endpoint answered 2xx)."""
        with self._write():
            self._conn.execute(
                f"UPDATE outbox SET state = '{DELIVERED}', finished_at = ?, attempts = attempts + 1,"
                " last_attempt_at = ? WHERE seq = ?",
                (now, now, seq),
            )

    def retry(
        self, seq: int, next_attempt_at: float, answer: Answer, now: float, *, own_failure: bool
    ) -> None:
        """Record a failed attempt and when to try next; ``own_failure``: the
        answer was about this row (it counts toward the endpoint's max_attempts)."""
        with self._write():
            self._conn.execute(
                "UPDATE outbox SET attempts = attempts + 1, failures = failures + ?, next_attempt_at = ?,"
                " last_error = ?, last_status = ?, last_body = ?, last_attempt_at = ? WHERE seq = ?",
                (int(own_failure), next_attempt_at, answer.error, answer.status, answer.body, now, seq),
            )

    def park(self, seq: int, reason: str, answer: Answer, now: float) -> None:
        """Park a row after an attempt answered with ``answer``."""
        with self._write():
            self._conn.execute(
                f"UPDATE outbox SET state = '{PARKED}', park_reason = ?, finished_at = ?,"
                " attempts = attempts + 1, failures = failures + 1,"
                " last_error = ?, last_status = ?, last_body = ?, last_attempt_at = ? WHERE seq = ?",
                (reason, now, answer.error, answer.status, answer.body, now, seq),
            )

    def park_expired(self, endpoint: str, enqueued_before: float, now: float) -> list[str]:
        """Park the pending rows of ``endpoint`` queued before ``enqueued_before``
        (their last answer stays as it was); returns their ids."""
        with self._write():
            rows = self._conn.execute(
                f"UPDATE outbox SET state = '{PARKED}', park_reason = '{MAX_AGE}', finished_at = ?"
                f" WHERE endpoint = ? AND state = '{PENDING}' AND enqueued_at < ? RETURNING alert_id",
                (now, endpoint, enqueued_before),
            ).fetchall()
        return sorted(alert_id for (alert_id,) in rows)

    def pending(self) -> dict[str, tuple[int, float]]:
        """endpoint -> (pending rows, enqueued_at of the oldest), for endpoints with any."""
        with self._lock:
            rows = self._conn.execute(
                f"SELECT endpoint, COUNT(*), MIN(enqueued_at) FROM outbox WHERE state = '{PENDING}'"
                " GROUP BY endpoint"
            ).fetchall()
        return {endpoint: (int(n), float(oldest)) for endpoint, n, oldest in rows}

    def parked_counts(self) -> dict[str, int]:
        """endpoint -> parked rows, for endpoints with any."""
        with self._lock:
            rows = self._conn.execute(
                f"SELECT endpoint, COUNT(*) FROM outbox WHERE state = '{PARKED}' GROUP BY endpoint"
            ).fetchall()
        return {endpoint: int(n) for endpoint, n in rows}

    def endpoints(self) -> list[str]:
        """The endpoints that have rows, by name."""
        with self._lock:
            rows = self._conn.execute("SELECT DISTINCT endpoint FROM outbox ORDER BY endpoint").fetchall()
        return [endpoint for (endpoint,) in rows]

    def states(self, endpoint: str) -> dict[str, str]:
        """alert_id -> state, for one endpoint (tests and debugging)."""
        with self._lock:
            rows = self._conn.execute(
                "SELECT alert_id, state FROM outbox WHERE endpoint = ?", (endpoint,)
            ).fetchall()
        return dict(rows)

    def prune(self, finished_before: float) -> int:
        """Delete delivered rows finished before ``finished_before``; returns how many.
        Parked rows are never pruned: only a resend takes them out of the parked state."""
        with self._write():
            cursor = self._conn.execute(
                f"DELETE FROM outbox WHERE state = '{DELIVERED}' AND finished_at < ?", (finished_before,)
            )
            return cursor.rowcount

    # ---- the operator's side (fencewatch webhooks) ------------------------------------------

    def parked(self, endpoint: str | None = None) -> list[ParkedRow]:
        """The parked rows (of one endpoint, or all), in the order they were queued."""
        with self._lock:
            rows = self._conn.execute(
                "SELECT endpoint, alert_id, alert, park_reason, attempts, enqueued_at, finished_at,"
                f" last_status, last_body, last_error FROM outbox WHERE state = '{PARKED}'"
                " AND (? IS NULL OR endpoint = ?) ORDER BY seq",
                (endpoint, endpoint),
            ).fetchall()
        return [_parked_row(*row) for row in rows]

    def resend(
        self, now: float, endpoint: str | None = None, alert_ids: Sequence[str] = ()
    ) -> list[tuple[str, str]]:
        """Move parked rows back to pending, due at ``now``: those of ``endpoint``
        (None: every endpoint) and, when ``alert_ids`` are given, only those.
        Returns the (endpoint, alert_id) pairs moved, in queue order.

        A resent row starts afresh: no failures, and ``max_age_seconds`` counts
        from ``now``. Its attempt count and last answer stay, for the record.
        """
        update = (
            f"UPDATE outbox SET state = '{PENDING}', park_reason = NULL, finished_at = NULL,"
            " failures = 0, enqueued_at = ?, next_attempt_at = ?"
            f" WHERE state = '{PARKED}' AND (? IS NULL OR endpoint = ?)"
        )
        moved: list[tuple[int, str, str]] = []
        with self._write():
            if not alert_ids:
                moved += self._conn.execute(
                    update + " RETURNING seq, endpoint, alert_id", (now, now, endpoint, endpoint)
                ).fetchall()
            for alert_id in dict.fromkeys(alert_ids):
                moved += self._conn.execute(
                    update + " AND alert_id = ? RETURNING seq, endpoint, alert_id",
                    (now, now, endpoint, endpoint, alert_id),
                ).fetchall()
        return [(name, alert_id) for _, name, alert_id in sorted(moved)]

    def close(self) -> None:
        with self._lock:
            self._conn.close()


def _parked_row(
    endpoint: str,
    alert_id: str,
    alert_json: str,
    reason: str | None,
    attempts: int,
    enqueued_at: float,
    parked_at: float | None,
    last_status: int | None,
    last_body: str | None,
    last_error: str | None,
) -> ParkedRow:
    try:
        alert = orjson.loads(alert_json)
    except orjson.JSONDecodeError:
        alert = None
    rule = alert.get("rule") if isinstance(alert, dict) else None
    # An alert without a status is a firing one, as detectors.render reads it.
    status = alert.get("status", FIRING) if isinstance(alert, dict) else None
    return ParkedRow(
        endpoint=endpoint,
        alert_id=alert_id,
        rule=rule if isinstance(rule, str) else None,
        status=status if isinstance(status, str) else None,
        reason=reason or "unknown",
        attempts=int(attempts),
        enqueued_at=float(enqueued_at),
        parked_at=float(enqueued_at if parked_at is None else parked_at),
        last_status=last_status,
        last_body=last_body or "",
        last_error=last_error or "",
    )


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
