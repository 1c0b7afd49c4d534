"""The prober's connection to a cluster: kafka-python's request-level client
(``kafka.net.compat.KafkaNetClient``), each broker's ApiVersions, a request pace per
broker, and a deadline on every answer.

Settings come as the librdkafka names the other commands take (``--kafka-config``),
mapped to kafka-python's; a TLS or SASL setting without a counterpart is refused
rather than silently dropped."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

import kafka.errors
from kafka.net.compat import KafkaNetClient
from kafka.protocol.metadata import MetadataRequest

from probe.wire import METADATA_EPOCH_SINCE, ClusterView, cluster_view, metadata_request

# kafka-python logs every failed connection attempt at WARNING and ERROR; with no
# handler, Python would print them on stderr. The command says what failed in one
# line; `fencewatch --verbose` shows them (its root handler still gets them).
logging.getLogger("kafka").addHandler(logging.NullHandler())

DEFAULT_REQUESTS_PER_SECOND = 20.0
DEFAULT_TIMEOUT_SECONDS = 5.0

# librdkafka setting -> kafka-python setting.
_SETTINGS = {
    "security.protocol": "security_protocol",
    "ssl.ca.location": "ssl_cafile",
    "ssl.certificate.location": "ssl_certfile",
    "ssl.key.location": "ssl_keyfile",
    "ssl.key.password": "ssl_password",
    "ssl.crl.location": "ssl_crlfile",
    "sasl.mechanism": "sasl_mechanism",
    "sasl.mechanisms": "sasl_mechanism",
    "sasl.username": "sasl_plain_username",
    "sasl.password": "sasl_plain_password",
    "sasl.kerberos.service.name": "sasl_kerberos_service_name",
    "client.id": "client_id",
}


class Unanswered(Exception):
    """A request got no answer: ``reason`` is timeout, connection closed or unreachable."""

    def __init__(self, reason: str, detail: str = ""):
        super().__init__(f"{reason}: {detail}" if detail else reason)


class ClusterRefused(Exception):
    """The cluster cannot be used at all: unreachable, TLS or SASL refused, no epochs."""


def client_settings(settings: Mapping[str, str]) -> dict[str, Any]:
    """kafka-python settings for librdkafka ``settings``; ValueError names one it lacks."""
    out: dict[str, Any] = {}
    for key, value in settings.items():
        if key in _SETTINGS:
            out[_SETTINGS[key]] = value.upper() if key.startswith("security.") else value
        elif key == "ssl.endpoint.identification.algorithm":
            out["ssl_check_hostname"] = value.lower() == "https"
        elif key.startswith(("ssl.", "sasl.", "security.")):
            raise ValueError(
                f"the probe cannot use --kafka-config {key} (its client is kafka-python); supported: "
                f"{', '.join(sorted([*_SETTINGS, 'ssl.endpoint.identification.algorithm']))}"
            )
    return out


class Pacer:
    """At most ``per_second`` requests per broker: each waits until 1/per_second after
    the previous one to the same broker. ``clock`` and ``sleep`` are injected."""

    def __init__(
        self,
        per_second: float,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ):
        if per_second <= 0:
            raise ValueError(f"requests per second must be above 0, got {per_second}")
        self.gap_seconds = 1.0 / per_second
        self._clock = clock
        self._sleep = sleep
        self._next: dict[int, float] = {}

    def wait(self, node: int) -> None:
        now = self._clock()
        due = self._next.get(node, now)
        if due > now:
            self._sleep(due - now)
        self._next[node] = max(now, due) + self.gap_seconds


class ProbeClient:
    """Requests to the brokers of ``bootstrap_servers``; nothing connects before
    :meth:`connect`."""

    def __init__(
        self,
        bootstrap_servers: str,
        settings: Mapping[str, Any],
        *,
        timeout_seconds: float = DEFAULT_TIMEOUT_SECONDS,
        requests_per_second: float = DEFAULT_REQUESTS_PER_SECOND,
    ):
        self.bootstrap_servers = bootstrap_servers
        self.timeout_ms = int(timeout_seconds * 1000)
        self.pacer = Pacer(requests_per_second)
        self._settings = dict(settings)
        self._client: KafkaNetClient | None = None

    def connect(self) -> None:
        """Bootstrap: learn the brokers. ClusterRefused says why it cannot."""
        self._client = KafkaNetClient(
            bootstrap_servers=self.bootstrap_servers,
            request_timeout_ms=self.timeout_ms,
            socket_connection_setup_timeout_ms=self.timeout_ms,
            # The reconnect backoff of a broker that went away: short, the round's deadline bounds it.
            reconnect_backoff_max_ms=1000,
            **self._settings,
        )
        # Polled with a deadline of our own: kafka-python bounds the TCP connect, not a TLS
        # handshake that a plaintext listener never answers.
        bootstrap = self._client._manager.bootstrap_async(timeout_ms=self.timeout_ms)
        self._client.poll(timeout_ms=self.timeout_ms, future=bootstrap)
        if not bootstrap.is_done:
            raise ClusterRefused(
                f"no answer within {self.timeout_ms / 1000:g}s (with TLS or SASL: does security.protocol "
                "match the listener?)"
            )
        error = bootstrap.exception
        if isinstance(error, kafka.errors.SaslAuthenticationFailedError | kafka.errors.AuthorizationError):
            raise ClusterRefused(f"SASL authentication failed: {error}")
        if isinstance(error, kafka.errors.UnsupportedSaslMechanismError):
            raise ClusterRefused(f"SASL mechanism refused: {error}")
        if error is not None:
            raise ClusterRefused(f"no answer within {self.timeout_ms / 1000:g}s ({error})")

    @property
    def client(self) -> KafkaNetClient:
        if self._client is None:
            raise RuntimeError("connect() first")
        return self._client

    def versions(self, node: int) -> Mapping[int, tuple[int, int]]:
        """The broker's ApiVersions (key -> (min, max)); Unanswered if it cannot be reached."""
        try:
            self.client.await_ready(node, timeout_ms=self.timeout_ms)
        except (kafka.errors.KafkaError, OSError) as exc:
            raise Unanswered("unreachable", str(exc)) from exc
        conn = self.client._manager._conns.get(node)
        if conn is None or conn.broker_version_data is None:
            raise Unanswered("unreachable", f"broker {node} has no connection")
        return dict(conn.broker_version_data.api_versions)

    def ask(self, node: int, request: Any) -> Any:
        """Send ``request`` to broker ``node`` at the pace, and return its answer."""
        self.pacer.wait(node)
        try:
            return self.client.send_and_receive(node, request, timeout_ms=self.timeout_ms)
        except kafka.errors.KafkaTimeoutError as exc:
            raise Unanswered("timeout", str(exc)) from exc
        except (kafka.errors.KafkaConnectionError, kafka.errors.Cancelled) as exc:
            raise Unanswered("connection closed", str(exc)) from exc
        except (kafka.errors.KafkaError, OSError) as exc:
            raise Unanswered("unreachable", str(exc)) from exc

    def metadata(self, topics: list[str] | None = None) -> ClusterView:
        """Metadata v7+ (leader epochs) for ``topics`` (None: all) from any broker."""
        node = self.client.least_loaded_node(bootstrap_fallback=True)
        if node is None:
            raise Unanswered("unreachable", "no broker to ask for Metadata")
        version = self.versions(node).get(MetadataRequest.API_KEY, (0, -1))[1]
        version = min(version, MetadataRequest.max_version)
        if version < METADATA_EPOCH_SINCE:
            raise ClusterRefused(
                f"broker {node} speaks Metadata up to v{version}, which reports no leader epochs "
                f"(v{METADATA_EPOCH_SINCE}+, Kafka 2.1+)"
            )
        return cluster_view(self.ask(node, metadata_request(version, topics)))

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None
