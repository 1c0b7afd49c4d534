"""A small POST-only HTTP/1.1 server that slow or hostile clients cannot exhaust.

It is aiohttp's low-level server on one event-loop thread of its own, behind a
synchronous ``handle(path, headers, body) -> Answer``. A connection costs a
socket and a few kilobytes, never a thread, so a thousand clients that stall
leave the server answering everyone else. ``ServerLimits`` bounds the rest:

- ``max_connections``: connections open at once. One more is answered
  503 (``Retry-After: 1``) and closed at once.
- ``idle_timeout_seconds``: a connection must complete a request's headers
  within this time of opening, or of its previous answer, or it is closed
  (aiohttp's keep-alive timer; since aiohttp 3.14.4 it also runs before the
  first request, and bytes trickled in do not reset it).
- ``body_timeout_seconds``: the whole body must arrive within this time of
  the headers, or the answer is 408 and the connection is closed.
- ``max_body_bytes``: a larger declared or streamed body gets 413 and the
  connection is closed.

A request line or header field over 8190 bytes gets aiohttp's own 400.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError
from aiohttp.streams import StreamReader

_READ_CHUNK_BYTES = 64 * 1024
_STOP_TIMEOUT_SECONDS = 5.0
# After a 408 or 413 the rest of the body is read and dropped for this long
# before the close, so that the client's unread bytes do not make the close a
# reset that destroys the answer (aiohttp's default: 10 s more per slow client).
_LINGER_SECONDS = 1.0


class _WithoutClientFaults(logging.Filter):
    """aiohttp logs every malformed request it answers 400 with a traceback.
    The fault and the answer are the client's, and a client could fill the log
    with them, so those records are dropped; the server's own errors stay."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.exc_info and isinstance(record.exc_info[1], HttpProcessingError))


_LOG = logging.getLogger(__name__)
_LOG.addFilter(_WithoutClientFaults())


class Answer(NamedTuple):
    """What to answer: a status, extra response headers, and a short text body."""

    status: int
    headers: Mapping[str, str]
    text: str


# (path without the query, headers as (name, value) pairs in arrival order, body) -> Answer
Handler = Callable[[str, Sequence[tuple[str, str]], bytes], Answer]


@dataclass(frozen=True)
class ServerLimits:
    """How much one client may take; see the module docstring."""

    max_connections: int = 1024
    max_body_bytes: int = 1 << 20
    body_timeout_seconds: float = 10.0
    # Above httpx's 5 s keep-alive expiry, so the dispatcher closes an idle
    # connection before the server does and never reuses one being closed.
    idle_timeout_seconds: float = 15.0

    def __post_init__(self) -> None:
        for name in ("max_connections", "max_body_bytes", "body_timeout_seconds", "idle_timeout_seconds"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be above 0, got {getattr(self, name)}")


class BoundedHttpServer:
    """Serves ``handle`` on ``bind:port`` (0: a free port, see ``.port``) from a
    daemon thread until ``stop()``. The constructor raises OSError when it
    cannot listen."""

    def __init__(
        self,
        handle: Handler,
        bind: str,
        port: int,
        limits: ServerLimits,
        *,
        thread_name: str = "fencewatch-http",
    ):
        self._handle = handle
        self.limits = limits
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name=thread_name, daemon=True)
        self._thread.start()
        try:
            self._connections, self._listener = asyncio.run_coroutine_threadsafe(
                self._listen(bind, port), self._loop
            ).result()
        except BaseException:
            self._halt()
            raise
        self.port = int(self._listener.sockets[0].getsockname()[1])

    @property
    def open_connections(self) -> int:
        """Connections admitted and not yet closed."""
        return self._connections.admitted

    @property
    def turned_away(self) -> int:
        """Connections answered 503 because ``max_connections`` were open."""
        return self._connections.turned_away

    def stop(self) -> None:
        """Stop listening and cut every open connection, as a crash would; idempotent."""
        if self._loop.is_closed():
            return
        asyncio.run_coroutine_threadsafe(self._close(), self._loop).result(_STOP_TIMEOUT_SECONDS)
        self._halt()

    async def _listen(self, bind: str, port: int) -> tuple[_CountedConnections, asyncio.Server]:
        connections = _CountedConnections(
            self._serve,
            max_connections=self.limits.max_connections,
            keepalive_timeout=self.limits.idle_timeout_seconds,
            lingering_time=_LINGER_SECONDS,
            logger=_LOG,
            access_log=None,
        )
        # The kernel queues a burst of connections up to the backlog while the loop accepts them.
        listener = await self._loop.create_server(
            connections.protocol, bind, port, backlog=self.limits.max_connections
        )
        return connections, listener

    async def _close(self) -> None:
        self._listener.close()
        self._connections.abort_all()
        await self._listener.wait_closed()
        pending = [task for task in asyncio.all_tasks() if task is not asyncio.current_task()]
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)

    def _halt(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(_STOP_TIMEOUT_SECONDS)
        self._loop.close()

    async def _serve(self, request: web.BaseRequest) -> web.StreamResponse:
        limits = self.limits
        if request.method != "POST":
            return _response(Answer(405, {"Allow": "POST"}, "only POST is served here\n"))
        too_large = Answer(413, {}, f"body over {limits.max_body_bytes} bytes\n")
        if request.content_length is not None and request.content_length > limits.max_body_bytes:
            return _response(too_large, close=True)
        try:
            async with asyncio.timeout(limits.body_timeout_seconds):
                body = await _read_body(request.content, limits.max_body_bytes)
        except TimeoutError:
            late = Answer(408, {}, f"body not received within {limits.body_timeout_seconds:g} s\n")
            return _response(late, close=True)
        if body is None:
            return _response(too_large, close=True)
        path = request.raw_path.split("?", 1)[0]
        return _response(self._handle(path, list(request.headers.items()), body))


async def _read_body(content: StreamReader, max_bytes: int) -> bytes | None:
    """The whole body, or None as soon as it passes ``max_bytes`` (chunked bodies
    declare no length, so the bound is checked as it arrives)."""
    chunks: list[bytes] = []
    size = 0
    while chunk := await content.read(_READ_CHUNK_BYTES):
        size += len(chunk)
        if size > max_bytes:
            return None
        chunks.append(chunk)
    return b"".join(chunks)


def _response(answer: Answer, *, close: bool = False) -> web.Response:
    response = web.Response(status=answer.status, text=answer.text, headers=dict(answer.headers))
    if close:
        # The rest of the request is unread: the connection cannot carry another one.
        response.force_close()
    return response


class _CountedConnections(web.Server):
    """aiohttp's connection manager, admitting at most ``max_connections`` at once."""

    def __init__(self, handler: Any, *, max_connections: int, **kwargs: Any):
        super().__init__(handler, **kwargs)
        self._max_connections = max_connections
        self.admitted = 0
        self.turned_away = 0

    def protocol(self) -> asyncio.BaseProtocol:
        """The protocol for one accepted connection (the event loop's protocol factory)."""
        if self.admitted >= self._max_connections:
            self.turned_away += 1
            return _TurnAway()
        # Counted here, not in connection_made, so a burst accepted in one loop
        # iteration cannot overshoot the bound.
        self.admitted += 1
        return self()

    def connection_lost(self, handler: web.RequestHandler, exc: BaseException | None = None) -> None:
        super().connection_lost(handler, exc)
        self.admitted -= 1

    def abort_all(self) -> None:
        for handler in self.connections:
            if handler.transport is not None:
                handler.transport.abort()


_TOO_MANY = b"too many connections; retry shortly\n"
_TOO_MANY_RESPONSE = (
    b"HTTP/1.1 503 Service Unavailable\r\n"
    b"Content-Type: text/plain; charset=utf-8\r\n"
    b"Content-Length: " + str(len(_TOO_MANY)).encode() + b"\r\n"
    b"Retry-After: 1\r\n"
    b"Connection: close\r\n\r\n" + _TOO_MANY
)


class _TurnAway(asyncio.Protocol):
    """A connection over the bound: answered 503 before it is read, then closed."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.WriteTransport)
        transport.write(_TOO_MANY_RESPONSE)
        transport.close()
