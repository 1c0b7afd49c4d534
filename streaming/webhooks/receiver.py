"""A small webhook receiver: the other end of :mod:`streaming.webhooks.dispatcher`,
for docker-compose, end-to-end tests and trying an endpoint config out.

It accepts POSTs carrying any of the three fencewatch formats (generic JSON,
Alertmanager v4, Slack-style text) on any path, and Alertmanager's own
(unsigned) POSTs on ``/alertmanager``. With a secret, every other request must
carry a valid ``X-Fencewatch-Signature`` with a timestamp within
``max_skew_seconds`` of now, or gets 401. Requests are de-duplicated by
(path, ``X-Fencewatch-Alert-Id``): a repeat gets 200 but is recorded once,
so several endpoints may share one receiver on different paths.

Each accepted request is appended to ``received`` and, when an output is
given, written as one JSON line: ``received_at`` (Unix seconds), ``path``,
``format``, ``headers`` (the fencewatch ones, Content-Type, User-Agent) and
``body`` (parsed JSON).

``answer_with(status)`` makes it answer every request with that status and
record nothing, to stand in for a failing endpoint.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import IO, Any

import orjson

from streaming.webhooks.signing import ALERT_ID_HEADER, SIGNATURE_HEADER, TIMESTAMP_HEADER, verify

ALERTMANAGER_PATH = "/alertmanager"
MAX_BODY_BYTES = 1 << 20
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
    ):
        self.secret = secret
        self.output = output
        self.max_skew_seconds = max_skew_seconds
        self.clock = clock
        self.received: list[dict[str, Any]] = []
        self.requests = 0  # every request, accepted or not
        self.duplicates = 0
        self.rejected = 0
        self._seen: set[tuple[str, str]] = set()
        self._forced: tuple[int, float | None] | None = None
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer((bind, port), _handler(self))
        self._server.daemon_threads = True
        self._connections: set[socket.socket] = set()
        self._thread = threading.Thread(
            # A short poll interval: stop() returns within it.
            target=self._server.serve_forever,
            kwargs={"poll_interval": 0.05},
            name="fencewatch-webhook-receiver",
            daemon=True,
        )
        self._thread.start()

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

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
        self._server.shutdown()
        self._server.server_close()
        with self._lock:
            connections, self._connections = list(self._connections), set()
        for conn in connections:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
        self._thread.join(5)

    def _opened(self, conn: socket.socket) -> None:
        with self._lock:
            self._connections.add(conn)

    def _closed(self, conn: socket.socket) -> None:
        with self._lock:
            self._connections.discard(conn)

    def __enter__(self) -> WebhookReceiver:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def handle(self, path: str, headers: dict[str, str], body: bytes) -> tuple[int, dict[str, str], str]:
        """Judge one POST; returns (status, extra response headers, response text)."""
        with self._lock:
            self.requests += 1
            forced = self._forced
        if forced is not None:
            status, retry_after = forced
            extra = {"Retry-After": f"{retry_after:g}"} if retry_after is not None else {}
            return status, extra, f"answering {status} as told\n"
        get = {k.lower(): v for k, v in headers.items()}.get
        path_only = path.split("?", 1)[0]
        if self.secret is not None and path_only != ALERTMANAGER_PATH:
            problem = verify(
                self.secret,
                get(TIMESTAMP_HEADER.lower()),
                get(SIGNATURE_HEADER.lower()),
                body,
                self.clock(),
                self.max_skew_seconds,
            )
            if problem is not None:
                with self._lock:
                    self.rejected += 1
                return 401, {}, f"bad signature: {problem}\n"
        try:
            parsed = orjson.loads(body)
        except orjson.JSONDecodeError:
            return 400, {}, "body is not JSON\n"
        fmt = payload_format(parsed)
        if fmt is None:
            return 400, {}, "body is none of json (SPEC alert), alertmanager (v4) or slack ({text})\n"
        alert_id = get(ALERT_ID_HEADER.lower())
        record = {
            "received_at": self.clock(),
            "path": path_only,
            "format": fmt,
            "headers": {h: get(h.lower()) for h in RECORDED_HEADERS if get(h.lower()) is not None},
            "body": parsed,
        }
        with self._lock:
            if alert_id is not None:
                if (path_only, alert_id) in self._seen:
                    self.duplicates += 1
                    return 200, {}, "duplicate\n"
                self._seen.add((path_only, alert_id))
            self.received.append(record)
            if self.output is not None:
                self.output.write(orjson.dumps(record).decode() + "\n")
                self.output.flush()
        return 200, {}, "ok\n"


def _handler(receiver: WebhookReceiver) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive: the dispatcher reuses its connections
        # Headers and body go out in separate writes; with Nagle on, the body
        # waits for the client's delayed ACK (~40 ms per request).
        disable_nagle_algorithm = True

        def setup(self) -> None:
            super().setup()
            receiver._opened(self.connection)

        def finish(self) -> None:
            receiver._closed(self.connection)
            super().finish()

        def do_POST(self) -> None:
            try:
                length = int(self.headers.get("Content-Length", ""))
            except ValueError:
                self._answer(411, {}, "Content-Length required\n")
                return
            if length < 0 or length > MAX_BODY_BYTES:
                self._answer(413, {}, f"body over {MAX_BODY_BYTES} bytes\n")
                return
            body = self.rfile.read(length)
            status, extra, text = receiver.handle(self.path, dict(self.headers.items()), body)
            self._answer(status, extra, text)

        def _answer(self, status: int, extra: dict[str, str], text: str) -> None:
            data = text.encode()
            self.send_response(status)
            for key, value in extra.items():
                self.send_header(key, value)
            self.send_header("Content-Type", "text/plain; charset=utf-8")
            self.send_header("Content-Length", str(len(data)))
            if status in (411, 413):
                self.send_header("Connection", "close")
                self.close_connection = True
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: Any) -> None:
            pass  # one line per request on stderr is noise; the output file is the record

    return Handler
