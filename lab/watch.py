"""fencewatch watching a local Kafka cluster as a user would: one ``fencewatch
ship`` per file Kafka writes that a rule reads, and ``fencewatch run``
judging the event topic, each a child process with the options of
docs/operations.md.

Shipped: every node's request log (brokers serve Produce, Fetch, ListOffsets,
OffsetForLeaderEpoch; controllers log the AlterPartition they answer), one
controller's ``__cluster_metadata-0`` (every controller holds the whole
committed log), every controller's ``quorum-state``, and with tiered storage
the cluster's own ``__remote_log_metadata`` topic. The job's alerts come
back on its stdout (one JSON document a line) and its counters from its
``/metrics`` page, the one Prometheus scrapes.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from localkafka.cluster import LocalKafkaCluster, free_ports

EVENTS_TOPIC = "fencewatch-events"
DEAD_LETTER_TOPIC = "fencewatch-dead-letters"
ALERTS_TOPIC = "fencewatch-alerts"
# How long the job waits on a silent cluster before judging what waits (run's
# --idle-flush-ms): short, so that the end of a lab run is judged soon.
IDLE_FLUSH_MS = 5_000


@dataclass
class Child:
    """One ``fencewatch`` child process, its stderr kept in a file."""

    name: str
    proc: subprocess.Popen[bytes]
    stderr_path: Path

    def stderr(self) -> str:
        try:
            return self.stderr_path.read_text(errors="replace")
        except OSError:
            return ""

    def stop(self, timeout_seconds: float = 60.0) -> int:
        """SIGTERM (a clean stop: shippers flush and save their position), then SIGKILL."""
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout_seconds)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        return int(self.proc.returncode)


@dataclass
class JobCounters:
    """What the job's /metrics page says of one cluster."""

    events_by_api: dict[str, int] = field(default_factory=dict)
    events_by_kind: dict[str, int] = field(default_factory=dict)
    dead_letters: dict[str, int] = field(default_factory=dict)
    alerts: dict[str, int] = field(default_factory=dict)  # certain ones, by rule
    possible: dict[str, int] = field(default_factory=dict)  # possible ones, by rule
    # node -> (low, high) seconds of its clock minus the metadata log's (None: unbounded)
    clocks: dict[str, tuple[float | None, float | None]] = field(default_factory=dict)
    # Records the job read from the event topic (every cluster's).
    read: int = 0

    @property
    def judged(self) -> int:
        return sum(self.events_by_kind.values())


class Watchers:
    """The shippers and the job for ``cluster``, publishing to and reading
    from the event topic on ``events_bootstrap`` (a broker that is not the
    cluster being broken)."""

    def __init__(
        self,
        cluster: LocalKafkaCluster,
        events_bootstrap: str,
        work: Path,
        *,
        cluster_name: str = "lab",
        events_topic: str = EVENTS_TOPIC,
        dead_letter_topic: str = DEAD_LETTER_TOPIC,
        alerts_topic: str = ALERTS_TOPIC,
        on_alert: Callable[[str], None] = lambda _: None,
        say: Callable[[str], None] = lambda _: None,
    ) -> None:
        self.cluster = cluster
        self.events_bootstrap = events_bootstrap
        self.work = Path(work)
        self.cluster_name = cluster_name
        self.events_topic = events_topic
        self.dead_letter_topic = dead_letter_topic
        self.alerts_topic = alerts_topic
        self.on_alert = on_alert
        self.say = say
        self.shippers: list[Child] = []
        self.job: Child | None = None
        self.metrics_port = free_ports(1)[0]
        self.alert_lines: list[str] = []
        self._reader: threading.Thread | None = None
        (self.work / "state").mkdir(parents=True, exist_ok=True)
        (self.work / "logs").mkdir(parents=True, exist_ok=True)

    @property
    def checkpoint(self) -> Path:
        return self.work / "checkpoint"

    def ship_commands(self) -> list[tuple[str, list[str]]]:
        """(name, ``fencewatch ship`` arguments) for every file watched."""
        common = [
            "--bootstrap-servers",
            self.events_bootstrap,
            "--topic",
            self.events_topic,
            "--cluster",
            self.cluster_name,
            "--dead-letter-topic",
            self.dead_letter_topic,
            "--status-interval",
            "0",
        ]
        state = self.work / "state"
        commands: list[tuple[str, list[str]]] = []
        for node in self.cluster.layout.nodes:
            commands.append(
                (
                    f"request-log-{node.node_id}",
                    [
                        "ship",
                        "request-log",
                        *common,
                        "--node",
                        str(node.node_id),
                        "--from-beginning",
                        "--state-file",
                        str(state / f"request-log-{node.node_id}.offset"),
                        str(node.request_log),
                    ],
                )
            )
        first = self.cluster.controllers[0]
        commands.append(
            (
                f"metadata-log-{first.node_id}",
                [
                    "ship",
                    "metadata-log",
                    *common,
                    "--node",
                    str(first.node_id),
                    "--state-file",
                    str(state / f"metadata-log-{first.node_id}.offset"),
                    str(first.metadata_dir),
                ],
            )
        )
        if self.cluster.layout.tiered_storage:
            # Kafka's own __remote_log_metadata, read from the watched cluster's topic.
            commands.append(
                (
                    "remote-log-metadata",
                    [
                        "ship",
                        "remote-log-metadata",
                        *common,
                        "--from-topic",
                        "--source-bootstrap-servers",
                        self.cluster.bootstrap_servers,
                        "--state-file",
                        str(state / "remote-log-metadata.offset"),
                    ],
                )
            )
        for controller in self.cluster.controllers:
            commands.append(
                (
                    f"quorum-state-{controller.node_id}",
                    [
                        "ship",
                        "quorum-state",
                        *common,
                        "--node",
                        str(controller.node_id),
                        str(controller.metadata_dir),
                    ],
                )
            )
        return commands

    def job_command(self) -> list[str]:
        return [
            "run",
            "--bootstrap-servers",
            self.events_bootstrap,
            "--topic",
            self.events_topic,
            "--alerts-topic",
            self.alerts_topic,
            "--dead-letter-topic",
            self.dead_letter_topic,
            "--checkpoint",
            str(self.checkpoint),
            "--metrics-port",
            str(self.metrics_port),
            "--metrics-bind",
            "127.0.0.1",
            "--trigger-seconds",
            "2",
            "--idle-flush-ms",
            str(IDLE_FLUSH_MS),
        ]

    def start_job(self) -> None:
        self.job = self._spawn("job", self.job_command(), stdout=subprocess.PIPE)
        self._reader = threading.Thread(target=self._read_alerts, name="lab-alerts", daemon=True)
        self._reader.start()

    def start_shippers(self) -> None:
        for name, argv in self.ship_commands():
            self.shippers.append(self._spawn(name, argv))

    def stop_shippers(self) -> dict[str, str]:
        """Stop every shipper cleanly; each one's summary line (its last on stderr)."""
        summaries = {}
        for child in self.shippers:
            code = child.stop()
            lines = child.stderr().strip().splitlines()
            summaries[child.name] = (lines[-1] if lines else "") + ("" if code == 0 else f" (exit {code})")
        return summaries

    def shipped_bytes(self) -> dict[int, int]:
        """How far into each node's request log its shipper got (its state file's
        position, saved once what came before was delivered): Kafka keeps
        logging after the shippers stop, and a replay of the same bytes stops there."""
        out = {}
        for node in self.cluster.layout.nodes:
            path = self.work / "state" / f"request-log-{node.node_id}.offset"
            try:
                out[node.node_id] = int(json.loads(path.read_text())["offset"])
            except (OSError, ValueError, KeyError, TypeError):
                continue
        return out

    def stop(self) -> None:
        for child in self.shippers:
            child.stop(10)
        if self.job is not None:
            self.job.stop(60)
        if self._reader is not None:
            self._reader.join(5)

    def failed_child(self) -> Child | None:
        """A child that ended on its own (none should before it is stopped)."""
        for child in [*self.shippers, *([self.job] if self.job else [])]:
            if child.proc.poll() is not None:
                return child
        return None

    def counters(self) -> JobCounters | None:
        """The job's counters for the lab's cluster now; None while /metrics does not answer."""
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=5) as page:
                text = page.read().decode()
        except OSError:
            return None
        counters = JobCounters()
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                labels = sample.labels
                value = sample.value
                if (
                    sample.name == "fencewatch_source_events_total"
                    and labels.get("topic") == self.events_topic
                ):
                    counters.read += int(value)
                    continue
                if labels.get("cluster") != self.cluster_name:
                    continue
                if sample.name == "fencewatch_events_total":
                    kind = labels.get("kind", "")
                    counters.events_by_kind[kind] = counters.events_by_kind.get(kind, 0) + int(value)
                    if labels.get("api"):
                        api = labels["api"]
                        counters.events_by_api[api] = counters.events_by_api.get(api, 0) + int(value)
                elif sample.name == "fencewatch_dead_letters_total":
                    counters.dead_letters[labels.get("reason", "")] = int(value)
                elif sample.name == "fencewatch_alerts_total":
                    rule = labels.get("rule", "")
                    into = counters.possible if labels.get("confidence") == "possible" else counters.alerts
                    into[rule] = into.get(rule, 0) + int(value)
                elif sample.name == "fencewatch_clock_offset_seconds":
                    low, high = counters.clocks.get(labels["node"], (None, None))
                    if labels.get("bound") == "low":
                        low = value
                    else:
                        high = value
                    counters.clocks[labels["node"]] = (low, high)
        return counters

    def wait_until_judged(self, timeout_seconds: float) -> JobCounters | None:
        """Until the job has read every record of the event topic and its
        counters have stood still past its idle flush (what waited is judged),
        or the time is up; the counters then."""
        shipped = count_records(self.events_bootstrap, self.events_topic)
        deadline = time.monotonic() + timeout_seconds
        last: tuple[object, ...] | None = None
        since = time.monotonic()
        counters = None
        while time.monotonic() < deadline:
            counters = self.counters()
            seen = (
                None
                if counters is None
                else (
                    counters.read,
                    counters.judged,
                    sum(counters.dead_letters.values()),
                    sum(counters.alerts.values()) + sum(counters.possible.values()),
                )
            )
            if seen != last:
                last, since = seen, time.monotonic()
            elif (
                counters is not None
                and counters.read >= shipped
                and time.monotonic() - since >= 2 * IDLE_FLUSH_MS / 1000
            ):
                return counters
            time.sleep(1)
        return counters

    # -- internals ---------------------------------------------------------------

    def _spawn(self, name: str, argv: list[str], stdout: int | None = None) -> Child:
        stderr_path = self.work / "logs" / f"{name}.stderr"
        with open(stderr_path, "ab") as err:
            proc = subprocess.Popen(
                [sys.executable, "-m", "fencewatch", *argv],
                stdout=stdout if stdout is not None else subprocess.DEVNULL,
                stderr=err,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        return Child(name, proc, stderr_path)

    def _read_alerts(self) -> None:
        assert self.job is not None and self.job.proc.stdout is not None
        for raw in self.job.proc.stdout:
            line = raw.decode(errors="replace").strip()
            if line.startswith("{"):
                self.alert_lines.append(line)
                self.on_alert(line)


def count_records(bootstrap_servers: str, topic: str, quiet_seconds: float = 3.0) -> int:
    """How many records ``topic`` holds, read from its start until none came for
    ``quiet_seconds`` (the embedded broker's high watermark may lag: NOTES.md)."""
    from confluent_kafka import Consumer

    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap_servers,
            "group.id": f"fencewatch-lab-count-{os.getpid()}-{time.monotonic_ns()}",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            "log_level": 0,
        }
    )
    consumer.subscribe([topic])
    count = 0
    last = time.monotonic()
    try:
        while time.monotonic() - last < quiet_seconds:
            batch = consumer.consume(10_000, 0.5)
            if batch:
                count += sum(1 for msg in batch if msg.error() is None)
                last = time.monotonic()
    finally:
        consumer.close()
    return count
