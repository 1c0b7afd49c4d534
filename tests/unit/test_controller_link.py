"""localkafka.controller_link: the proxy forwards whole Kafka request frames,
and while heartbeats are dropped closes a connection that sends a
BrokerHeartbeat (api key 63) before the request reaches the controller,
leaving every other connection and request alone. Real sockets on loopback;
the controller is an echo server that records what reached it."""

from __future__ import annotations

import socket
import struct
import threading
from collections.abc import Iterator

import pytest

from localkafka.controller_link import BROKER_HEARTBEAT_API_KEY, ControllerLinkProxy

API_VERSIONS, FETCH = 18, 1


def frame(api_key: int, correlation_id: int, body: bytes = b"x" * 10) -> bytes:
    """A request frame: size, then a v1 header (api key, version, correlation id, client id)."""
    header = struct.pack(">hhih", api_key, 0, correlation_id, 1) + b"b"
    return struct.pack(">i", len(header) + len(body)) + header + body


class EchoController:
    """Echoes every byte back and keeps what it received."""

    def __init__(self) -> None:
        self.received = bytearray()
        self._lock = threading.Lock()
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._echo, args=(conn,), daemon=True).start()

    def _echo(self, conn: socket.socket) -> None:
        with conn:
            while data := conn.recv(65536):
                with self._lock:
                    self.received += data
                conn.sendall(data)


@pytest.fixture
def link() -> Iterator[tuple[ControllerLinkProxy, EchoController]]:
    controller = EchoController()
    with ControllerLinkProxy(controller.port) as proxy:
        yield proxy, controller
    controller.listener.close()


def _connect(proxy: ControllerLinkProxy) -> socket.socket:
    return socket.create_connection(("127.0.0.1", proxy.port), timeout=5)


def _read(sock: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        if not chunk:
            break
        data += chunk
    return data


def test_frames_pass_whole_even_when_sent_a_byte_at_a_time(link):
    proxy, controller = link
    request = frame(API_VERSIONS, 1) + frame(BROKER_HEARTBEAT_API_KEY, 2)
    with _connect(proxy) as sock:
        for i in range(len(request)):
            sock.sendall(request[i : i + 1])
        assert _read(sock, len(request)) == request
    assert bytes(controller.received) == request
    assert proxy.counts.heartbeats_dropped == 0


def test_a_heartbeat_while_dropping_closes_its_connection_before_the_controller_sees_it(link):
    proxy, controller = link
    proxy.drop_heartbeats(True)
    with _connect(proxy) as sock:
        sock.sendall(frame(API_VERSIONS, 1))
        assert _read(sock, len(frame(API_VERSIONS, 1))) == frame(API_VERSIONS, 1)
        sock.sendall(frame(BROKER_HEARTBEAT_API_KEY, 2))
        assert sock.recv(100) == b""  # closed
    assert bytes(controller.received) == frame(API_VERSIONS, 1)
    assert proxy.counts.heartbeats_dropped == 1


def test_other_connections_flow_while_heartbeats_are_dropped_and_heartbeats_flow_again_after(link):
    proxy, controller = link
    proxy.drop_heartbeats(True)
    with _connect(proxy) as fetcher:
        fetcher.sendall(frame(FETCH, 7))
        assert _read(fetcher, len(frame(FETCH, 7))) == frame(FETCH, 7)
    proxy.drop_heartbeats(False)
    with _connect(proxy) as heartbeats:
        heartbeats.sendall(frame(BROKER_HEARTBEAT_API_KEY, 8))
        assert _read(heartbeats, len(frame(BROKER_HEARTBEAT_API_KEY, 8))) == frame(
            BROKER_HEARTBEAT_API_KEY, 8
        )
    assert bytes(controller.received) == frame(FETCH, 7) + frame(BROKER_HEARTBEAT_API_KEY, 8)
    assert proxy.counts.heartbeats_dropped == 0
