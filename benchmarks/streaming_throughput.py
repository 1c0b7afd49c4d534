"""How fast the streaming job (``streaming/job.py``, PySpark, local[2]) keeps up
with Kafka, next to the simplest alternative: one plain confluent-kafka consumer
feeding the same Detector in a single Python process.

    .venv/bin/python benchmarks/streaming_throughput.py
    .venv/bin/python benchmarks/streaming_throughput.py --events 300000 --rate 2000 --rate 20000 \
        --latency-seconds 40 --partitions 1000 --partitions 100000

Everything runs against the embedded broker (tansu), or the Kafka cluster of
``--bootstrap-servers`` (its broker's CPU counted with ``--broker-pid``), in
one run, and every figure printed is measured in that run. ``--kafka-source``
(repeatable: python, spark) picks the job's source for (a) and (f); with both,
each (source, bucket count) takes turns with the others over
``--bucket-rounds`` rounds, and the medians and Spark's source's ratios to
ours are printed. Spark's source does not read the embedded broker's tail
(streaming/spark_kafka.py): compare the two against a Kafka broker. The job's and the plain consumer's
detectors measure every node's clock, as ``fencewatch run`` and ``replay`` do
by default; ``--no-measure-clocks`` measures them as before 2026-12-06, when
this benchmark ran every detector with clocks unmeasured.

(a) sustained throughput of the Spark job, once per ``--buckets`` count (a
    cluster split into that many state keys; detectors.buckets): ``--events``
    simulated envelopes are published first, then the job starts
    (``--max-events-per-trigger`` per micro-batch); the rate is total rows /
    (end of the last batch with input - start of the first batch with input),
    from the query's progress reports (``lastProgress``, polled every
    ``POLL_SECONDS``); Spark session start-up is excluded, the first batch's
    Python-worker start is not. ``--bucket-rounds N`` runs the counts N times,
    taking turns (in reverse order every other round), each on a fresh
    checkpoint, and prints each count's median CPU per event, whole and the
    Python workers' alone, as ratios to the first count's: one run's ratio of
    64 to 1 bucket moved from 1.19x to 1.54x between runs of one tree
    (docs/performance.md, "Copies of cluster-wide records").
    The median of the per-batch rates (rows / triggerExecution) is printed too,
    and where the time of a batch goes: the medians, over batches after the
    first, of Spark's ``durationMs`` phases and of the stateful operator's
    update and commit times.
    CPU cost: CPU-seconds per million events over the batches after the
    first. The CPU counters (utime + stime + cutime + cstime from
    /proc/PID/stat) of every process of this run are read as soon as polling
    the progress shows the first batch with input has ended and as soon as
    the last one has (the lag is printed); the job's share is this driver, the
    JVM (its JIT compiler threads apart, as ``jvm_jit``) and the Python
    workers, printed by role and as a sum without and with the broker (the
    tansu child process, found by name).
(b) the same topic read by a plain single-process consumer (``assign()`` to
    every partition, parse + ``Detector.ingest`` + ``drain``, ``flush`` at the
    end), ``--repeat`` times, median. CPU cost: CPU-seconds per million events
    of this process over each whole run (consumer creation to close; no JVM
    exists yet), without and with the broker's share, median; (a) and (f)
    are printed as ratios to these medians.
(c) event-to-alert latency at fixed input rates (``--rate``, repeatable):
    simulated events with faults are published at that rate; the Spark job and
    a plain consumer (a separate process) read the topic live. For each injected
    violation (ground truth) latency = wall time its alert arrived (``on_alert``
    / the consumer's ``drain``) - wall time the violating event (same ts_ms and
    node) was handed to the producer. Judgments wait grace_ms + lateness_ms of
    event time by design. Violations in the last grace+lateness+2 s of the
    stream are left out (their judgment waits for the idle flush instead);
    every other one counts, one not alerted when the run ends as a latency
    beyond the run (infinite). The job runs with the largest ``--buckets``.
    Beside it, what the detector itself waits in event time on the same
    history, in one process (benchmarks/event_time_wait.py): the whole
    cluster, and those buckets sharing clocks (detectors.clock_exchange).
(d) batch time and memory as tracked partitions grow (``--partitions``,
    repeatable): a fresh topic gets a small simulated cluster plus extra
    TOPIC/PARTITION_RECORDs; the job consumes them, then ``--steady-batches``
    batches of ``--steady-events`` traffic events are published one at a time
    and each batch's duration is recorded; RSS of this driver process, the JVM
    and the Python workers is read from /proc. The set-up is read
    ``--setup-batch-events`` records a micro-batch: what a cluster's snapshot
    costs when it arrives in many batches instead of a few.
(f) the floor of the Spark pipeline: (a)'s query with the detection taken
    out (the same source as (a)'s run, key, shuffle and stateful-operator framework; the
    operator only turns every value into Python bytes, and a noop sink), on the
    same topic; per-batch rates, phases and CPU cost as in (a).
(e) the cost of idling: once (a)'s job has read everything, the CPU time of
    every process of this run (this driver, the JVM, the Python workers, the
    broker; from /proc) over ``--idle-seconds`` of an idle topic, as a share
    of one core, and how many micro-batches ran meanwhile.
"""

from __future__ import annotations

import argparse
import base64
import functools
import multiprocessing as mp
import os
import pickle
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import event_time_wait
import orjson
from event_time_wait import pct

from detectors.config import DetectorConfig
from detectors.engine import Detector
from detectors.envelope import envelope_from_obj
from detectors.gc_tuning import tune_for_detector
from detectors.truth import match_key
from streaming.spark_kafka import SOURCES

PAGE_KB = os.sysconf("SC_PAGE_SIZE") // 1024
# Waits poll the query this often; it bounds how late after a batch's end the
# CPU counters of the steady interval are read.
POLL_SECONDS = 0.05


# ---- helpers -----------------------------------------------------------------------------------


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def rss_mb(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/statm") as f:
            return int(f.read().split()[1]) * PAGE_KB / 1024
    except OSError:
        return 0.0


def read_stat(path: str) -> tuple[str, list[str]] | None:
    """(comm, the fields after it) of a /proc/.../stat file; None once the
    process or thread has exited. ``fields[1]`` is the parent pid, ``fields[11:15]``
    utime, stime, cutime and cstime in clock ticks."""
    try:
        with open(path) as f:
            stat = f.read()
    except OSError:
        return None
    return stat[stat.index("(") + 1 : stat.rindex(")")], stat[stat.rindex(")") + 2 :].split()


def process_table() -> tuple[dict[int, list[int]], dict[int, str]]:
    """(children by parent pid, comm by pid) of every live process."""
    children: dict[int, list[int]] = {}
    comm: dict[int, str] = {}
    for entry in os.listdir("/proc"):
        stat = read_stat(f"/proc/{entry}/stat") if entry.isdigit() else None
        if stat is not None:
            children.setdefault(int(stat[1][1]), []).append(int(entry))
            comm[int(entry)] = stat[0]
    return children, comm


def descendants(root: int) -> list[tuple[int, str]]:
    """(pid, comm) of every live descendant of ``root``."""
    children, comm = process_table()
    out, todo = [], [root]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append((child, comm[child]))
            todo.append(child)
    return out


# The kernel keeps the first 15 bytes of an executable's name as its comm (TASK_COMM_LEN - 1).
COMM_LEN = 15
ROLES = ("driver_py", "jvm", "jvm_jit", "py_workers", "broker", "other")
# HotSpot's JIT compiler threads (comm "C2 CompilerThread0" cut to 15 bytes): their CPU is
# the JVM's warm-up, printed apart from the rest of the JVM ("jvm_jit").
JIT_THREADS = ("C1 CompilerThre", "C2 CompilerThre")


@functools.cache
def broker_comm() -> str:
    """The comm of the embedded broker's process, which this run starts as a child."""
    from streaming.broker import resolve_binary

    return Path(resolve_binary()).name[:COMM_LEN]


# ``--broker-pid``: a broker this run did not start, whose CPU counts as the broker's.
EXTERNAL_BROKER: list[int] = []


def process_roles() -> list[tuple[int, str]]:
    """(pid, role) of this process, every live descendant and ``EXTERNAL_BROKER``;
    roles as in ``ROLES``."""
    roles = [(os.getpid(), "driver_py")] + [(pid, "broker") for pid in EXTERNAL_BROKER]
    for pid, name in descendants(os.getpid()):
        if name == "java":
            roles.append((pid, "jvm"))
        elif name.startswith("python"):
            roles.append((pid, "py_workers"))
        elif name == broker_comm():
            roles.append((pid, "broker"))
        else:
            roles.append((pid, "other"))
    return roles


def cpu_by_role() -> dict[str, float]:
    """CPU-seconds so far (user + system) of this run's processes, by role.

    Each process counts with its reaped children (cutime + cstime): a Python
    worker that exits between two readings keeps its share in its parent's."""
    cpu = dict.fromkeys(ROLES, 0)
    for pid, role in process_roles():
        stat = read_stat(f"/proc/{pid}/stat")
        if stat is None:
            continue  # exited meanwhile
        cpu[role] += sum(int(ticks) for ticks in stat[1][11:15])  # utime, stime, cutime, cstime
        if role == "jvm":
            jit = jit_ticks(pid)
            cpu["jvm"] -= jit
            cpu["jvm_jit"] += jit
    return {role: ticks / os.sysconf("SC_CLK_TCK") for role, ticks in cpu.items()}


def jit_ticks(pid: int) -> int:
    """CPU ticks of the JVM's live JIT compiler threads. A compiler thread that
    HotSpot retired meanwhile leaves its ticks in the process total, so they
    count as "jvm" then: the JIT share is a lower bound."""
    ticks = 0
    for task in os.listdir(f"/proc/{pid}/task") if os.path.isdir(f"/proc/{pid}/task") else ():
        stat = read_stat(f"/proc/{pid}/task/{task}/stat")
        if stat is not None and stat[0] in JIT_THREADS:
            ticks += sum(int(t) for t in stat[1][11:13])  # utime, stime
    return ticks


def cpu_used(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    return {role: after[role] - before[role] for role in ROLES}


def per_million(cpu: dict[str, float], events: int) -> tuple[float, float]:
    """CPU-seconds per million events: (without the broker, with it)."""
    without = sum(seconds for role, seconds in cpu.items() if role != "broker")
    return without * 1e6 / events, (without + cpu["broker"]) * 1e6 / events


def memory() -> dict[str, float]:
    """RSS in MB: this driver process, the JVM(s), the Spark Python workers
    (summed: pages a forked worker still shares with the daemon count in each),
    and how many Python worker processes there were."""
    mem = dict.fromkeys(("driver_py", "jvm", "py_workers", "py_worker_count"), 0.0)
    for pid, role in process_roles():
        if role in mem:
            mem[role] += rss_mb(pid)
        mem["py_worker_count"] += role == "py_workers"
    return mem


def produce_all(bootstrap: str, topic: str, values: list[bytes], key: bytes = b"sim-1") -> float:
    """Publish pre-serialized values as fast as possible; returns seconds."""
    from confluent_kafka import Producer

    producer = Producer(
        {"bootstrap.servers": bootstrap, "linger.ms": 20, "compression.type": "lz4", "acks": "all"}
    )
    start = time.perf_counter()
    for value in values:
        while True:
            try:
                producer.produce(topic, value=value, key=key)
                break
            except BufferError:
                producer.poll(0.05)
    if producer.flush(120):
        raise RuntimeError("records left undelivered")
    return time.perf_counter() - start


def simulator(seed: int, fault_rate: float, eps: int = 2000) -> Any:
    from producers.simulator import SimConfig, Simulator

    return Simulator(SimConfig(seed=seed, fault_rate=fault_rate, events_per_second=eps))


def simulate(n: int, seed: int, fault_rate: float, eps: int = 2000) -> tuple[list[dict], list[dict]]:
    sim = simulator(seed, fault_rate, eps)
    events = list(sim.events(n))
    return events, list(sim.truth)


def serialized(event: dict[str, Any]) -> bytes:
    """``event`` as a shipper publishes it, in a bytes object of its own size:
    what orjson returns kept an 8 KB allocation for a 1 KB document (orjson
    3.13: 8,154 bytes per 908-byte result under tracemalloc, 950 for the
    copy), so 300k simulated events held that way took 2.2 GB."""
    return bytes(memoryview(orjson.dumps(event, option=orjson.OPT_SORT_KEYS)))


def simulated_values(n: int, seed: int, fault_rate: float) -> list[bytes]:
    """``n`` simulated events, serialized as they are made (not held as dicts)."""
    return [serialized(e) for e in simulator(seed, fault_rate).events(n)]


def ts(progress: dict[str, Any]) -> float:
    return datetime.fromisoformat(progress["timestamp"].replace("Z", "+00:00")).timestamp()


class Progress:
    """Collects every progress report of a query by batchId (recentProgress keeps 100)."""

    def __init__(self, query: Any):
        self.query = query
        self.batches: dict[int, dict[str, Any]] = {}

    def poll(self) -> None:
        # One report per poll: recentProgress converts every report it keeps (up
        # to 100) through py4j and JSON on each call, which at 20 polls a second
        # had this process and the JVM spend CPU that grew with the run's length
        # (docs/performance.md, "The benchmark's own polling"). It is read only
        # when reports were missed between two polls.
        last = self.query.lastProgress
        if last is not None and last["batchId"] not in self.batches:
            if last["batchId"] > max(self.batches, default=-1) + 1:
                for p in self.query.recentProgress:
                    self.batches[p["batchId"]] = p
            self.batches[last["batchId"]] = last
        if self.query.exception() is not None:
            raise RuntimeError(f"query failed: {self.query.exception()}")

    def rows(self) -> int:
        return sum(p["numInputRows"] for p in self.batches.values())

    def wait_until(self, done: Callable[[], bool], what: str, timeout: float, report: float = 30.0) -> None:
        """Poll until ``done()``; a progress line every ``report`` seconds."""
        deadline, next_report = time.time() + timeout, time.time() + report
        while not done():
            if time.time() > deadline:
                raise TimeoutError(f"no {what} in {timeout:.0f} s (job consumed {self.rows():,} rows)")
            if time.time() > next_report:
                log(f"  ... {self.rows():,} rows read in {len(self.with_input())} batches")
                next_report += report
            time.sleep(POLL_SECONDS)
            self.poll()

    def wait_rows(self, total: int, timeout: float) -> None:
        self.wait_until(lambda: self.rows() >= total, f"{total:,} rows", timeout)

    def with_input(self, after: int = -1) -> list[dict[str, Any]]:
        return [p for b, p in sorted(self.batches.items()) if b > after and p["numInputRows"] > 0]


def batch_end(progress: dict[str, Any]) -> float:
    return ts(progress) + progress["durationMs"]["triggerExecution"] / 1000


@dataclass(frozen=True)
class SteadyCpu:
    """What this run's processes spent over a query's steady batches."""

    cpu: dict[str, float]  # CPU-seconds by role (ROLES)
    rows: int
    batches: int
    read_lag_s: tuple[float, float]  # counters read this long after the first / last batch ended


def steady_cpu(prog: Progress, total: int, timeout: float) -> SteadyCpu:
    """Wait until the query has read ``total`` rows, reading the CPU counters as
    soon as the first batch with input has ended and as soon as the last one
    has: the JVM's start-up and the first batch's Python-worker start stay out,
    as they do from the steady per-batch rates."""
    prog.wait_until(lambda: bool(prog.with_input()), "batch with input", timeout)
    before, before_at = cpu_by_role(), time.time()
    # Any batch that ended before that reading is left out with the first.
    first = prog.with_input()[-1]
    prog.wait_rows(total, timeout)
    after, after_at = cpu_by_role(), time.time()
    steady = prog.with_input(after=first["batchId"])
    if not steady:
        raise RuntimeError(
            "one batch read every event: CPU per event needs --events > --max-events-per-trigger"
        )
    return SteadyCpu(
        cpu_used(before, after),
        sum(b["numInputRows"] for b in steady),
        len(steady),
        (before_at - batch_end(first), after_at - batch_end(steady[-1])),
    )


# A run of (a) or (f): (Kafka source, bucket count).
RunKey = tuple[str, int]


def taking_turns(keys: list[RunKey], rounds: int) -> list[tuple[int, RunKey]]:
    """(round, key) for each run: the keys take turns, in reverse order every
    other round, so that no key always follows another (the first run of a
    session pays the JIT's warm-up)."""
    return [(r, key) for r in range(1, rounds + 1) for key in (keys if r % 2 else keys[::-1])]


def run_name(section: str, key: RunKey) -> str:
    source, buckets = key
    return f"{section} {source} source, {buckets} bucket{'s' if buckets > 1 else ''}"


@dataclass(frozen=True)
class RunFigures:
    """One run's steady rate (median per-batch ev/s without the first batch),
    its total/elapsed rate, and its CPU."""

    steady_rate: float
    total_rate: float
    cpu: SteadyCpu


def medians_over_runs(section: str, by_key: dict[RunKey, list[RunFigures]]) -> list[tuple[str, str]]:
    """Each key's medians over its rounds: steady and total/elapsed rates, CPU
    per event whole and the Python workers' alone (what the detection and the
    operator spend, with neither the JVM's warm-up nor the broker), as ratios
    to the first key's; and, per bucket count, Spark's source against ours."""

    def medians(runs: list[RunFigures]) -> dict[str, float]:
        return {
            "steady": statistics.median(run.steady_rate for run in runs),
            "total": statistics.median(run.total_rate for run in runs),
            "whole": statistics.median(per_million(run.cpu.cpu, run.cpu.rows)[0] for run in runs),
            "broker": statistics.median(per_million(run.cpu.cpu, run.cpu.rows)[1] for run in runs),
            "workers": statistics.median(run.cpu.cpu["py_workers"] * 1e6 / run.cpu.rows for run in runs),
        }

    figures = {key: medians(runs) for key, runs in by_key.items() if runs}
    if not figures:
        return []
    base = next(iter(figures.values()))
    lines = []
    for key, m in figures.items():
        runs = by_key[key]
        lines.append(
            (
                f"{run_name(section, key)}, median of {len(runs)}",
                f"{m['steady']:,.0f} ev/s steady (runs "
                + " ".join(f"{run.steady_rate:,.0f}" for run in runs)
                + f"), {m['total']:,.0f} total/elapsed; {m['whole']:.1f} CPU-s per M events "
                f"({m['whole'] / base['whole']:.2f}x the first's; runs "
                + " ".join(f"{per_million(run.cpu.cpu, run.cpu.rows)[0]:.1f}" for run in runs)
                + f"), {m['broker']:.1f} with the broker; Python workers {m['workers']:.1f} "
                f"({m['workers'] / base['workers']:.2f}x)",
            )
        )
    for (source, buckets), m in figures.items():
        ours = figures.get(("python", buckets))
        if source != "spark" or ours is None:
            continue
        lines.append(
            (
                f"{section} {buckets} bucket{'s' if buckets > 1 else ''}: Spark's source / ours",
                f"{m['steady'] / ours['steady']:.2f}x steady ev/s, {m['total'] / ours['total']:.2f}x "
                f"total/elapsed; {m['whole'] / ours['whole']:.2f}x CPU per event without the broker, "
                f"{m['broker'] / ours['broker']:.2f}x with it",
            )
        )
    return lines


def steady_cpu_results(
    label: str, steady: SteadyCpu, plain: tuple[float, float] | None
) -> list[tuple[str, str]]:
    """Result lines of a query's CPU per event, and its ratio to the plain consumer's
    (``plain``: median CPU-seconds per million events without and with the broker)."""
    without, with_broker = per_million(steady.cpu, steady.rows)
    parts = ", ".join(f"{role} {steady.cpu[role]:.1f}" for role in ROLES)
    lines = [
        (
            f"{label} CPU-s per M events",
            f"{without:.1f} without the broker, {with_broker:.1f} with it, on steady batches "
            f"({steady.rows:,} rows in {steady.batches} batches; CPU-s {parts}; counters read "
            f"{steady.read_lag_s[0]:.2f} s / {steady.read_lag_s[1]:.2f} s after the first / last "
            "batch ended)",
        )
    ]
    if plain:
        lines.append(
            (
                f"{label} / (b) CPU per event",
                f"{without / plain[0]:.2f}x without the broker, {with_broker / plain[1]:.2f}x with it",
            )
        )
    return lines


# ---- (b) the plain consumer ----------------------------------------------------------------------


def plain_consume(
    bootstrap: str, topic: str, partitions: int, total: int, config: DetectorConfig
) -> tuple[float, int]:
    """Read ``total`` records from offset 0 of every partition; returns (seconds, alerts)."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"plain-{time.time()}",
            "enable.auto.commit": False,
            "fetch.max.bytes": 52428800,
        }
    )
    tune_for_detector()  # as fencewatch replay and the job's Python workers do
    detector = Detector(config)
    start = time.perf_counter()
    consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    n = alerts = 0
    while n < total:
        for msg in consumer.consume(10_000, 1.0):
            if msg.error():
                continue
            obj = orjson.loads(msg.value())
            detector.ingest(envelope_from_obj(obj, f"{topic}/{msg.partition()}@{msg.offset()}", msg.offset()))
            alerts += len(detector.drain())
            n += 1
    detector.flush()
    alerts += len(detector.drain())
    elapsed = time.perf_counter() - start
    consumer.close()
    return elapsed, alerts


def plain_live(
    bootstrap: str, topic: str, partitions: int, config: DetectorConfig, ready: Any, stop: Any, out: Any
) -> None:
    """Child process for (c): consume live, record (wall time, alert) as alerts appear."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": f"live-{time.time()}", "enable.auto.commit": False}
    )
    consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    consumer.consume(1, 1.0)
    ready.set()
    tune_for_detector()
    detector = Detector(config)
    got: list[tuple[float, dict]] = []
    last = time.time()
    idle_flush_s = 10.0
    while not stop.is_set():
        msgs = consumer.consume(1000, 0.05)
        for msg in msgs:
            if msg.error():
                continue
            detector.ingest(envelope_from_obj(orjson.loads(msg.value()), "", msg.offset()))
            for alert in detector.drain():
                got.append((time.time(), alert.to_dict()))
        if msgs:
            last = time.time()
        elif detector.pending_count() and time.time() - last > idle_flush_s:
            detector.flush()
            got.extend((time.time(), a.to_dict()) for a in detector.drain())
    consumer.close()
    out.put(got)


# ---- (d) cluster with many partitions -------------------------------------------------------------


def big_cluster(path: str, partitions: int, steady_events: int, steady_batches: int, seed: int) -> None:
    """Child process: a small simulated cluster plus ``partitions`` extra partition
    records; pickles (setup values, [steady batch values...]) to ``path``."""
    from producers import shapes

    sim = simulator(seed, 0.0)
    events = list(sim.events(5000 + steady_events * steady_batches))
    # insert after the simulator's own set-up metadata (the first non-metadata event)
    at = next(i for i, e in enumerate(events) if e["kind"] != "metadata")
    last_meta = events[at - 1]
    offset = last_meta["offset"]
    extra = []
    rng = __import__("random").Random(seed)
    per_topic = 1000
    for t in range(max(1, partitions // per_topic)):
        tid = base64.urlsafe_b64encode(rng.randbytes(16)).decode().rstrip("=")
        offset += 1
        extra.append(
            shapes.envelope(
                "sim-1", "metadata", last_meta["ts_ms"], shapes.topic(f"bulk-{t}", tid), offset=offset
            )
        )
        for p in range(min(per_topic, partitions)):
            reps = rng.sample(range(1, 7), 3)
            offset += 1
            extra.append(
                shapes.envelope(
                    "sim-1",
                    "metadata",
                    last_meta["ts_ms"],
                    shapes.partition(tid, p, reps, reps, reps[0]),
                    offset=offset,
                )
            )
    shift = offset - last_meta["offset"]
    for e in events[at:]:
        if e["kind"] == "metadata" and e["offset"] is not None:
            e["offset"] += shift
    events[at:at] = extra
    split = len(events) - steady_events * steady_batches
    setup = [serialized(e) for e in events[:split]]
    steady = [
        [serialized(e) for e in events[split + i * steady_events : split + (i + 1) * steady_events]]
        for i in range(steady_batches)
    ]
    with open(path, "wb") as f:
        pickle.dump((setup, steady), f, protocol=pickle.HIGHEST_PROTOCOL)


# ---- main -----------------------------------------------------------------------------------------


class Results(list[tuple[str, str]]):
    """The (name, figure) lines printed at the end, each also logged as it is
    measured: a long run stopped early keeps what it measured in its log."""

    def append(self, line: tuple[str, str]) -> None:
        log(f"{line[0]}: {line[1]}")
        super().append(line)

    def extend(self, lines: Iterable[tuple[str, str]]) -> None:
        for line in lines:
            self.append(line)


class ExternalKafka:
    """``--bootstrap-servers``: a running Kafka cluster, where this run creates its topics."""

    def __init__(self, bootstrap_servers: str):
        self.bootstrap_servers = bootstrap_servers

    def __enter__(self) -> ExternalKafka:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def create_topics(self, topics: dict[str, int]) -> None:
        from confluent_kafka.admin import AdminClient, NewTopic

        admin = AdminClient({"bootstrap.servers": self.bootstrap_servers})
        futures = admin.create_topics([NewTopic(name, partitions, 1) for name, partitions in topics.items()])
        for future in futures.values():
            future.result(30)


def floor_query(spark: Any, bootstrap: str, topic: str, checkpoint: str, max_events: int, source: str) -> Any:
    """The job's query (streaming/job.py) without detection, for section (f),
    reading with the job's ``source`` (kafka_source.SOURCES)."""
    import pandas as pd
    from pyspark.sql.streaming.stateful_processor import StatefulProcessor

    from streaming.kafka_source import read_events
    from streaming.routing import route
    from streaming.schema import OUTPUT_COLUMNS, OUTPUT_SCHEMA

    class Floor(StatefulProcessor):  # defined here so that cloudpickle ships it to the workers
        def init(self, handle: Any) -> None:
            self.seen = handle.getValueState("seen", "n long")

        def handleInputRows(self, key: Any, rows: Any, timerValues: Any) -> Any:
            n = sum(len(batch["value"].tolist()) for batch in rows)
            self.seen.update(((self.seen.get() or (0,))[0] + n,))
            yield pd.DataFrame([], columns=OUTPUT_COLUMNS)

        def close(self) -> None:
            pass

    options = {
        "kafka.bootstrap.servers": bootstrap,
        "subscribe": topic,
        "startingOffsets": "earliest",
        "maxEventsPerTrigger": str(max_events),
    }
    detected = (
        route(read_events(spark, options, source=source, route_buckets=1), 1)
        .groupBy("key")
        .transformWithStateInPandas(
            statefulProcessor=Floor(), outputStructType=OUTPUT_SCHEMA, outputMode="Append", timeMode="None"
        )
    )
    return (
        detected.writeStream.format("noop")
        .option("checkpointLocation", checkpoint)
        .trigger(processingTime="0.5 seconds")
        .start()
    )


def batch_phases(batches: list[dict[str, Any]]) -> str:
    """Median ms of each ``durationMs`` phase and of the stateful operator's
    update and commit time over ``batches``."""
    phases: dict[str, list[float]] = {}
    for b in batches:
        for name, ms in b["durationMs"].items():
            phases.setdefault(name, []).append(ms)
        for op in b.get("stateOperators", []):
            phases.setdefault("state updates", []).append(op["allUpdatesTimeMs"])
            phases.setdefault("state commit", []).append(op["commitTimeMs"])
    return "median ms: " + ", ".join(f"{name} {statistics.median(v):,.0f}" for name, v in phases.items())


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    p.add_argument("--events", type=int, default=300_000, help="events for (a)/(b) (default %(default)s)")
    p.add_argument("--topic-partitions", type=int, default=2, help="partitions of the event topics")
    p.add_argument("--max-events-per-trigger", type=int, default=50_000)
    p.add_argument("--repeat", type=int, default=3, help="plain-consumer runs for (b)")
    p.add_argument("--rate", type=int, action="append", help="input rate(s) for (c) (default 2000)")
    p.add_argument("--latency-seconds", type=float, default=40.0, help="publishing time per rate")
    p.add_argument("--latency-fault-rate", type=float, default=0.003)
    p.add_argument("--partitions", type=int, action="append", help="tracked partitions for (d)")
    p.add_argument(
        "--setup-timeout",
        type=float,
        default=600.0,
        help="seconds (d) may take to consume the partition records",
    )
    p.add_argument("--steady-events", type=int, default=20_000)
    p.add_argument("--steady-batches", type=int, default=3)
    p.add_argument(
        "--setup-batch-events",
        type=int,
        default=200_000,
        help="(d): at most this many set-up records a micro-batch (default %(default)s)",
    )
    p.add_argument("--idle-seconds", type=float, default=30.0, help="idle time measured in (e)")
    p.add_argument(
        "--buckets",
        type=int,
        action="append",
        help="buckets per cluster for (a), repeatable: one run of (a) each (default 1 and 8)",
    )
    p.add_argument(
        "--bucket-rounds",
        type=int,
        default=1,
        help="(a): run every --buckets count this many times, taking turns, and print the medians",
    )
    p.add_argument("--seed", type=int, default=1)
    p.add_argument(
        "--jvm-options",
        default="",
        help="Java options of the job's JVM, as --jvm-options=OPTIONS (fencewatch run's option)",
    )
    p.add_argument(
        "--measure-clocks",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="the job's and the plain consumer's detectors measure every node's clock, as every "
        "fencewatch command does unless told not to (default: measure)",
    )
    p.add_argument(
        "--kafka-source",
        action="append",
        choices=SOURCES,
        help="the job's Kafka source for (a) and (f), repeatable: each is run, taking turns with the "
        "bucket counts, and compared (default python; Spark's source does not read the embedded "
        "broker's tail: streaming/spark_kafka.py)",
    )
    p.add_argument(
        "--bootstrap-servers",
        help="run against this Kafka cluster instead of the embedded broker (topics are created there)",
    )
    p.add_argument(
        "--broker-pid",
        type=int,
        action="append",
        default=[],
        help="with --bootstrap-servers: a broker process whose CPU counts as the broker's, repeatable",
    )
    p.add_argument("--skip", default="", help="comma list of sections to skip: a,b,c,d,e,f")
    args = p.parse_args(argv)
    sources = list(dict.fromkeys(args.kafka_source or ["python"]))
    EXTERNAL_BROKER.extend(args.broker_pid)
    rates = args.rate or [2000]
    # A count named twice would share a checkpoint: each is run once a round.
    bucket_counts = list(dict.fromkeys(args.buckets or [1, 8]))
    sizes = args.partitions or [1000, 100_000]
    skip = set(filter(None, args.skip.split(",")))
    cfg = DetectorConfig(measure_clocks=args.measure_clocks)
    results = Results()

    from confluent_kafka import Consumer  # noqa: F401  (fail early when missing)

    from streaming.broker import EmbeddedBroker
    from streaming.job import JobOptions, spark_session, start

    workdir = Path(tempfile.mkdtemp(prefix="fencewatch-sbench-"))
    ctx = mp.get_context("spawn")
    t0 = time.time()
    with ExternalKafka(args.bootstrap_servers) if args.bootstrap_servers else EmbeddedBroker() as broker:
        bootstrap = broker.bootstrap_servers
        tp = args.topic_partitions

        def job(topic: str, name: str, on_alert: Any = None, **kw: Any) -> Any:
            options = JobOptions(
                bootstrap_servers=bootstrap,
                topic=topic,
                checkpoint=str(workdir / f"ckpt-{name}"),
                alerts_topic=f"alerts-{name}",
                dead_letter_topic=f"dead-{name}",
                detector=cfg,
                **kw,
            )
            broker.create_topics({f"alerts-{name}": 1, f"dead-{name}": 1})
            return start(spark, options, console=None, on_alert=on_alert)

        # ---- (a) + (b) ----
        log(f"simulating {args.events:,} events ...")
        values = simulated_values(args.events, args.seed, 0.0005)
        n = len(values)
        broker.create_topics({"bench-a": tp})
        pub_s = produce_all(bootstrap, "bench-a", values)
        del values
        log(f"published {n:,} events in {pub_s:.1f} s ({n / pub_s:,.0f}/s)")
        results.append(("events (a)/(b)", f"{n:,} in topic with {tp} partitions, one cluster key"))

        plain_rates: list[float] = []
        plain_cpu: tuple[float, float] | None = None
        if "b" not in skip:
            secs, cpu_runs = [], []
            for i in range(args.repeat):
                cpu0 = cpu_by_role()
                s, alerts = plain_consume(bootstrap, "bench-a", tp, n, cfg)
                cpu_runs.append(per_million(cpu_used(cpu0, cpu_by_role()), n))
                secs.append(s)
                log(f"plain consumer run {i + 1}: {s:.2f} s, {alerts} alerts")
            plain_rates = [n / s for s in secs]
            plain_cpu = (
                statistics.median(without for without, _ in cpu_runs),
                statistics.median(with_broker for _, with_broker in cpu_runs),
            )
            results.append(
                (
                    "(b) plain consumer ev/s",
                    f"median {statistics.median(plain_rates):,.0f}  runs "
                    + " ".join(f"{r:,.0f}" for r in plain_rates),
                )
            )
            results.append(
                (
                    "(b) CPU-s per M events",
                    f"median {plain_cpu[0]:.1f} without the broker, {plain_cpu[1]:.1f} with it "
                    "(whole runs: this process, and the broker's share of the read); runs "
                    + " ".join(f"{without:.1f}/{with_broker:.1f}" for without, with_broker in cpu_runs),
                )
            )

        log("starting Spark ...")
        s0 = time.time()
        spark = spark_session(
            "local[2]",
            shuffle_partitions=2,
            jvm_options=args.jvm_options,
            kafka_connector="spark" in sources,
        )
        results.append(("spark session start", f"{time.time() - s0:.1f} s (excluded)"))
        spark_rate = None
        first_run = True
        a_runs = [(source, count) for source in sources for count in bucket_counts]
        a_figures: dict[RunKey, list[RunFigures]] = {key: [] for key in a_runs}
        for r, (source, buckets) in taking_turns(a_runs, args.bucket_rounds) if "a" not in skip else []:
            rounds = f", round {r}" if args.bucket_rounds > 1 else ""
            a = f"{run_name('(a)', (source, buckets))}{rounds}:"
            q = job(
                "bench-a",
                f"a{source}{buckets}-{r}",
                max_events_per_trigger=args.max_events_per_trigger,
                trigger_seconds=0.5,
                buckets=buckets,
                kafka_source=source,
            )
            prog = Progress(q)
            job_cpu = steady_cpu(prog, n, timeout=900)
            if "e" not in skip and first_run:
                idle_from = max(prog.batches)
                cpu0, w0 = cpu_by_role(), time.time()
                time.sleep(args.idle_seconds)
                idle_cpu = sum(cpu_used(cpu0, cpu_by_role()).values()) / (time.time() - w0)
                prog.poll()
                idle_batches = sum(b > idle_from for b in prog.batches)
            q.stop()
            batches = prog.with_input()
            first, last = batches[0], batches[-1]
            elapsed = batch_end(last) - ts(first)
            spark_rate = n / elapsed
            per_batch = [b["numInputRows"] * 1000 / b["durationMs"]["triggerExecution"] for b in batches]
            steady = per_batch[1:] or per_batch
            a_figures[(source, buckets)].append(RunFigures(statistics.median(steady), spark_rate, job_cpu))
            results.append(
                (
                    f"{a} Spark job ev/s (total/elapsed)",
                    f"{spark_rate:,.0f}  ({n:,} rows, {len(batches)} batches, "
                    f"{elapsed:.1f} s first batch start -> last batch end)",
                )
            )
            results.append(
                (
                    f"{a} Spark per-batch ev/s",
                    f"median {statistics.median(per_batch):,.0f} all, "
                    f"{statistics.median(steady):,.0f} without 1st batch; "
                    "batch s: "
                    + " ".join(f"{b['durationMs']['triggerExecution'] / 1000:.1f}" for b in batches),
                )
            )
            results.append((f"{a} batch phases", batch_phases(batches[1:] or batches)))
            results.extend(steady_cpu_results(a, job_cpu, plain_cpu))
            if plain_rates:
                plain_rate = statistics.median(plain_rates)
                results.append(
                    (
                        f"{a} Spark / plain (b)",
                        f"{statistics.median(steady) / plain_rate:.2f}x on steady batches (without the 1st), "
                        f"{spark_rate / plain_rate:.2f}x total/elapsed",
                    )
                )
            if "e" not in skip and first_run:
                results.append(
                    (
                        "(e) idle job",
                        f"{idle_cpu:.0%} of one core over {args.idle_seconds:.0f} s of an idle topic "
                        f"(all processes of this run); {idle_batches} micro-batches ran meanwhile",
                    )
                )
            first_run = False
        if "a" not in skip and (args.bucket_rounds > 1 or len(sources) > 1):
            results.extend(medians_over_runs("(a)", a_figures))

        f_runs = [(source, 1) for source in sources]
        floors: dict[RunKey, list[RunFigures]] = {key: [] for key in f_runs}
        for r, (source, _) in taking_turns(f_runs, args.bucket_rounds) if "f" not in skip else []:
            f = f"(f) {source} source{f', round {r}' if args.bucket_rounds > 1 else ''}"
            q = floor_query(
                spark,
                bootstrap,
                "bench-a",
                str(workdir / f"ckpt-f{source}-{r}"),
                args.max_events_per_trigger,
                source,
            )
            prog = Progress(q)
            floor_cpu = steady_cpu(prog, n, timeout=900)
            q.stop()
            batches = prog.with_input()
            floor = [b["numInputRows"] * 1000 / b["durationMs"]["triggerExecution"] for b in batches[1:]]
            elapsed = batch_end(batches[-1]) - ts(batches[0])
            floors[(source, 1)].append(RunFigures(statistics.median(floor), n / elapsed, floor_cpu))
            results.append(
                (
                    f"{f} Spark without detection",
                    f"per-batch median {statistics.median(floor):,.0f} ev/s without 1st batch; batch s: "
                    + " ".join(f"{b['durationMs']['triggerExecution'] / 1000:.1f}" for b in batches),
                )
            )
            results.append((f"{f} batch phases", batch_phases(batches[1:] or batches)))
            results.extend(steady_cpu_results(f, floor_cpu, plain_cpu))
        if "f" not in skip and (args.bucket_rounds > 1 or len(sources) > 1):
            results.extend(medians_over_runs("(f)", floors))

        # ---- (c) latency ----
        for rate in rates if "c" not in skip else []:
            name = f"c{rate}"
            topic = f"bench-{name}"
            broker.create_topics({topic: tp})
            total = int(rate * args.latency_seconds)
            log(f"(c) rate {rate}/s: simulating {total:,} events ...")
            ev, tr = simulate(total, args.seed + rate, args.latency_fault_rate, eps=rate)
            vals = [serialized(e) for e in ev]
            spark_alerts: list[tuple[float, dict]] = []
            q = job(
                topic,
                name,
                on_alert=lambda payload, sink=spark_alerts: sink.append((time.time(), orjson.loads(payload))),
                trigger_seconds=0.5,
                buckets=max(bucket_counts),
            )
            prog = Progress(q)
            time.sleep(3)
            ready, stop, out = ctx.Event(), ctx.Event(), ctx.Queue()
            child = ctx.Process(target=plain_live, args=(bootstrap, topic, tp, cfg, ready, stop, out))
            child.start()
            ready.wait(60)
            from confluent_kafka import Producer

            producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "compression.type": "lz4"})
            from producers.kafka_publisher import TokenBucket

            bucket = TokenBucket(rate)
            sent_at = [0.0] * len(vals)
            pub_start = time.time()
            for i, v in enumerate(vals):
                bucket.take()
                while True:
                    try:
                        producer.produce(topic, value=v, key=b"sim-1")
                        break
                    except BufferError:
                        producer.poll(0.01)
                sent_at[i] = time.time()
                if i % 256 == 0:
                    producer.poll(0)
            producer.flush(60)
            pub_s = time.time() - pub_start
            log(f"(c) published {len(vals):,} in {pub_s:.1f} s ({len(vals) / pub_s:,.0f}/s achieved)")
            # wait for Spark to catch up (bounded), then for the idle flush of the tail
            try:
                prog.wait_rows(len(vals), timeout=max(60.0, args.latency_seconds * 2))
                caught_up = True
            except TimeoutError as exc:
                log(f"(c) {exc}")
                caught_up = False
            lag_s = time.time() - pub_start - pub_s
            time.sleep(3)
            stop.set()
            plain_got = out.get(timeout=120)
            child.join(30)
            prog.poll()
            q.stop()
            # publish time of each (ts_ms, node) event, and of each ts_ms
            by_key: dict[tuple[int, Any], float] = {}
            by_ts: dict[int, float] = {}
            for e, t in zip(ev, sent_at, strict=True):
                by_key.setdefault((e["ts_ms"], e["node"]), t)
                by_ts.setdefault(e["ts_ms"], t)
            cutoff = ev[-1]["ts_ms"] - (cfg.grace_ms + cfg.lateness_ms + 2000)
            wanted = {match_key(t): t for t in tr if t["ts_ms"] <= cutoff}

            def latencies(
                got: list[tuple[float, dict]],
                wanted: dict = wanted,
                by_key: dict = by_key,
                by_ts: dict = by_ts,
            ) -> list[float]:
                """Every scored violation's latency: one not alerted when the run
                ended counts as a latency beyond the run (infinite)."""
                lat = {}
                for when, alert in got:
                    key = match_key(alert)
                    tt = wanted.get(key)
                    if tt is None or key in lat:
                        continue
                    sent = by_key.get((tt["ts_ms"], tt["node"]), by_ts.get(tt["ts_ms"]))
                    if sent is not None:
                        lat[key] = when - sent
                return [*lat.values(), *[float("inf")] * (len(wanted) - len(lat))]

            ls, lp = latencies(spark_alerts), latencies(plain_got)
            batches = prog.with_input()
            bsec = [b["durationMs"]["triggerExecution"] / 1000 for b in batches]
            results.append(
                (
                    f"(c) rate {rate}/s achieved",
                    f"{len(vals) / pub_s:,.0f} ev/s over {pub_s:.0f} s; {len(wanted)} violations scored "
                    f"(of {len(tr)} injected; the tail is excluded); "
                    f"Spark {'caught up' if caught_up else 'DID NOT catch up'} "
                    f"{lag_s:.1f} s after publishing ended; Spark batch s median "
                    f"{statistics.median(bsec) if bsec else float('nan'):.2f} "
                    f"max {max(bsec, default=float('nan')):.2f}",
                )
            )
            for label, lat in (("Spark", ls), ("plain", lp)):
                alerted = sum(x != float("inf") for x in lat)
                results.append(
                    (
                        f"(c) {rate}/s {label} latency",
                        f"p50 {pct(lat, 0.5):.2f} s  p99 {pct(lat, 0.99):.2f} s  "
                        f"max {max(lat, default=float('nan')):.2f} s  ({alerted} of {len(lat)} alerted)",
                    )
                )
            # What the detector itself waits, in event time, on the same history:
            # the whole cluster, and the job's buckets sharing clocks about once a
            # second of events (the job shares them after each micro-batch).
            layouts = [(1, 0), (max(bucket_counts), rate)] if cfg.measure_clocks else [(1, 0)]
            for count, every in layouts:
                got = event_time_wait.waits(ev, cfg, count, every)
                w = [ms / 1000 for ms, alert in got.values() if match_key(alert) in wanted]
                results.append(
                    (
                        f"(c) {rate}/s event-time wait, {count} bucket(s)",
                        f"p50 {pct(w, 0.5):.2f} s  p99 {pct(w, 0.99):.2f} s  (n={len(w)}; in one process)",
                    )
                )
            if ls and lp:
                results.append(
                    (
                        f"(c) {rate}/s Spark / plain",
                        f"p50 {pct(ls, 0.5) / pct(lp, 0.5):.2f}x  p99 {pct(ls, 0.99) / pct(lp, 0.99):.2f}x",
                    )
                )

        # ---- (d) partition growth ----
        for size in sizes if "d" not in skip else []:
            name = f"d{size}"
            topic = f"bench-{name}"
            broker.create_topics({topic: tp})
            log(f"(d) {size:,} partitions: building records in a child process ...")
            g0 = time.time()
            path = str(workdir / f"{name}.pkl")
            child = ctx.Process(
                target=big_cluster, args=(path, size, args.steady_events, args.steady_batches, args.seed)
            )
            child.start()
            child.join()
            with open(path, "rb") as f:
                setup, steady = pickle.load(f)
            os.unlink(path)
            gen_s = time.time() - g0
            produce_all(bootstrap, topic, setup)
            log(f"(d) {len(setup):,} set-up records published ({gen_s:.0f} s to build); job consumes ...")
            c0 = time.time()
            q = job(topic, name, trigger_seconds=0.5, max_events_per_trigger=args.setup_batch_events)
            prog = Progress(q)
            prog.wait_rows(len(setup), timeout=args.setup_timeout)
            setup_s = time.time() - c0
            # Where the load's time went: each set-up batch's rows and duration.
            log(
                "(d) set-up batches (rows, s): "
                + ", ".join(
                    f"{b['numInputRows']:,} {b['durationMs']['triggerExecution'] / 1000:.1f}"
                    for b in prog.with_input()
                )
            )
            durations, rows = [], []
            for chunk in steady:
                time.sleep(1.0)
                prog.poll()
                mark = max(prog.batches, default=-1)
                before = prog.rows()
                produce_all(bootstrap, topic, chunk)
                prog.wait_rows(before + len(chunk), timeout=600)
                new = prog.with_input(after=mark)
                durations.append(sum(b["durationMs"]["triggerExecution"] for b in new) / 1000)
                rows.append(len(new))
            mem = memory()
            q.stop()
            results.append(
                (
                    f"(d) {size:,} partitions",
                    f"steady {args.steady_events:,}-event batch s: median {statistics.median(durations):.2f} "
                    f"(runs {' '.join(f'{d:.2f}' for d in durations)}; micro-batches per chunk {rows}); "
                    f"set-up {len(setup):,} records consumed in {setup_s:.0f} s "
                    f"({args.setup_batch_events:,} a micro-batch at most); "
                    f"RSS MB driver-py {mem['driver_py']:,.0f} "
                    f"JVM {mem['jvm']:,.0f} py-workers {mem['py_workers']:,.0f} "
                    f"({mem['py_worker_count']:.0f} processes)",
                )
            )
            log(results[-1][1])
        spark.stop()

    shutil.rmtree(workdir, ignore_errors=True)
    print()
    print(
        f"machine: {os.cpu_count()} CPUs, Python {sys.version.split()[0]}, master local[2], "
        f"shuffle partitions 2, event topics {tp} partitions, JVM options {args.jvm_options or '(none)'}, "
        f"total run {time.time() - t0:.0f} s"
    )
    clocks = "measured, as every command does" if cfg.measure_clocks else "unmeasured (--no-measure-clocks)"
    print(
        f"detection: grace {cfg.grace_ms} ms + lateness {cfg.lateness_ms} ms of event time before a "
        f"judgment (by design: latency cannot go below ~that much); clocks {clocks}"
    )
    width = max(len(k) for k, _ in results)
    for key, value in results:
        print(f"{key:<{width}}  {value}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
