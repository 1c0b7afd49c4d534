"""A broker's link to its controllers through a TCP proxy on loopback that can
drop the broker's heartbeats and nothing else.

A KRaft broker talks to the active controller over separate connections, one
per channel: Raft Fetch for the metadata log (``KafkaRaftClient``), the
lifecycle channel for BrokerRegistration and BrokerHeartbeat
(``BrokerLifecycleManager``), AlterPartition, forwarding. The proxy reads the
request frames a connection sends (Kafka's framing: a 4-byte size, then the
request header, whose first field is the api key) and, while heartbeats are
dropped, closes any connection that sends a BrokerHeartbeat (api key 63)
before forwarding it. The controller then hears nothing from the broker and
fences it once ``broker.session.timeout.ms`` has passed, while the broker
still reads the metadata log, learns every new leader epoch and keeps
replicating from the leaders over the broker listener: a fenced broker that
is caught up, which is what Kafka's controller must keep out of the ISR
(KIP-841).

Cutting the whole link would not make that state: the controller's ISR
shrink bumps the leader epoch (``PartitionChangeBuilder.triggerLeaderEpochBumpIfNeeded``
in 3.2), so a broker cut off from the metadata log fetches with the old epoch,
is answered FENCED_LEADER_EPOCH and stops replicating.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from dataclasses import dataclass

from localkafka.layout import HOST

BROKER_HEARTBEAT_API_KEY = 63
_CHUNK = 65536


@dataclass
class LinkCounts:
    """What the proxy did: the heartbeats it dropped."""

    heartbeats_dropped: int = 0


class ControllerLinkProxy:
    """Forwards ``HOST:port`` to ``HOST:target_port`` (a controller's listener)
    for one broker; :meth:`drop_heartbeats` turns the broker's heartbeats off
    and on. A context manager."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.counts = LinkCounts()
        self._dropping = threading.Event()
        self._closed = threading.Event()
        self._lock = threading.Lock()
        self._sockets: set[socket.socket] = set()
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind((HOST, 0))
        self._listener.listen(64)
        self.port = int(self._listener.getsockname()[1])
        self._acceptor = threading.Thread(target=self._accept, name=f"link-proxy-{self.port}", daemon=True)
        self._acceptor.start()

    def __enter__(self) -> ControllerLinkProxy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def drop_heartbeats(self, dropping: bool) -> None:
        """While ``dropping``, a connection that sends a BrokerHeartbeat is
        closed before the request reaches the controller."""
        if dropping:
            self._dropping.set()
        else:
            self._dropping.clear()

    def close(self) -> None:
        self._closed.set()
        with contextlib.suppress(OSError):
            self._listener.close()
        with self._lock:
            for sock in list(self._sockets):
                _close(sock)
            self._sockets.clear()

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection((HOST, self.target_port), timeout=5)
                upstream.settimeout(None)
            except OSError:
                _close(client)  # the controller is down: the broker sees a closed connection
                continue
            with self._lock:
                self._sockets.update((client, upstream))
            threading.Thread(target=self._requests, args=(client, upstream), daemon=True).start()
            threading.Thread(target=self._responses, args=(upstream, client), daemon=True).start()

    def _requests(self, client: socket.socket, upstream: socket.socket) -> None:
        """Broker to controller, a whole request frame at a time so that its api key can be read."""
        pending = bytearray()
        try:
            while chunk := client.recv(_CHUNK):
                pending += chunk
                while len(pending) >= 6:
                    size = int.from_bytes(pending[:4], "big")
                    if len(pending) < 4 + size:
                        break
                    api_key = int.from_bytes(pending[4:6], "big", signed=True)
                    if api_key == BROKER_HEARTBEAT_API_KEY and self._dropping.is_set():
                        with self._lock:
                            self.counts.heartbeats_dropped += 1
                        return
                    upstream.sendall(pending[: 4 + size])
                    del pending[: 4 + size]
        except OSError:
            pass
        finally:
            self._forget(client, upstream)

    def _responses(self, upstream: socket.socket, client: socket.socket) -> None:
        try:
            while chunk := upstream.recv(_CHUNK):
                client.sendall(chunk)
        except OSError:
            pass
        finally:
            self._forget(client, upstream)

    def _forget(self, *socks: socket.socket) -> None:
        with self._lock:
            for sock in socks:
                self._sockets.discard(sock)
                _close(sock)


def _close(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)
    with contextlib.suppress(OSError):
        sock.close()
