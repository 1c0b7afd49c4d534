"""fencewatch.listener_tls: a listener is said to speak TLS only when a TLS
handshake with it completes (a plaintext listener, a closed port and a
listener that never answers do not)."""

from __future__ import annotations

import socket
import ssl
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from fencewatch.listener_tls import addresses, tls_listener
from localkafka.secure import make_certificates


def test_bootstrap_lists_as_librdkafka_takes_them() -> None:
    assert addresses("a:9092, SASL_SSL://b:9094,[::1]:9093,bad,c:x") == [
        ("a", 9092),
        ("b", 9094),
        ("::1", 9093),
    ]


def serve(handle: Callable[[socket.socket], None]) -> Iterator[str]:
    """A loopback listener handing each connection to ``handle``; yields host:port."""
    server = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()

    def loop() -> None:
        server.settimeout(0.2)
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except TimeoutError:
                continue
            with conn:
                handle(conn)

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{server.getsockname()[1]}"
    finally:
        stop.set()
        thread.join()
        server.close()


@pytest.fixture
def plaintext_listener() -> Iterator[str]:
    def kafka_like(conn: socket.socket) -> None:
        # Kafka reads a ClientHello's first bytes as a request size far over its limit and closes.
        conn.settimeout(2)
        conn.recv(4)

    yield from serve(kafka_like)


@pytest.fixture
def tls_listener_address(tmp_path: Path) -> Iterator[str]:
    certificates = make_certificates(tmp_path)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(tmp_path / "broker.pem", tmp_path / "broker.key")

    def handshake(conn: socket.socket) -> None:
        conn.settimeout(2)
        try:
            with context.wrap_socket(conn, server_side=True) as tls:
                tls.recv(1)
        except (OSError, ssl.SSLError):
            pass

    assert certificates.ca.exists()
    yield from serve(handshake)


def test_a_tls_listener_is_named(plaintext_listener: str, tls_listener_address: str) -> None:
    assert tls_listener(f"{plaintext_listener},{tls_listener_address}") == tls_listener_address


def test_a_plaintext_listener_or_a_closed_port_is_not_tls(plaintext_listener: str) -> None:
    with socket.create_server(("127.0.0.1", 0)) as taken:
        closed = f"127.0.0.1:{taken.getsockname()[1]}"
    assert tls_listener(f"{plaintext_listener},{closed}", timeout_seconds=2) is None
