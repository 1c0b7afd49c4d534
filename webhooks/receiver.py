"""A small webhook receiver: the other end of :mod:`webhooks.dispatcher`,
for docker-compose, end-to-end tests and trying an endpoint config out.

It accepts POSTs carrying any of the three fencewatch formats (generic JSON,
Alertmanager v4, Slack-style text) on any path. With a secret it trusts only
what is signed: every request on every path must carry a valid ``v1``
signature over its timestamp, alert id and body (:mod:`webhooks.signing`)
with the timestamp within ``max_skew_seconds`` of now. An unsigned request, or
one whose signature does not verify, gets 401; a signing header that cannot be
read gets 400. Each refusal is answered with a one-line reason. Alertmanager
cannot sign, so its own notifications go to a receiver without a secret.

Requests are de-duplicated by (path, ``X-Fencewatch-Alert-Id``): a repeat gets
200 but is recorded once, so several endpoints may share one receiver on
different paths.

Each accepted request is appended to ``received`` and, when an output is
given, written as one JSON line: ``received_at`` (Unix seconds), ``path``,
``format``, ``headers`` (the fencewatch ones, Content-Type, User-Agent) and
``body`` (parsed JSON).

``answer_with(status)`` makes it answer every request with that status and
record nothing, to stand in for a failing endpoint.

HTTP itself (connection, body-size and time limits) is
:mod:`webhooks.http_server`'s job.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from typing import IO, Any

import orjson

from webhooks.http_server import Answer, BoundedHttpServer, ServerLimits
from webhooks.signing import (
    ALERT_ID_HEADER,
    SIGNATURE_HEADER,
    TIMESTAMP_HEADER,
    MalformedHeader,
    check_alert_id,
    verify,
)

RECORDED_HEADERS = (ALERT_ID_HEADER, TIMESTAMP_HEADER, SIGNATURE_HEADER, "Content-Type", "User-Agent")


def payload_format(body: Any) -> str | None:
    """Which format a parsed body is in (json | alertmanager | slack), None if none."""
    if not isinstance(body, dict):
        return None
    if body.get("version") == "4" and isinstance(body.get("alerts"), list):
        return "alertmanager"
    if isinstance(body.get("text"), str):
        return "slack"
    if isinstance(body.get("alert_id"), str) and "rule" in body:
        return "json"
    return None


class WebhookReceiver:
    """An HTTP server in a daemon thread; ``port`` 0 picks a free one (see ``.port``).

    ``secret``: check signatures (None: accept unsigned requests). ``output``:
    a text stream each accepted request is written to as a JSON line.
    ``clock`` gives Unix seconds, for the signature's timestamp window.
    ``limits``: connections, body size and time limits.
    """

    def __init__(
        self,
        port: int = 0,
        bind: str = "127.0.0.1",
        *,
        secret: bytes | None = None,
        output: IO[str] | None = None,
        max_skew_seconds: float | None = 300.0,
        clock: Callable[[], float] = time.time,
        limits: ServerLimits | None = None,
    ):
        self.secret = secret
        self.output = output
        self.max_skew_seconds = max_skew_seconds
        self.clock = clock
        self.received: list[dict[str, Any]] = []
        self.requests = 0  # every request, accepted or not
        self.duplicates = 0
        self.rejected = 0  # answered 4xx by handle(): a bad signature, header or body
        self._seen: set[tuple[str, str]] = set()
        self._forced: tuple[int, float | None] | None = None
        self._lock = threading.Lock()
        self.server = BoundedHttpServer(
            self.handle, bind, port, limits or ServerLimits(), thread_name="fencewatch-webhook-receiver"
        )

    @property
    def port(self) -> int:
        return self.server.port

    def url(self, path: str = "/") -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def answer_with(self, status: int | None, retry_after_seconds: float | None = None) -> None:
        """Answer every request with ``status`` (and Retry-After, if given) and record
        nothing; None restores normal service."""
        with self._lock:
            self._forced = None if status is None else (status, retry_after_seconds)

    def stop(self) -> None:
        """Stop listening and cut open keep-alive connections, so a stopped receiver
        answers nothing (as a crashed one would)."""
        self.server.stop()

    def __enter__(self) -> WebhookReceiver:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def handle(self, path: str, headers: Sequence[tuple[str, str]], body: bytes) -> Answer:
        """Judge one POST (``headers`` as (name, value) pairs) and record it if accepted."""
        with self._lock:
            self.requests += 1
            forced = self._forced
        if forced is not None:
            status, retry_after = forced
            extra = {"Retry-After": f"{retry_after:g}"} if retry_after is not None else {}
            return Answer(status, extra, f"answering {status} as told\n")
        try:
            recorded = _recorded_headers(headers)
            alert_id = recorded.get(ALERT_ID_HEADER)
            if self.secret is None and alert_id is not None:
                check_alert_id(alert_id)
        except MalformedHeader as exc:
            return self._refuse(400, str(exc))
        if self.secret is not None:
            rejection = verify(
                self.secret,
                recorded.get(TIMESTAMP_HEADER),
                alert_id,
                recorded.get(SIGNATURE_HEADER),
                body,
                self.clock(),
                self.max_skew_seconds,
            )
            if rejection is not None:
                return self._refuse(rejection.status, rejection.reason)
        try:
            parsed = orjson.loads(body)
        except orjson.JSONDecodeError:
            return self._refuse(400, "body is not UTF-8 JSON")
        fmt = payload_format(parsed)
        if fmt is None:
            return self._refuse(400, "body is none of json (SPEC alert), alertmanager (v4) or slack ({text})")
        record = {
            "received_at": self.clock(),
            "path": path,
            "format": fmt,
            "headers": recorded,
            "body": parsed,
        }
        with self._lock:
            if alert_id is not None:
                if (path, alert_id) in self._seen:
                    self.duplicates += 1
                    return Answer(200, {}, "duplicate\n")
                self._seen.add((path, alert_id))
            self.received.append(record)
            if self.output is not None:
                self.output.write(orjson.dumps(record).decode() + "\n")
                self.output.flush()
        return Answer(200, {}, "ok\n")

    def _refuse(self, status: int, reason: str) -> Answer:
        with self._lock:
            self.rejected += 1
        return Answer(status, {}, reason + "\n")


def _recorded_headers(headers: Sequence[tuple[str, str]]) -> dict[str, str]:
    """The RECORDED_HEADERS present, under their canonical names. MalformedHeader
    if one is repeated (which copy would count is ambiguous) or is not printable ASCII."""
    canonical = {name.lower(): name for name in RECORDED_HEADERS}
    found: dict[str, str] = {}
    for name, value in headers:
        known = canonical.get(name.lower())
        if known is None:
            continue
        if known in found:
            raise MalformedHeader(f"{known} is given more than once")
        # Values arrive decoded with surrogate escapes, so bytes that are not UTF-8 fail here too.
        if not (value.isascii() and value.replace("\t", " ").isprintable()):
            raise MalformedHeader(f"{known} is not printable ASCII")
        found[known] = value
    return found
