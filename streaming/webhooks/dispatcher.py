"""Delivers queued alerts to webhook endpoints, at least once and (with
receivers that honour ``X-Fencewatch-Alert-Id``) effectively once.

The job calls :meth:`Dispatcher.enqueue` with each micro-batch's alerts; that
only writes the outbox (``streaming.webhooks.outbox``) and returns, so a slow
or dead endpoint never holds up the stream. Delivery happens in background
threads, one per endpoint so that one endpoint timing out never delays
another, or in :meth:`Dispatcher.deliver_due` called directly (tests).

Per endpoint, due rows go out oldest first, paced by a token bucket. A
retryable failure (timeout, connection error, 401, 403, 408, 429, 5xx) reschedules the
row with exponential backoff and full jitter (or the server's Retry-After on
429/503) and pauses the endpoint until then: when an endpoint is down, one
probe per backoff interval, not its whole backlog each time. Any other 4xx
(and a 3xx: redirects are not followed) drops the row for good, as does
reaching the endpoint's ``max_age_seconds`` undelivered.

A row is marked delivered only after the endpoint answered 2xx; if the job
dies between the answer and the mark, the row is sent again after the
restart with the same ``X-Fencewatch-Alert-Id``.

URLs and secrets never reach the logs: endpoints are named by ``name``, error
texts are scrubbed of the URL, and httpx's own request log lines are redacted.
"""

from __future__ import annotations

import email.utils
import logging
import math
import os
import random
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC
from typing import Any

import httpx
import orjson

from streaming.metrics import Metrics
from streaming.webhooks.config import Endpoint
from streaming.webhooks.outbox import DELIVERED, DROPPED, Entry, Outbox
from streaming.webhooks.pacing import TokenBucket, backoff_seconds
from streaming.webhooks.payloads import render
from streaming.webhooks.signing import ALERT_ID_HEADER, sign

log = logging.getLogger(__name__)

RETENTION_SECONDS = 7 * 86400.0
# Rows taken from the outbox per pass; a larger backlog takes several passes.
BATCH_ROWS = 100
# The longest a delivery thread sleeps: gauges (oldest pending age) stay this fresh.
IDLE_POLL_SECONDS = 1.0
PRUNE_INTERVAL_SECONDS = 3600.0
USER_AGENT = "fencewatch-webhooks/1"
# 401/403 are retried: a wrong or rotated secret is a configuration fault an
# operator fixes, and the alerts should wait for that (up to max age), not vanish.
RETRY_STATUSES = frozenset({401, 403, 408, 429})
RETRY_AFTER_STATUSES = frozenset({429, 503})


@dataclass(frozen=True, slots=True)
class Outcome:
    """What one delivery attempt came to.

    ``kind``: delivered | retry | drop. ``reason``: the failure metric's label
    (timeout, connection, http_4xx, http_5xx), None when there is none.
    ``retry_after_seconds``: the server's Retry-After, when it sent one.
    """

    kind: str
    reason: str | None = None
    detail: str = ""
    retry_after_seconds: float | None = None


class Dispatcher:
    """Webhook delivery for the job's driver: ``enqueue`` alerts, ``start`` the threads, ``stop``.

    ``clock`` gives Unix seconds (it stamps the outbox, so it must be a wall
    clock); ``rng`` draws the backoff jitter; ``http_client`` is used instead
    of a new ``httpx.Client`` (the caller then closes it). Nothing here sleeps
    on ``clock``: waits are computed from it, so a fake clock drives every
    timing decision in tests. After :meth:`stop` the dispatcher is closed.
    """

    def __init__(
        self,
        endpoints: Sequence[Endpoint],
        outbox_path: str | os.PathLike[str],
        metrics: Metrics,
        *,
        clock: Callable[[], float] = time.time,
        rng: random.Random | None = None,
        http_client: httpx.Client | None = None,
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
        self._owns_client = http_client is None
        self._client = http_client or httpx.Client(headers={"User-Agent": USER_AGENT}, follow_redirects=False)
        now = clock()
        self._buckets = {e.name: TokenBucket(e.rate_per_second, e.burst, now) for e in endpoints}
        self._paused_until = {e.name: -math.inf for e in endpoints}
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
        self._refresh_gauges(now)

    # ---- the job's side -------------------------------------------------------------------

    def enqueue(self, alerts: Iterable[dict[str, Any]]) -> int:
        """Queue each alert (a SPEC 3 dict) for every endpoint whose filters accept it.

        Committed to the outbox before it returns. Idempotent: an alert already
        queued for an endpoint (same ``alert_id``), delivered or not, is not
        queued again. Returns how many new outbox rows were written.
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
        if self._owns_client:
            self._client.close()
        self._outbox.close()

    def deliver_due(self) -> int:
        """One pass over every endpoint: drop expired rows, deliver the due ones
        the rate limits allow (stopping an endpoint at its first retryable
        failure), refresh the gauges. Returns how many alerts were delivered."""
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
        with self._pass_locks[name]:
            now = self._clock()
            self._expire(endpoint, now)
            if self._paused_until[name] > now:
                return 0, self._paused_until[name]
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
                if outcome.kind == "delivered":
                    self._outbox.finish(entry.seq, DELIVERED, now)
                    self.metrics.webhook_deliveries.labels(endpoint=name).inc()
                    delivered += 1
                    continue
                if outcome.reason is not None:
                    self.metrics.webhook_failures.labels(endpoint=name, reason=outcome.reason).inc()
                if outcome.kind == "drop":
                    self._outbox.finish(entry.seq, DROPPED, now, outcome.detail)
                    self.metrics.webhook_dropped.labels(endpoint=name).inc()
                    log.error(
                        "webhook %s: dropped alert %s (%s): %s",
                        name,
                        entry.alert_id,
                        entry.alert.get("rule"),
                        outcome.detail,
                    )
                    continue
                failures = entry.attempts + 1
                if outcome.retry_after_seconds is not None:
                    delay = min(outcome.retry_after_seconds, endpoint.max_age_seconds)
                else:
                    delay = backoff_seconds(
                        failures, endpoint.backoff_base_seconds, endpoint.backoff_cap_seconds, self._rng
                    )
                self._outbox.retry(entry.seq, failures, now + delay, outcome.detail)
                self._paused_until[name] = now + delay
                log.warning(
                    "webhook %s: attempt %d for alert %s failed (%s); retrying in %.1f s",
                    name,
                    failures,
                    entry.alert_id,
                    outcome.detail,
                    delay,
                )
                return delivered, now + delay
            if len(entries) == BATCH_ROWS:
                return delivered, now
            return delivered, self._outbox.next_attempt_at(name)

    def _attempt(self, endpoint: Endpoint, entry: Entry) -> Outcome:
        """POST one alert and classify the answer."""
        try:
            body = render(endpoint.format, entry.alert, endpoint.name, endpoint.external_url)
        except (KeyError, TypeError, ValueError) as exc:
            return Outcome("drop", detail=f"cannot render it as {endpoint.format}: {exc!r}")
        headers = {"Content-Type": "application/json", ALERT_ID_HEADER: entry.alert_id}
        if endpoint.secret is not None:
            headers.update(sign(endpoint.secret, int(self._clock()), body))
        try:
            response = self._client.post(
                endpoint.url, content=body, headers=headers, timeout=endpoint.timeout_seconds
            )
        except httpx.TimeoutException as exc:
            return Outcome(
                "retry", "timeout", f"no answer within {endpoint.timeout_seconds:g} s ({type(exc).__name__})"
            )
        except (httpx.TransportError, httpx.InvalidURL) as exc:
            return Outcome("retry", "connection", self._redact.scrub(f"{type(exc).__name__}: {exc}"))
        status = response.status_code
        if 200 <= status < 300:
            return Outcome("delivered")
        answer = self._redact.scrub(" ".join(response.text[:200].split()))
        detail = f"HTTP {status} {answer}".rstrip()
        retry_after = None
        if status in RETRY_AFTER_STATUSES:
            retry_after = retry_after_seconds(response.headers.get("Retry-After"), self._clock())
        if status >= 500:
            return Outcome("retry", "http_5xx", detail, retry_after)
        if status in RETRY_STATUSES:
            return Outcome("retry", "http_4xx", detail, retry_after)
        if 400 <= status < 500:
            return Outcome("drop", "http_4xx", f"{detail} (a client error: not retried)")
        return Outcome("drop", None, f"{detail} (redirects are not followed: configure the final URL)")

    # ---- upkeep ---------------------------------------------------------------------------

    def _expire(self, endpoint: Endpoint, now: float) -> None:
        ids = self._outbox.expire(endpoint.name, now - endpoint.max_age_seconds, now)
        if ids:
            self.metrics.webhook_dropped.labels(endpoint=endpoint.name).inc(len(ids))
            shown = ", ".join(ids[:10]) + (f" and {len(ids) - 10} more" if len(ids) > 10 else "")
            log.error(
                "webhook %s: dropped %d alert(s) undelivered for over max_age_seconds=%g: %s",
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
                        "webhook outbox: pruned %d finished rows older than %g s",
                        pruned,
                        self.retention_seconds,
                    )
            self._refresh_gauges(now)

    def _refresh_gauges(self, now: float) -> None:
        pending = self._outbox.pending()
        for endpoint in self.endpoints:
            count, oldest = pending.get(endpoint.name, (0, now))
            self.metrics.webhook_backlog.labels(endpoint=endpoint.name).set(count)
            self.metrics.webhook_oldest_pending.labels(endpoint=endpoint.name).set(max(0.0, now - oldest))


def retry_after_seconds(value: str | None, now: float) -> float | None:
    """A Retry-After header (delta seconds or an HTTP date) as seconds from ``now``; None if absent or bad."""
    if value is None:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return max(0.0, when.timestamp() - now)


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
