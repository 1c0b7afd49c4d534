"""A real HTTP endpoint whose answers a test scripts per alert id, for the webhook
delivery tests: http.server in a thread on 127.0.0.1 and a random port.

    endpoint = ScriptedEndpoint()
    endpoint.script("alert-1", Script(500, body="boom"))
    endpoint.script("alert-2", Script(302, headers={"Location": "http://elsewhere/"}))
    endpoint.script("alert-3", Script(200, drip_seconds=0.25))   # one byte at a time
    ...
    endpoint.requests   # alert ids in the order their requests arrived
    endpoint.stop()

Unscripted alerts get 200 "ok". A script may also hold its answer until the
test releases it (``hold``), to catch the sender mid-request.
"""

from __future__ import annotations

import contextlib
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

ALERT_ID_HEADER = "X-Fencewatch-Alert-Id"


@dataclass
class Script:
    """How to answer: ``status``, extra ``headers`` and ``body``; ``drip_seconds``:
    send the response one byte per interval, from its status line on or, with
    ``drip_body_only``, once the headers went out whole; ``hold``: answer only
    once the event is set."""

    status: int = 200
    body: str = "ok\n"
    headers: dict[str, str] = field(default_factory=dict)
    drip_seconds: float | None = None
    drip_body_only: bool = False
    hold: threading.Event | None = None


@dataclass
class Cut:
    """A dripped response the client hung up on: ``sent`` of ``total`` bytes had gone out."""

    alert_id: str
    sent: int
    total: int


class ScriptedEndpoint:
    def __init__(self) -> None:
        self.requests: list[str] = []
        self.cuts: list[Cut] = []
        self.in_flight = 0
        self._scripts: dict[str, Script] = {}
        self._default = Script()
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self._server.daemon_threads = True
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self._thread.start()

    def url(self, path: str = "/hook") -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}{path}"

    def script(self, alert_id: str | None, script: Script) -> None:
        """Answer ``alert_id`` (None: every unscripted alert) with ``script``."""
        with self._lock:
            if alert_id is None:
                self._default = script
            else:
                self._scripts[alert_id] = script

    def count(self, alert_id: str) -> int:
        with self._lock:
            return self.requests.count(alert_id)

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5)

    def _arrived(self, alert_id: str) -> Script:
        with self._lock:
            self.requests.append(alert_id)
            self.in_flight += 1
            return self._scripts.get(alert_id, self._default)

    def _answered(self) -> None:
        with self._lock:
            self.in_flight -= 1

    def _cut(self, cut: Cut) -> None:
        with self._lock:
            self.cuts.append(cut)


def _handler(endpoint: ScriptedEndpoint) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        disable_nagle_algorithm = True

        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length", "0")))
            alert_id = self.headers.get(ALERT_ID_HEADER, "")
            script = endpoint._arrived(alert_id)
            try:
                if script.hold is not None:
                    script.hold.wait(60)
                self._answer(alert_id, script)
            finally:
                endpoint._answered()

        def _answer(self, alert_id: str, script: Script) -> None:
            body = script.body.encode()
            head = [f"HTTP/1.1 {script.status} Scripted", f"Content-Length: {len(body)}"]
            head += [f"{name}: {value}" for name, value in script.headers.items()]
            head_bytes = ("\r\n".join(head) + "\r\n\r\n").encode()
            data = head_bytes + body
            if script.drip_seconds is None:
                self.wfile.write(data)
                return
            self.close_connection = True
            start = len(head_bytes) if script.drip_body_only else 0
            self.connection.sendall(data[:start])
            for sent in range(start, len(data)):
                try:
                    self.connection.sendall(data[sent : sent + 1])
                except OSError:
                    endpoint._cut(Cut(alert_id, sent, len(data)))
                    return
                time.sleep(script.drip_seconds)

        def log_message(self, format: str, *args: Any) -> None:
            pass

        def finish(self) -> None:
            # The client may have hung up mid-answer; that is what some tests provoke.
            with contextlib.suppress(OSError):
                super().finish()

    return Handler
