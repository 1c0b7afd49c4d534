"""A KRaft cluster of Apache Kafka on loopback: one JVM per node, started,
watched and broken on purpose.

Each node is ``kafka.Kafka server.properties`` in a process group of its own,
with ``-Dkafka.logs.dir`` and its logging configuration (``kafka-server-start.sh``
passes the same). Its storage is formatted first with ``kafka.tools.StorageTool
format`` under the cluster's id, as ``kafka-storage.sh`` does. A node can be
(re)started with its clock skewed: :meth:`start_node` with ``clock_offset_seconds``
runs it under Debian's libfaketime with that fixed offset, as ``faketime -f``
does. The offset is fixed for the JVM's life and applies to its monotonic clock
too (a constant offset leaves every duration Kafka measures unchanged): what
did not work here, with Java 17 and glibc 2.36, was libfaketime's
``FAKETIME_DONT_FAKE_MONOTONIC=1`` (the README's advice for Java): every
timed wait of the JVM's own threads then returned at once, and a broker, or
even ``StorageTool random-uuid``, spun without starting (libfaketime and
libfaketimeMT alike, with the offset in ``FAKETIME`` or in a
``FAKETIME_TIMESTAMP_FILE``, cached or not). An offset changed while the JVM
runs would move its monotonic clock too, so a skew is applied by a restart.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import TracebackType

from confluent_kafka.admin import AdminClient

from localkafka.fetch import KafkaJars, KafkaSetupError, java_binary, java_major_version
from localkafka.layout import HOST, ClusterLayout, NodeLayout, logging_config, plan, server_properties
from localkafka.secure import SecureListener

LIBFAKETIME = Path("/usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1")
_POLL_SECONDS = 0.25
_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    """In the child before exec: end with the process that started it, so that
    a test run or a `kafka-lab` killed outright leaves no JVM behind."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    os.setsid()


def free_ports(count: int) -> list[int]:
    """``count`` distinct ports free on loopback right now."""
    sockets = []
    try:
        for _ in range(count):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.bind((HOST, 0))
            sockets.append(sock)
        return [int(s.getsockname()[1]) for s in sockets]
    finally:
        for sock in sockets:
            sock.close()


def check_ports_free(ports: Iterable[int]) -> None:
    """Raise one line naming the first port some process already holds."""
    for port in ports:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind((HOST, port))
            except OSError:
                raise KafkaSetupError(
                    f"port {HOST}:{port} is busy -- free it or choose another --base-port"
                ) from None


class LocalKafkaCluster:
    """A KRaft cluster of ``controllers`` + ``brokers`` JVMs under ``root``; a
    context manager. ``base_port=None`` picks free ports; otherwise the nodes
    take ``base_port``, ``base_port + 1``... (controllers first). With
    ``secure_listener`` every broker also listens with SASL_SSL and SCRAM on a
    port of its own (after the others'), and its users are created at format.
    """

    def __init__(
        self,
        jars: KafkaJars,
        root: Path | None = None,
        *,
        controllers: int = 3,
        brokers: int = 3,
        tiered_storage: bool | None = None,
        broker_overrides: dict[str, str] | None = None,
        base_port: int | None = None,
        heap: str = "384m",
        startup_timeout_seconds: float = 120.0,
        secure_listener: SecureListener | None = None,
    ) -> None:
        self.jars = jars
        self.root = Path(root) if root else Path(tempfile.mkdtemp(prefix="fencewatch-kafka-"))
        count = controllers + brokers * (2 if secure_listener else 1)
        if base_port is not None:
            ports = list(range(base_port, base_port + count))
            check_ports_free(ports)
        else:
            ports = free_ports(count)
        if tiered_storage is None:
            tiered_storage = jars.has_tiered_storage_test_jar
        self.layout: ClusterLayout = plan(
            self.root,
            jars.major,
            ports,
            controllers=controllers,
            brokers=brokers,
            tiered_storage=tiered_storage,
            broker_overrides=broker_overrides,
            secure=secure_listener,
        )
        self.cluster_id = _kafka_uuid()
        self.heap = heap
        self.startup_timeout_seconds = startup_timeout_seconds
        # Each node's clock offset from true time, as last started (start_node).
        self.clock_offsets: dict[int, float] = {}
        self._procs: dict[int, subprocess.Popen[bytes]] = {}
        self._java = java_binary()
        if jars.major >= 4 and java_major_version(self._java) < 17:
            raise KafkaSetupError(f"Kafka {jars.version} needs Java 17 or newer -- set JAVA_HOME to one")

    # -- the whole cluster ------------------------------------------------

    @property
    def bootstrap_servers(self) -> str:
        return self.layout.bootstrap_servers

    @property
    def secure_bootstrap_servers(self) -> str:
        """The brokers' SASL_SSL listeners (``secure_listener``); empty without."""
        return self.layout.secure_bootstrap_servers

    @property
    def brokers(self) -> tuple[NodeLayout, ...]:
        return self.layout.brokers

    @property
    def controllers(self) -> tuple[NodeLayout, ...]:
        return self.layout.controllers

    def __enter__(self) -> LocalKafkaCluster:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def start(self) -> None:
        """Format every node, start them all, and return once every broker is
        registered and unfenced; raises :class:`KafkaSetupError` naming the log
        of a node that exits or a cluster that is not up in time."""
        self.layout.remote_storage_dir.mkdir(parents=True, exist_ok=True)
        for node in self.layout.nodes:
            self._write_config(node)
        # Each format is a JVM of its own: side by side they take one's time.
        with ThreadPoolExecutor(len(self.layout.nodes)) as pool:
            list(pool.map(self._format, self.layout.nodes))
        for node in self.layout.nodes:
            self.start_node(node.node_id, wait=False)
        self.wait_until_ready()

    def stop(self) -> None:
        """Stop every node still running: the brokers first (their controlled
        shutdown needs a controller: stopped together, a broker waited out its
        timeout for one already gone), then the controllers; a node not gone
        within 15 s is killed."""
        for group in (self.layout.brokers, self.layout.controllers):
            procs = [self._procs[n.node_id] for n in group if n.node_id in self._procs]
            for proc in procs:
                if proc.poll() is None:
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(proc.pid, signal.SIGCONT)
                        os.killpg(proc.pid, signal.SIGTERM)
            deadline = time.monotonic() + 15
            for proc in procs:
                try:
                    proc.wait(max(0.1, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()
        self._procs.clear()

    def wait_until_ready(
        self, brokers: Iterable[int] | None = None, timeout_seconds: float | None = None
    ) -> None:
        """Wait until the given brokers (default: every broker running) are
        registered, unfenced and listed by the cluster's metadata, and every
        listener of theirs accepts connections (a broker is listed before its
        listeners open: clients saw a moment of "Connection refused")."""
        wanted = (
            set(brokers)
            if brokers is not None
            else {b.node_id for b in self.brokers if self.is_running(b.node_id)}
        )
        deadline = time.monotonic() + (timeout_seconds or self.startup_timeout_seconds)
        seen: set[int] = set()
        while time.monotonic() < deadline:
            self._raise_if_exited()
            seen = self.live_brokers()
            if wanted <= seen and all(self._listening(node_id) for node_id in wanted):
                return
            time.sleep(_POLL_SECONDS)
        missing = sorted(wanted - seen)
        raise KafkaSetupError(
            f"brokers {missing} of the local Kafka cluster were not up within "
            f"{timeout_seconds or self.startup_timeout_seconds:.0f} s -- see "
            f"{self.layout.node(missing[0]).server_log}"
        )

    def live_brokers(self) -> set[int]:
        """The brokers the cluster's metadata lists now (registered and unfenced)."""
        running = [b for b in self.brokers if self.is_running(b.node_id)]
        if not running:
            return set()
        admin = AdminClient(
            {
                "bootstrap.servers": ",".join(f"{HOST}:{b.port}" for b in running),
                "socket.timeout.ms": 2000,
                # A broker down on purpose is no news: librdkafka's own lines stay quiet.
                "log_level": 0,
            }
        )
        try:
            description = admin.describe_cluster(request_timeout=2).result()
        except Exception:
            return set()
        return {node.id for node in description.nodes}

    # -- one node -----------------------------------------------------------

    def is_running(self, node_id: int) -> bool:
        proc = self._procs.get(node_id)
        return proc is not None and proc.poll() is None

    def pid(self, node_id: int) -> int:
        proc = self._procs.get(node_id)
        if proc is None or proc.poll() is not None:
            raise KafkaSetupError(f"node {node_id} is not running")
        return proc.pid

    def start_node(self, node_id: int, *, wait: bool = True, clock_offset_seconds: float = 0.0) -> None:
        """Start node ``node_id`` (again, after a kill or a shutdown); with
        ``clock_offset_seconds``, its clock that far from true time for the
        JVM's life (libfaketime, as ``faketime -f +Ns`` runs it)."""
        if self.is_running(node_id):
            raise KafkaSetupError(f"node {node_id} is already running")
        if clock_offset_seconds and not LIBFAKETIME.exists():
            raise KafkaSetupError(
                f"a skewed clock needs libfaketime ({LIBFAKETIME} is missing) -- apt-get install faketime"
            )
        node = self.layout.node(node_id)
        self.clock_offsets[node_id] = clock_offset_seconds
        node.console_log.parent.mkdir(parents=True, exist_ok=True)
        with open(node.console_log, "ab") as console:
            self._procs[node_id] = subprocess.Popen(
                self._java_command(node, "kafka.Kafka", str(node.properties_file)),
                stdout=console,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=self._environment(clock_offset_seconds),
                preexec_fn=_die_with_parent,
            )
        if wait and not node.is_controller:
            self.wait_until_ready([node_id])

    def kill(self, node_id: int) -> None:
        """SIGKILL: the node dies at once, with no controlled shutdown."""
        self._signal(node_id, signal.SIGKILL)
        self._procs[node_id].wait()

    def shutdown(self, node_id: int, timeout_seconds: float = 60.0) -> None:
        """SIGTERM: Kafka's controlled shutdown (a broker hands its leaderships
        over first); waits for the JVM to exit."""
        self._signal(node_id, signal.SIGTERM)
        try:
            self._procs[node_id].wait(timeout_seconds)
        except subprocess.TimeoutExpired:
            raise KafkaSetupError(
                f"node {node_id} did not shut down within {timeout_seconds:.0f} s -- see "
                f"{self.layout.node(node_id).server_log}"
            ) from None

    def pause(self, node_id: int) -> None:
        """SIGSTOP: the JVM freezes, sockets open, as in a long GC pause."""
        self._signal(node_id, signal.SIGSTOP)

    def resume(self, node_id: int) -> None:
        self._signal(node_id, signal.SIGCONT)

    def wipe(self, node_id: int) -> None:
        """Empty a stopped node's log directory and format it again, as after a
        disk replaced: the node comes back with no data and a new directory id."""
        if self.is_running(node_id):
            raise KafkaSetupError(f"node {node_id} is running: stop it before wiping its log directory")
        node = self.layout.node(node_id)
        shutil.rmtree(node.data_dir, ignore_errors=True)
        self._format(node)

    def override(self, node_id: int, settings: dict[str, str]) -> None:
        """Settings for node ``node_id`` alone, over the cluster's; they are
        written by :meth:`start`, so call it before (a broker may reach its
        controllers through a proxy: ``controller.quorum.voters``)."""
        self.layout.node(node_id).overrides.update(settings)

    def active_controller(self) -> int | None:
        """The leader the newest epoch among the controllers' quorum-state files names."""
        best: tuple[int, int] | None = None
        for node in self.controllers:
            try:
                state = json.loads(node.quorum_state.read_text())
            except (OSError, ValueError):
                continue
            leader, epoch = int(state.get("leaderId", -1)), int(state.get("leaderEpoch", -1))
            if leader >= 0 and (best is None or epoch > best[1]):
                best = (leader, epoch)
        return best[0] if best else None

    def run_tool(self, main_class: str, *args: str, timeout_seconds: float = 120.0) -> str:
        """Run one of Kafka's command-line tools on the cluster's classpath; its
        output, or :class:`KafkaSetupError` with its last line."""
        node = self.layout.brokers[0]
        proc = subprocess.run(
            self._java_command(node, main_class, *args, heap="256m", tool=True),
            capture_output=True,
            text=True,
            timeout=timeout_seconds,
            check=False,
        )
        if proc.returncode != 0:
            last = (proc.stderr.strip() or proc.stdout.strip()).splitlines()[-1:] or ["no output"]
            raise KafkaSetupError(f"{main_class.rsplit('.', 1)[-1]} failed: {last[0]}")
        return proc.stdout

    # -- internals -----------------------------------------------------------

    def _write_config(self, node: NodeLayout) -> None:
        node.directory.mkdir(parents=True, exist_ok=True)
        node.request_log.parent.mkdir(parents=True, exist_ok=True)
        node.properties_file.write_text(server_properties(self.layout, node))
        name, text = logging_config(self.layout, node)
        (node.directory / name).write_text(text)

    def _format(self, node: NodeLayout) -> None:
        args = ["format", "-t", self.cluster_id, "-c", str(node.properties_file)]
        if self.layout.secure is not None:
            args += self.layout.secure.format_args()
        proc = subprocess.run(
            self._java_command(node, "kafka.tools.StorageTool", *args, heap="256m", tool=True),
            capture_output=True,
            text=True,
            check=False,
        )
        if proc.returncode != 0:
            last = (proc.stderr.strip() or proc.stdout.strip()).splitlines()[-1:] or ["no output"]
            raise KafkaSetupError(f"formatting node {node.node_id}'s storage failed: {last[0]}")

    def _java_command(
        self, node: NodeLayout, main_class: str, *args: str, heap: str | None = None, tool: bool = False
    ) -> list[str]:
        name, _ = logging_config(self.layout, node)
        logging_property = (
            f"-Dlog4j2.configurationFile={node.directory / name}"
            if self.layout.kafka_major >= 4
            else f"-Dlog4j.configuration=file:{node.directory / name}"
        )
        command = [
            self._java,
            f"-Xmx{heap or self.heap}",
            "-Xms64m",
            "-XX:+UseG1GC",
            "-XX:MaxGCPauseMillis=20",
            "-Djava.awt.headless=true",
            f"-Dkafka.logs.dir={node.request_log.parent}",
        ]
        if tool:
            # Tools log warnings to stderr, not into the node's files and not on the
            # stdout callers parse (an empty configurationFile made 4.0's log4j2 print
            # a parse error there).
            command += ["-XX:TieredStopAtLevel=1", *self._tool_logging()]
        else:
            command.append(logging_property)
        return [*command, "-cp", self.jars.classpath, main_class, *args]

    def _tool_logging(self) -> list[str]:
        """The JVM property naming a configuration that sends tools' log lines
        at WARN to stderr (log4j2 XML for 4.x, log4j 1 properties for 3.x)."""
        if self.layout.kafka_major >= 4:
            path = self.root / "tools-log4j2.xml"
            if not path.exists():
                path.write_text(
                    '<Configuration status="error">\n'
                    '  <Appenders><Console name="err" target="SYSTEM_ERR">'
                    '<PatternLayout pattern="[%d] %p %m (%c)%n"/></Console></Appenders>\n'
                    '  <Loggers><Root level="warn"><AppenderRef ref="err"/></Root></Loggers>\n'
                    "</Configuration>\n"
                )
            return [f"-Dlog4j2.configurationFile={path}"]
        path = self.root / "tools-log4j.properties"
        if not path.exists():
            path.write_text(
                "log4j.rootLogger=WARN, err\n"
                "log4j.appender.err=org.apache.log4j.ConsoleAppender\n"
                "log4j.appender.err.Target=System.err\n"
                "log4j.appender.err.layout=org.apache.log4j.PatternLayout\n"
                "log4j.appender.err.layout.ConversionPattern=[%d] %p %m (%c)%n\n"
            )
        return [f"-Dlog4j.configuration=file:{path}"]

    def _environment(self, clock_offset_seconds: float) -> dict[str, str]:
        env = dict(os.environ)
        if clock_offset_seconds:
            # Not FAKETIME_DONT_FAKE_MONOTONIC: with it the JVM spins (module docstring).
            env.update({"LD_PRELOAD": str(LIBFAKETIME), "FAKETIME": f"{clock_offset_seconds:+.3f}"})
        return env

    def _signal(self, node_id: int, sig: signal.Signals) -> None:
        os.killpg(self.pid(node_id), sig)

    def _listening(self, node_id: int) -> bool:
        node = self.layout.node(node_id)
        for port in (node.port, node.secure_port):
            if port is None:
                continue
            try:
                socket.create_connection((HOST, port), timeout=1).close()
            except OSError:
                return False
        return True

    def _raise_if_exited(self) -> None:
        for node_id, proc in self._procs.items():
            code = proc.poll()
            if code is not None and code not in (0, -signal.SIGKILL, -signal.SIGTERM, 143):
                node = self.layout.node(node_id)
                raise KafkaSetupError(
                    f"Kafka node {node_id} exited with code {code} -- see {node.server_log} "
                    f"and {node.console_log}"
                )


def _kafka_uuid() -> str:
    """A cluster id as ``kafka-storage.sh random-uuid`` makes it: 16 random bytes,
    URL-safe base64 without padding, never starting with "-", which a command
    line would take for an option (``org.apache.kafka.common.Uuid.randomUuid``
    draws again too; ``format -t -x...`` failed here with "expected one argument")."""
    import base64

    while True:
        text = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not text.startswith("-"):
            return text
