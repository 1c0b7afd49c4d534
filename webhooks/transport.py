"""One webhook POST under a deadline for the whole exchange.

httpx's ``timeout`` bounds each network operation, not the request: a server
that sends one byte every two seconds never trips a five-second read timeout
and holds the request as long as it likes. Here each request runs as an
asyncio task under ``asyncio.timeout(timeout_seconds)``: at the deadline the
task is cancelled wherever it is (connecting, sending, waiting for the status
line, reading headers or the body) and httpcore closes its connection. Each
single operation is bounded by httpx's own timeout of the same length too.

Each calling thread gets its own event loop and connection pool (an asyncio
client belongs to the loop it runs on), kept between calls so that
connections are reused. Redirects are never followed, and answers are asked
for uncompressed (``Accept-Encoding: identity``): only an excerpt of the body
is kept, read as it arrives.
"""

from __future__ import annotations

import asyncio
import threading
from dataclasses import dataclass

import httpx

# Enough of an error page to tell what went wrong; the rest is not read.
BODY_EXCERPT_BYTES = 2048


@dataclass(frozen=True, slots=True)
class Reply:
    """An endpoint's answer: status, headers and the first ``BODY_EXCERPT_BYTES`` of the body."""

    status: int
    headers: httpx.Headers
    body: bytes


class PostFailed(Exception):
    """No answer: ``kind`` is ``timeout`` (the deadline passed) or ``connection``
    (refused, reset, unreachable, not HTTP); ``detail`` says what happened and
    may hold the URL: scrub it before logging."""

    def __init__(self, kind: str, detail: str):
        super().__init__(detail)
        self.kind = kind
        self.detail = detail


@dataclass(slots=True)
class _Session:
    runner: asyncio.Runner
    client: httpx.AsyncClient


class DeadlinePoster:
    """POSTs from any number of threads, each request within its deadline. :meth:`close` when done."""

    def __init__(self, user_agent: str):
        self._user_agent = user_agent
        self._local = threading.local()
        self._sessions: list[_Session] = []
        self._lock = threading.Lock()

    def post(self, url: str, body: bytes, headers: dict[str, str], timeout_seconds: float) -> Reply:
        """POST ``body``; the answer, or :class:`PostFailed` when there is none within ``timeout_seconds``."""
        session = self._session()
        headers = {"Accept-Encoding": "identity", **headers}
        return session.runner.run(self._post(session.client, url, body, headers, timeout_seconds))

    def close(self) -> None:
        """Close every thread's connections and loop; call it once no thread posts any more."""
        with self._lock:
            sessions, self._sessions = self._sessions, []
        for session in sessions:
            session.runner.run(session.client.aclose())
            session.runner.close()

    def _session(self) -> _Session:
        session: _Session | None = getattr(self._local, "session", None)
        if session is None:
            client = httpx.AsyncClient(headers={"User-Agent": self._user_agent}, follow_redirects=False)
            session = _Session(asyncio.Runner(), client)
            self._local.session = session
            with self._lock:
                self._sessions.append(session)
        return session

    @staticmethod
    async def _post(
        client: httpx.AsyncClient, url: str, body: bytes, headers: dict[str, str], timeout_seconds: float
    ) -> Reply:
        try:
            async with (
                asyncio.timeout(timeout_seconds),
                client.stream(
                    "POST", url, content=body, headers=headers, timeout=timeout_seconds
                ) as response,
            ):
                excerpt = bytearray()
                async for chunk in response.aiter_raw():
                    excerpt += chunk
                    if len(excerpt) >= BODY_EXCERPT_BYTES:
                        break  # leaving the block closes the connection: the rest is never read
                return Reply(response.status_code, response.headers, bytes(excerpt[:BODY_EXCERPT_BYTES]))
        except (TimeoutError, httpx.TimeoutException):
            raise PostFailed("timeout", f"no complete answer within {timeout_seconds:g} s") from None
        except (httpx.TransportError, httpx.InvalidURL) as exc:
            raise PostFailed("connection", f"{type(exc).__name__}: {exc}") from None
