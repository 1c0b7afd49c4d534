"""Does a Kafka listener speak TLS? Asked when a plaintext client was cut off.

A broker's SSL or SASL_SSL listener reads a plaintext client's first request
as the start of a TLS handshake, fails it and closes the connection: the
client sees only a disconnect (librdkafka: "connection closed by peer ... in
state APIVERSION_QUERY"; kafka-python: "socket disconnected"), as it would
from a broker going down. A TLS handshake of our own, one that trusts any
certificate and sends nothing after it, tells the two apart: a plaintext
listener cannot complete it (it reads the ClientHello as an oversized request
and closes), a TLS one does.
"""

from __future__ import annotations

import socket
import ssl

HANDSHAKE_TIMEOUT_SECONDS = 3.0


def addresses(bootstrap_servers: str) -> list[tuple[str, int]]:
    """``host:port`` pairs of a bootstrap list (``[v6]:port`` and a
    ``proto://`` prefix as librdkafka takes them); malformed entries are left out."""
    out = []
    for entry in bootstrap_servers.split(","):
        entry = entry.strip().rpartition("://")[2]
        host, sep, port = entry.rpartition(":")
        if sep and host and port.isdigit():
            out.append((host.strip("[]"), int(port)))
    return out


def tls_listener(bootstrap_servers: str, timeout_seconds: float = HANDSHAKE_TIMEOUT_SECONDS) -> str | None:
    """The first ``host:port`` of ``bootstrap_servers`` that completes a TLS
    handshake, or None if none does."""
    context = ssl.create_default_context()
    # Only whether TLS is spoken matters here, not whom to trust.
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    for host, port in addresses(bootstrap_servers):
        try:
            with (
                socket.create_connection((host, port), timeout=timeout_seconds) as raw,
                context.wrap_socket(raw, server_hostname=host),
            ):
                return f"{host}:{port}"
        except (OSError, ValueError):
            continue
    return None
