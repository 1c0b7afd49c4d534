"""Delivers queued alerts to webhook endpoints, at least once and (with
receivers that honour ``X-Fencewatch-Alert-Id``) effectively once.

The job calls :meth:`Dispatcher.enqueue` with each micro-batch's alerts; that
only writes the outbox (``webhooks.outbox``) and returns, so a slow
or dead endpoint never holds up the stream. Delivery happens in background
threads, one per endpoint so that one endpoint timing out never delays
another, or in :meth:`Dispatcher.deliver_due` called directly (tests).

The retry policy: each alert is judged on its own, and only what is about the
endpoint holds the endpoint back.

- Per endpoint, due rows go out paced by a token bucket, rows with the fewest
  failures of their own first, then oldest first.
- A 2xx marks the row delivered.
- An answer about this one alert that may pass later (500 and other 5xx but
  502/503/504) reschedules that row alone, with exponential backoff and full
  jitter; the rows behind it go out in the same pass. After ``max_attempts``
  such failures the row is parked (``retries_exhausted``).
- A failure about the endpoint (connection error, timeout of the whole
  request, 401/403 -- a wrong secret is a configuration fault an operator
  fixes -- 408, 429, and a gateway's 502/503/504) reschedules the row and
  holds the whole endpoint back for that row's backoff, or for the server's
  Retry-After on 429/503, capped at ``backoff_cap_seconds``. So an endpoint
  that is down gets one probe per backoff interval, not its backlog. These
  failures never count toward ``max_attempts``: an outage parks nothing before
  ``max_age_seconds``.
- A circuit breaker (``webhooks.pacing.Circuit``) covers endpoints
  that answer everything with 500s, or reject everything: when
  ``CIRCUIT_ROWS`` different alerts fail in a row with no delivery between
  them, the endpoint is held back for a backoff that doubles each time, and
  then probed with one row until a delivery succeeds.
- A 3xx (redirects are not followed: a signed alert is never re-sent to
  another host; the reason names the Location), any other 4xx (this request
  will never be accepted), or an alert that cannot be rendered parks the row
  at once. So does ``max_age_seconds`` undelivered.

Parked rows keep their last answer (status, a body excerpt, the error), are
counted (``fencewatch_webhook_parked``, ``fencewatch_webhook_parkings_total``)
and stay in the outbox until ``fencewatch webhooks resend`` makes them pending
again; this dispatcher then delivers them like new ones.

``timeout_seconds`` bounds the whole request, connect to the last byte of the
answer (``webhooks.transport``). A row is marked delivered only
after the endpoint answered 2xx; if the job dies between the answer and the
mark, the row is sent again after the restart with the same
``X-Fencewatch-Alert-Id``.

URLs and secrets never reach the logs: endpoints are named by ``name``, error
texts are scrubbed of the URL, and httpx's own request log lines are redacted.
"""

from __future__ import annotations

import logging
import math
import os
import random
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import httpx
import orjson
from prometheus_client import Counter, Gauge

from webhooks.config import Endpoint
from webhooks.outbox import (
    MAX_AGE,
    PARK_REASONS,
    REDIRECT,
    REJECTED,
    RETRIES_EXHAUSTED,
    UNRENDERABLE,
    Answer,
    Entry,
    Outbox,
)
from webhooks.pacing import Circuit, TokenBucket, backoff_seconds, retry_after_seconds
from webhooks.payloads import render
from webhooks.signing import ALERT_ID_HEADER, sign
from webhooks.transport import DeadlinePoster, PostFailed, Reply

log = logging.getLogger(__name__)

RETENTION_SECONDS = 7 * 86400.0
# Rows taken from the outbox per pass; a larger backlog takes several passes.
BATCH_ROWS = 100
# The longest a delivery thread sleeps: gauges (oldest pending age) stay this
# fresh, and rows resent by `fencewatch webhooks resend` go out within it.
IDLE_POLL_SECONDS = 1.0
PRUNE_INTERVAL_SECONDS = 3600.0
USER_AGENT = "fencewatch-webhooks/1"
# Different alerts failing in a row, no delivery between, that open the circuit.
CIRCUIT_ROWS = 3
# Statuses about the endpoint rather than the alert: they hold the endpoint back.
ENDPOINT_STATUSES = frozenset({401, 403, 408, 429, 502, 503, 504})
RETRY_AFTER_STATUSES = frozenset({429, 503})
# How much of an answer's body a parked row keeps, and a log line shows.
BODY_EXCERPT_CHARS = 500
LOGGED_BODY_CHARS = 200
LOCATION_CHARS = 300

NO_ANSWER = Answer("")

DELIVERED = "delivered"
PARK = "park"
RETRY_ROW = "retry_row"
HOLD_ENDPOINT = "hold_endpoint"


@dataclass(frozen=True, slots=True)
class Outcome:
    """What one delivery attempt came to.

    ``kind``: delivered | park | retry_row (this alert failed; it backs off
    alone) | hold_endpoint (the endpoint failed; it is held back).
    ``reason``: the failure metric's label (timeout, connection, http_3xx,
    http_4xx, http_5xx), None when no request failed. ``park_reason``: why a
    ``park`` outcome parks. ``retry_after_seconds``: the server's Retry-After,
    already capped, when it sent one.
    """

    kind: str
    reason: str | None = None
    answer: Answer = NO_ANSWER
    park_reason: str = ""
    retry_after_seconds: float | None = None


class DeliveryMetrics(Protocol):
    """The webhook series the dispatcher feeds, each labelled by ``endpoint``
    (``streaming.metrics.Metrics`` defines them on the job's registry)."""

    webhook_deliveries: Counter
    webhook_failures: Counter  # also by ``reason``
    webhook_parkings: Counter  # also by ``reason``
    webhook_parked: Gauge
    webhook_rate_limited: Counter
    webhook_backlog: Gauge
    webhook_oldest_pending: Gauge


class Dispatcher:
    """Webhook delivery for the job's driver: ``enqueue`` alerts, ``start`` the threads, ``stop``.

    ``clock`` gives Unix seconds (it stamps the outbox, so it must be a wall
    clock); ``rng`` draws the backoff jitter. Nothing here sleeps on
    ``clock``: waits are computed from it, so a fake clock drives every timing
    decision in tests (request deadlines are real time). After :meth:`stop`
    the dispatcher is closed.
    """

    def __init__(
        self,
        endpoints: Sequence[Endpoint],
        outbox_path: str | os.PathLike[str],
        metrics: DeliveryMetrics,
        *,
        clock: Callable[[], float] = time.time,
        rng: random.Random | None = None,
        retention_seconds: float = RETENTION_SECONDS,
    ):
        names = [e.name for e in endpoints]
        if len(set(names)) != len(names):
            raise ValueError(f"endpoint names must be unique, got {names}")
        self.endpoints = list(endpoints)
        self.metrics = metrics
        self.retention_seconds = retention_seconds
        self._clock = clock
        self._rng = rng or random.Random()
        self._outbox = Outbox(outbox_path)
        self._poster = DeadlinePoster(USER_AGENT)
        now = clock()
        self._buckets = {e.name: TokenBucket(e.rate_per_second, e.burst, now) for e in endpoints}
        self._circuits = {
            e.name: Circuit(CIRCUIT_ROWS, e.backoff_base_seconds, e.backoff_cap_seconds, self._rng)
            for e in endpoints
        }
        self._pass_locks = {e.name: threading.Lock() for e in endpoints}
        self._wake = {e.name: threading.Event() for e in endpoints}
        self._stopping = threading.Event()
        self._threads: list[threading.Thread] = []
        self._housekeeping_lock = threading.Lock()
        self._last_prune = -math.inf
        self._closed = False
        self._redact = _Redactor(self.endpoints)
        # httpx logs every request's full URL at INFO; some URLs are secrets.
        logging.getLogger("httpx").addFilter(self._redact)
        for endpoint in self.endpoints:
            # Every reason's series exists from the start at 0, so that
            # increase() sees an endpoint's first parking.
            for reason in PARK_REASONS:
                metrics.webhook_parkings.labels(endpoint=endpoint.name, reason=reason)
        self._refresh_gauges(now)

    # ---- the job's side -------------------------------------------------------------------

    def enqueue(self, alerts: Iterable[dict[str, Any]]) -> int:
        """Queue each alert (a SPEC 3 dict) for every endpoint whose filters accept it.

        Committed to the outbox before it returns. Idempotent: an alert already
        queued for an endpoint (same ``alert_id``), delivered, parked or not,
        is not queued again. Returns how many new outbox rows were written.
        """
        rows: list[tuple[str, str, str]] = []
        for alert in alerts:
            alert_id = alert.get("alert_id")
            if not isinstance(alert_id, str) or not alert_id:
                raise ValueError(
                    f"an alert without an alert_id cannot be de-duplicated: rule {alert.get('rule')}"
                )
            text: str | None = None
            for endpoint in self.endpoints:
                if endpoint.accepts(alert):
                    text = text or orjson.dumps(alert).decode()
                    rows.append((endpoint.name, alert_id, text))
        if not rows:
            return 0
        now = self._clock()
        added = self._outbox.add(rows, now)
        if added:
            for name in {name for name, _, _ in rows}:
                self._wake[name].set()
            self._refresh_gauges(now)
        return added

    def start(self) -> None:
        """Start one daemon thread per endpoint delivering due rows until :meth:`stop`."""
        if self._threads or self._closed:
            raise RuntimeError("the dispatcher was already started (or stopped)")
        for endpoint in self.endpoints:
            thread = threading.Thread(
                target=self._run, args=(endpoint,), name=f"fencewatch-webhook-{endpoint.name}", daemon=True
            )
            self._threads.append(thread)
            thread.start()

    def stop(self, timeout_seconds: float = 10.0) -> None:
        """Stop the threads (an attempt in flight may take up to its timeout) and close.

        Pending rows stay in the outbox for the next dispatcher on the same file.
        """
        if self._closed:
            return
        self._stopping.set()
        for event in self._wake.values():
            event.set()
        deadline = time.monotonic() + timeout_seconds
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        busy = [t.name for t in self._threads if t.is_alive()]
        if busy:
            # Closing the outbox under a thread mid-attempt would fail its write;
            # the daemon threads end with the process and the row is retried then.
            log.warning("webhook threads %s still busy after %g s; not waiting longer", busy, timeout_seconds)
            return
        self._closed = True
        logging.getLogger("httpx").removeFilter(self._redact)
        self._poster.close()
        self._outbox.close()

    def deliver_due(self) -> int:
        """One pass over every endpoint: park expired rows, deliver the due ones
        the rate limits and circuits allow, refresh the gauges. Returns how many
        alerts were delivered."""
        delivered = sum(self._pass(endpoint)[0] for endpoint in self.endpoints)
        self._housekeeping(self._clock())
        return delivered

    def backlog(self) -> dict[str, int]:
        """endpoint name -> alerts waiting for it."""
        pending = self._outbox.pending()
        return {e.name: pending.get(e.name, (0, 0.0))[0] for e in self.endpoints}

    @property
    def outbox(self) -> Outbox:
        """The outbox itself (tests and debugging read row states from it)."""
        return self._outbox

    # ---- delivery -------------------------------------------------------------------------

    def _run(self, endpoint: Endpoint) -> None:
        wake = self._wake[endpoint.name]
        while not self._stopping.is_set():
            try:
                _, next_at = self._pass(endpoint)
                now = self._clock()
                self._housekeeping(now)
                wait = (
                    IDLE_POLL_SECONDS if next_at is None else min(max(next_at - now, 0.0), IDLE_POLL_SECONDS)
                )
            except Exception as exc:
                # No traceback: its frames' messages could hold the URL. The thread
                # must survive, or the endpoint silently stops getting alerts.
                log.error(
                    "webhook %s: delivery pass failed: %s", endpoint.name, self._redact.scrub(repr(exc))
                )
                wait = IDLE_POLL_SECONDS
            wake.wait(wait)
            wake.clear()

    def _pass(self, endpoint: Endpoint) -> tuple[int, float | None]:
        """Deliver what is due for one endpoint; returns (delivered, when to look again: None = no rows)."""
        name = endpoint.name
        circuit = self._circuits[name]
        with self._pass_locks[name]:
            now = self._clock()
            self._park_expired(endpoint, now)
            if circuit.is_held(now):
                return 0, circuit.held_until
            entries = self._outbox.due(name, now, BATCH_ROWS)
            delivered = 0
            for entry in entries:
                if self._stopping.is_set():
                    return delivered, now
                wait = self._buckets[name].take(self._clock())
                if wait > 0:
                    self.metrics.webhook_rate_limited.labels(endpoint=name).inc()
                    return delivered, self._clock() + wait
                outcome = self._attempt(endpoint, entry)
                now = self._clock()
                if outcome.kind == DELIVERED:
                    self._outbox.delivered(entry.seq, now)
                    self.metrics.webhook_deliveries.labels(endpoint=name).inc()
                    circuit.succeeded()
                    delivered += 1
                    continue
                if outcome.reason is not None:
                    self.metrics.webhook_failures.labels(endpoint=name, reason=outcome.reason).inc()
                if outcome.kind == HOLD_ENDPOINT:
                    until = self._hold(endpoint, entry, outcome, now)
                    return delivered, until
                if outcome.kind == PARK:
                    self._park(endpoint, entry, outcome.park_reason, outcome.answer, now)
                elif entry.failures + 1 < endpoint.max_attempts:
                    self._retry_row(endpoint, entry, outcome.answer, now)
                else:
                    self._park(endpoint, entry, RETRIES_EXHAUSTED, outcome.answer, now)
                if outcome.reason is not None and self._circuit_opens(endpoint, entry, now):
                    return delivered, circuit.held_until
            if len(entries) == BATCH_ROWS:
                return delivered, now
            return delivered, self._outbox.next_attempt_at(name)

    def _hold(self, endpoint: Endpoint, entry: Entry, outcome: Outcome, now: float) -> float:
        """The endpoint failed: reschedule the row and hold the endpoint back until then."""
        if outcome.retry_after_seconds is not None:
            delay = outcome.retry_after_seconds
        else:
            delay = backoff_seconds(
                entry.attempts + 1, endpoint.backoff_base_seconds, endpoint.backoff_cap_seconds, self._rng
            )
        self._outbox.retry(entry.seq, now + delay, outcome.answer, now, own_failure=False)
        self._circuits[endpoint.name].hold(now + delay)
        log.warning(
            "webhook %s: attempt %d for alert %s failed (%s); holding the endpoint back for %.1f s",
            endpoint.name,
            entry.attempts + 1,
            entry.alert_id,
            outcome.answer.error,
            delay,
        )
        return now + delay

    def _retry_row(self, endpoint: Endpoint, entry: Entry, answer: Answer, now: float) -> None:
        """This alert failed: it alone backs off."""
        delay = backoff_seconds(
            entry.attempts + 1, endpoint.backoff_base_seconds, endpoint.backoff_cap_seconds, self._rng
        )
        self._outbox.retry(entry.seq, now + delay, answer, now, own_failure=True)
        log.warning(
            "webhook %s: attempt %d for alert %s failed (%s); %d of %d; retrying it in %.1f s",
            endpoint.name,
            entry.attempts + 1,
            entry.alert_id,
            answer.error,
            entry.failures + 1,
            endpoint.max_attempts,
            delay,
        )

    def _park(self, endpoint: Endpoint, entry: Entry, reason: str, answer: Answer, now: float) -> None:
        self._outbox.park(entry.seq, reason, answer, now)
        self.metrics.webhook_parkings.labels(endpoint=endpoint.name, reason=reason).inc()
        log.error(
            "webhook %s: parked alert %s (%s) after %d attempt(s), %s: %s",
            endpoint.name,
            entry.alert_id,
            entry.alert.get("rule"),
            entry.attempts + 1,
            reason,
            answer.error,
        )

    def _circuit_opens(self, endpoint: Endpoint, entry: Entry, now: float) -> bool:
        pause = self._circuits[endpoint.name].row_failed(entry.seq, now)
        if pause is None:
            return False
        log.warning(
            "webhook %s: %d different alerts failed in a row; holding the endpoint back for %.1f s, "
            "then probing it with one",
            endpoint.name,
            CIRCUIT_ROWS,
            pause,
        )
        return True

    def _attempt(self, endpoint: Endpoint, entry: Entry) -> Outcome:
        """POST one alert and classify the answer."""
        try:
            body = render(endpoint.format, entry.alert, endpoint.name, endpoint.external_url)
        except (KeyError, TypeError, ValueError) as exc:
            return Outcome(
                PARK,
                answer=Answer(f"cannot render it as {endpoint.format}: {exc!r}"),
                park_reason=UNRENDERABLE,
            )
        headers = {"Content-Type": "application/json", ALERT_ID_HEADER: entry.alert_id}
        if endpoint.secret is not None:
            headers.update(sign(endpoint.secret, int(self._clock()), entry.alert_id, body))
        try:
            reply = self._poster.post(endpoint.url, body, headers, endpoint.timeout_seconds)
        except PostFailed as exc:
            return Outcome(HOLD_ENDPOINT, exc.kind, Answer(self._redact.scrub(exc.detail)))
        return self._judge(endpoint, reply)

    def _judge(self, endpoint: Endpoint, reply: Reply) -> Outcome:
        """Classify an answer (see the module docstring for the policy)."""
        status = reply.status
        if 200 <= status < 300:
            return Outcome(DELIVERED)
        reason = f"http_{status // 100}xx"
        excerpt = self._redact.scrub(" ".join(reply.body.decode("utf-8", "replace").split()))
        excerpt = excerpt[:BODY_EXCERPT_CHARS]
        error = f"HTTP {status} {excerpt[:LOGGED_BODY_CHARS]}".rstrip()
        if 300 <= status < 400:
            location = reply.headers.get("Location")
            target = (
                f"a redirect to {self._redact.scrub(location)[:LOCATION_CHARS]}"
                if location
                else "a redirect without a Location"
            )
            error = (
                f"HTTP {status}: {target}; redirects are not followed (a signed alert is not re-sent "
                "to another URL): configure the final URL"
            )
            return Outcome(PARK, reason, Answer(error, status, excerpt), REDIRECT)
        answer = Answer(error, status, excerpt)
        if status in ENDPOINT_STATUSES:
            retry_after = None
            if status in RETRY_AFTER_STATUSES:
                retry_after = retry_after_seconds(
                    reply.headers.get("Retry-After"), self._clock(), endpoint.backoff_cap_seconds
                )
            return Outcome(HOLD_ENDPOINT, reason, answer, retry_after_seconds=retry_after)
        if 400 <= status < 500:
            return Outcome(
                PARK, reason, Answer(f"{error} (a client error: not retried)", status, excerpt), REJECTED
            )
        return Outcome(RETRY_ROW, reason, answer)

    # ---- upkeep ---------------------------------------------------------------------------

    def _park_expired(self, endpoint: Endpoint, now: float) -> None:
        ids = self._outbox.park_expired(endpoint.name, now - endpoint.max_age_seconds, now)
        if ids:
            self.metrics.webhook_parkings.labels(endpoint=endpoint.name, reason=MAX_AGE).inc(len(ids))
            shown = ", ".join(ids[:10]) + (f" and {len(ids) - 10} more" if len(ids) > 10 else "")
            log.error(
                "webhook %s: parked %d alert(s) still undelivered after max_age_seconds=%g: %s",
                endpoint.name,
                len(ids),
                endpoint.max_age_seconds,
                shown,
            )

    def _housekeeping(self, now: float) -> None:
        with self._housekeeping_lock:
            if now - self._last_prune >= PRUNE_INTERVAL_SECONDS:
                self._last_prune = now
                pruned = self._outbox.prune(now - self.retention_seconds)
                if pruned:
                    log.info(
                        "webhook outbox: pruned %d delivered rows older than %g s",
                        pruned,
                        self.retention_seconds,
                    )
            self._refresh_gauges(now)

    def _refresh_gauges(self, now: float) -> None:
        pending = self._outbox.pending()
        parked = self._outbox.parked_counts()
        for endpoint in self.endpoints:
            count, oldest = pending.get(endpoint.name, (0, now))
            self.metrics.webhook_backlog.labels(endpoint=endpoint.name).set(count)
            self.metrics.webhook_oldest_pending.labels(endpoint=endpoint.name).set(max(0.0, now - oldest))
            self.metrics.webhook_parked.labels(endpoint=endpoint.name).set(parked.get(endpoint.name, 0))


class _Redactor(logging.Filter):
    """Replaces endpoint URLs (and their paths, where Slack-style secrets sit) in
    log records and error texts by ``<url of NAME>``."""

    def __init__(self, endpoints: Sequence[Endpoint]):
        super().__init__()
        self._secrets: list[tuple[str, str]] = []
        for endpoint in endpoints:
            label = f"<url of {endpoint.name}>"
            forms = {endpoint.url}
            try:
                parsed = httpx.URL(endpoint.url)
                forms.add(str(parsed))
                if len(parsed.path) > 1:
                    forms.update({parsed.path, parsed.raw_path.decode("ascii", "replace")})
            except httpx.InvalidURL:
                pass
            # Longest first, so a full URL is replaced before its path is.
            self._secrets.extend((form, label) for form in forms)
        self._secrets.sort(key=lambda pair: -len(pair[0]))

    def scrub(self, text: str) -> str:
        for secret, label in self._secrets:
            text = text.replace(secret, label)
        return text

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except (TypeError, ValueError):
            return True
        scrubbed = self.scrub(message)
        if scrubbed != message:
            record.msg, record.args = scrubbed, None
        return True
