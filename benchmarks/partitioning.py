"""How the work of ONE Kafka cluster spreads over two Spark executors when the
streaming job splits the cluster into buckets (detectors/buckets.py,
streaming/routing.py, docs/architecture.md "Keys and state in Spark").

    flock /tmp/fencewatch-bench.lock .venv/bin/python benchmarks/partitioning.py
    .venv/bin/python benchmarks/partitioning.py --events 20000 --buckets 1 --buckets 8

Set-up, once per run: a Spark standalone cluster from the pyspark wheel
(tests/integration/spark_cluster.py: one master and TWO workers with 1 core
each, so each worker runs one 1-core executor), an embedded broker (tansu),
and ``--events`` simulated events of one cluster
(``Simulator(SimConfig(seed, fault_rate=0.0005))``) published to a topic of
``--topic-partitions`` partitions, every record keyed by its cluster (so
they all land in one Kafka partition, as one real cluster's shipper would
key them).

First an unmeasured warm-up run (the first bucket count over the first
``--warmup-events`` events, default two batches' worth, in a topic of their
own): every run of this process shares one driver JVM, whose CPU per batch
falls from run to run as it warms up (without the warm-up: 8.6-9.1 CPU-s in
the first run's steady batches against 3.3-5.8 in the later ones). The
warm-up shrinks that bias in favour of the later runs; it does not remove it,
so the executors' CPU is printed on its own as well.

Then, for each ``--buckets`` count (repeatable; default 1, 8, 64), in this
process: a fresh SparkSession on the cluster (a new application with two new
executors; the session mirrors ``streaming.job.spark_session`` except that
Spark's UI is on, for its REST API), ``streaming.job.start`` with that bucket
count, ``--shuffle-partitions`` state partitions, ``--max-events-per-trigger``
(default: a sixth of the events) and a fresh checkpoint, run until the query
has read every event; then the query and the session stop, and the next run
waits until this one's executors have exited (a worker that reaps an executor
adds all of its CPU time to its own cutime). Figures per bucket count:

- Each executor's share of the stateful operator's input: from the UI's REST
  API (``/api/v1/applications/<app>/stages?details=true``), the shuffle
  records read by every successful task of the stateful stages (the stages
  that read the shuffle written by the routing stage: one per micro-batch),
  summed per executor, as a share of the total. Each executor is named by
  its worker (the worker whose work directory holds the executor's
  directory). The same records are summed per shuffle partition (task
  index), and set next to the count expected from ``buckets_of`` (the
  reference of the routing) for the keys Spark's hash puts on that partition
  (``pmod(hash(key), shuffle partitions)``, computed in Spark); each
  partition's key count says how many of its keys get records of their own
  (not only the copies of cluster-wide records: the simulated cluster's
  topics have 8 partitions, so with 64 buckets 56 keys get only copies).
  The routing stage's rows written (the Kafka read and the routing, before
  the shuffle) are printed per executor too: with every record keyed by the
  cluster, one Kafka partition holds them all, and one task per batch reads
  them.
- Routed rows vs source events: the total shuffle records read by the
  stateful stages (one row per record and bucket it goes to; cluster-wide
  records go to every bucket) against the query's input rows.
- CPU-seconds per million events of the whole cluster, over the batches
  after the first: the CPU counters (utime + stime + cutime + cstime from
  /proc/PID/stat) of every process this run started, read as soon as polling
  the progress shows the first batch with input has ended and as soon as the
  query has read every event (the lag is printed). Processes by role: this
  driver process, its JVM, the master, the workers, each worker's executor
  JVM and Python workers (descendants of the worker processes), the broker.
  Printed with and without the broker, per million events of the batches
  after the first, and as a ratio to the 1-bucket figure; the executors'
  share alone too (their JVMs and Python workers: the part that scales out,
  and the part the driver JVM's warm-up does not blur), and, from the REST
  API, the executors' task-thread CPU (``executorCpuTime``, JVM only) of the
  routing stages and of the stateful stages of the batches after the first.
- Batch count (batches with input), each batch's time (``triggerExecution``
  from the query's progress), and the wall time from the start of the first
  batch with input to the end of the last (the session's and executors'
  start-up are excluded and printed separately).

This machine has 2 cores: the two workers' executors share them with the
broker, the driver, the master and the workers, so wall-clock speed-up cannot
be shown here; the benchmark shows the split of the work and its CPU cost.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
import urllib.request
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT / "tests" / "integration"))

from spark_cluster import StandaloneCluster  # noqa: E402
from streaming_throughput import (  # noqa: E402
    Progress,
    batch_end,
    broker_comm,
    log,
    per_million,
    process_table,
    read_stat,
    ts,
)

from detectors.envelope import envelope_from_obj  # noqa: E402

WORKERS = 2


# ---- CPU of every process of this run, by role ----------------------------------------------------


def process_roles(cluster: StandaloneCluster) -> list[tuple[int, str]]:
    """(pid, role) of this process and every live descendant. The master and
    workers are this process's children (spark-class execs their JVM); a
    worker's executors are its children, their Python workers theirs."""
    children, comm = process_table()
    master = cluster.master.pid if cluster.master is not None else -1
    workers = {w.pid: n for n, w in enumerate(cluster.workers, 1)}
    roles = [(os.getpid(), "driver Python")]

    def walk(pid: int, role: Callable[[int], str]) -> None:
        for child in children.get(pid, []):
            roles.append((child, role(child)))
            walk(child, role)

    for child in children.get(os.getpid(), []):
        name = comm.get(child, "")
        if child == master:
            roles.append((child, "master"))
            walk(child, lambda _pid: "master")
        elif child in workers:
            n = workers[child]
            roles.append((child, "workers"))
            for executor in children.get(child, []):
                is_jvm = comm.get(executor) == "java"
                roles.append((executor, f"executor {n} JVM" if is_jvm else "workers"))
                walk(executor, functools.partial(executor_role, comm, n))
        elif name == broker_comm():
            roles.append((child, "broker"))
            walk(child, lambda _pid: "broker")
        elif name == "java":
            roles.append((child, "driver JVM"))
            walk(child, lambda _pid: "driver JVM")
        else:
            roles.append((child, "other"))
            walk(child, lambda _pid: "other")
    return roles


def executor_role(comm: dict[int, str], worker: int, pid: int) -> str:
    return f"executor {worker} JVM" if comm.get(pid) == "java" else f"executor {worker} Python"


def role_names() -> list[str]:
    names = ["driver Python", "driver JVM", "master", "workers"]
    for n in range(1, WORKERS + 1):
        names += [f"executor {n} JVM", f"executor {n} Python"]
    return [*names, "broker", "other"]


def cpu_by_role(cluster: StandaloneCluster) -> dict[str, float]:
    """CPU-seconds so far (user + system, with reaped children) by role."""
    ticks = dict.fromkeys(role_names(), 0)
    for pid, role in process_roles(cluster):
        stat = read_stat(f"/proc/{pid}/stat")
        if stat is not None:  # else exited meanwhile
            ticks[role] = ticks.get(role, 0) + sum(int(t) for t in stat[1][11:15])
    return {role: t / os.sysconf("SC_CLK_TCK") for role, t in ticks.items()}


def executors_alive(cluster: StandaloneCluster) -> int:
    """Executor JVMs still running (a worker also keeps a bash child of its own)."""
    children, comm = process_table()
    return sum(comm.get(c) == "java" for w in cluster.workers for c in children.get(w.pid, []))


# ---- the query's progress -------------------------------------------------------------------------


# ---- Spark's REST API -------------------------------------------------------------------------------


def rest(ui: str, path: str) -> Any:
    with urllib.request.urlopen(f"{ui}/api/v1/{path}", timeout=60) as response:
        return json.load(response)


def cluster_session(cluster: StandaloneCluster, shuffle_partitions: int, ui_port: int, name: str) -> Any:
    """``streaming.job.spark_session`` on the cluster, with the UI on (for its
    REST API) and 1-core executors, one per worker."""
    from pyspark.sql import SparkSession

    from streaming.job import ROCKSDB_PROVIDER

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    session = (
        SparkSession.builder.master(cluster.url)
        .appName(name)
        .config("spark.sql.streaming.stateStore.providerClass", ROCKSDB_PROVIDER)
        .config("spark.sql.shuffle.partitions", str(shuffle_partitions))
        .config("spark.ui.enabled", "true")
        .config("spark.ui.port", str(ui_port))
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.executor.cores", "1")
        .config("spark.cores.max", str(WORKERS))
        .config("spark.executor.memory", "1g")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    return session


def executor_workers(cluster: StandaloneCluster, app_id: str) -> dict[str, int]:
    """Executor id -> number of the worker that runs it (from the workers' work directories)."""
    found = {}
    for n in range(1, WORKERS + 1):
        base = cluster.work_dir / ("executors" if n == 1 else f"executors-{n}") / app_id
        for path in base.glob("*") if base.exists() else []:
            found[path.name] = n
    return found


def stateful_stages(stages: list[dict[str, Any]], partitions: int) -> list[dict[str, Any]]:
    """The completed stages that read the routing's shuffle: the stateful operator's, one per
    batch, one task per shuffle partition (the job's only shuffle)."""
    return [
        s
        for s in stages
        if s["status"] == "COMPLETE" and s.get("shuffleReadRecords", 0) > 0 and s["numTasks"] == partitions
    ]


def routing_stages(stages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The completed stages that write the shuffle: the Kafka read and the routing."""
    return [s for s in stages if s["status"] == "COMPLETE" and s.get("shuffleWriteRecords", 0) > 0]


# ---- expected routing -------------------------------------------------------------------------------


def expected_rows(events: list[dict], buckets: int) -> tuple[Counter[int], Counter[int]]:
    """Routed rows per bucket, by the routing's reference (detectors.buckets.buckets_of):
    all of them, and those of records not fanned out to every bucket."""
    from detectors.buckets import buckets_of

    rows: Counter[int] = Counter()
    own: Counter[int] = Counter()
    for i, e in enumerate(events):
        targets = buckets_of(envelope_from_obj(e, "", i), buckets)
        for b in targets:
            rows[b] += 1
            if buckets == 1 or len(targets) < buckets:
                own[b] += 1
    return rows, own


def key_partitions(session: Any, cluster_name: str, buckets: int, partitions: int) -> dict[int, int]:
    """Bucket -> the shuffle partition Spark hashes its grouping key onto."""
    from pyspark.sql import functions as F

    from streaming.routing import encode_key

    keys = [(b, encode_key(cluster_name, b, buckets)) for b in range(buckets)]
    frame = session.createDataFrame(keys, "bucket int, key string")
    rows = frame.select("bucket", F.expr(f"pmod(hash(key), {partitions})").alias("p")).collect()
    return {r.bucket: r.p for r in rows}


# ---- one bucket count -------------------------------------------------------------------------------


def run_buckets(
    args: argparse.Namespace,
    cluster: StandaloneCluster,
    broker: Any,
    workdir: Path,
    topic: str,
    events: list[dict],
    buckets: int,
    name: str = "",
) -> dict[str, Any]:
    from streaming.broker import free_port
    from streaming.job import JobOptions, start

    n = len(events)
    name = name or f"b{buckets}"
    broker.create_topics({f"alerts-{name}": 1, f"dead-{name}": 1})
    ui_port = free_port()
    s0 = time.time()
    session = cluster_session(cluster, args.shuffle_partitions, ui_port, f"fencewatch-partitioning-{name}")
    sc = session.sparkContext
    app_id, ui = sc.applicationId, f"http://127.0.0.1:{ui_port}"
    deadline = time.time() + 180
    while len([e for e in rest(ui, f"applications/{app_id}/executors") if e["id"] != "driver"]) < WORKERS:
        if time.time() > deadline:
            raise TimeoutError(f"{WORKERS} executors did not register in 180 s")
        time.sleep(0.2)
    startup_s = time.time() - s0
    log(f"{buckets} bucket(s): application {app_id} with {WORKERS} executors up in {startup_s:.1f} s")

    options = JobOptions(
        bootstrap_servers=broker.bootstrap_servers,
        topic=topic,
        checkpoint=str(workdir / f"ckpt-{name}"),
        alerts_topic=f"alerts-{name}",
        dead_letter_topic=f"dead-{name}",
        max_events_per_trigger=args.max_events_per_trigger,
        trigger_seconds=args.trigger_seconds,
        buckets=buckets,
    )
    alerts: list[str] = []
    query = start(session, options, console=None, on_alert=alerts.append)
    prog = Progress(query)
    try:
        prog.wait_until(lambda: bool(prog.with_input()), "batch with input", args.timeout)
        cpu0, cpu0_at = cpu_by_role(cluster), time.time()
        first = prog.with_input()[-1]  # any batch that ended before the reading is left out with it
        log(f"  first batch ({first['numInputRows']:,} rows) done; CPU counters read")
        prog.wait_until(lambda: prog.rows() >= n, f"{n:,} rows", args.timeout)
        cpu1, cpu1_at = cpu_by_role(cluster), time.time()
    finally:
        query.stop()
    batches = prog.with_input()
    steady = prog.with_input(after=first["batchId"])
    if not steady:
        raise RuntimeError("one batch read every event: needs --events > --max-events-per-trigger")
    log(f"  {prog.rows():,} rows read in {len(batches)} batches; {len(alerts)} alerts")

    # The UI's store takes the last task ends from the listener bus: wait until it is stable.
    stages: list[dict[str, Any]] = []
    for _ in range(100):
        fresh = rest(ui, f"applications/{app_id}/stages?details=true&withSummaries=false")
        settled = all(s["status"] in ("COMPLETE", "SKIPPED", "FAILED") for s in fresh)
        if settled and len(fresh) == len(stages):
            break
        stages = fresh
        time.sleep(0.5)
    stages = fresh
    (workdir / f"stages-{name}.json").write_text(json.dumps(stages))
    where = executor_workers(cluster, app_id)
    partition_of = key_partitions(session, events[0]["cluster"], buckets, args.shuffle_partitions)
    session.stop()

    by_worker: Counter[int] = Counter()
    by_partition: Counter[int] = Counter()
    partition_workers: dict[int, Counter[int]] = {}
    stateful = stateful_stages(stages, args.shuffle_partitions)
    map_by_worker: Counter[int] = Counter()
    routing = routing_stages(stages)
    # Executor task-thread CPU (JVM; the Python workers' is not in it) of the stages
    # of the batches after the first (each kind's first stage is the first batch's).
    task_cpu = {
        kind: sum(s["executorCpuTime"] for s in sorted(found, key=lambda s: s["stageId"])[1:]) / 1e9
        for kind, found in (("routing", routing), ("stateful", stateful))
    }
    for stage in routing:
        for task in stage.get("tasks", {}).values():
            if task["status"] == "SUCCESS":
                records = task["taskMetrics"]["shuffleWriteMetrics"]["recordsWritten"]
                map_by_worker[where.get(task["executorId"], 0)] += records
    for stage in stateful:
        for task in stage.get("tasks", {}).values():
            if task["status"] != "SUCCESS":
                continue
            records = task["taskMetrics"]["shuffleReadMetrics"]["recordsRead"]
            worker = where.get(task["executorId"], 0)
            by_worker[worker] += records
            by_partition[task["index"]] += records
            partition_workers.setdefault(task["index"], Counter())[worker] += 1
    routed = sum(by_worker.values())
    expected, own = expected_rows(events, buckets)
    expected_by_partition: Counter[int] = Counter()
    keys_by_partition: Counter[int] = Counter()
    busy_keys_by_partition: Counter[int] = Counter()
    for b in range(buckets):
        p = partition_of[b]
        keys_by_partition[p] += 1
        expected_by_partition[p] += expected[b]
        busy_keys_by_partition[p] += own[b] > 0

    # Wait for this application's executors to exit (and be reaped by their worker)
    # before the next run's CPU window: a reaped child adds all its CPU time to its parent's.
    deadline = time.time() + 60
    while executors_alive(cluster) and time.time() < deadline:
        time.sleep(0.2)

    steady_rows = sum(b["numInputRows"] for b in steady)
    cpu = {role: cpu1[role] - cpu0[role] for role in cpu1}
    return {
        "buckets": buckets,
        "startup_s": startup_s,
        "rows": prog.rows(),
        "batches": batches,
        "steady_rows": steady_rows,
        "steady_batches": len(steady),
        "wall_s": batch_end(batches[-1]) - ts(batches[0]),
        "cpu": cpu,
        "cpu_lag": (cpu0_at - batch_end(first), cpu1_at - batch_end(steady[-1])),
        "by_worker": by_worker,
        "by_partition": by_partition,
        "partition_workers": partition_workers,
        "routed": routed,
        "expected_routed": sum(expected.values()),
        "expected_by_partition": expected_by_partition,
        "keys_by_partition": keys_by_partition,
        "busy_keys_by_partition": busy_keys_by_partition,
        "stateful_stages": len(stateful),
        "map_by_worker": map_by_worker,
        "task_cpu": task_cpu,
        "alerts": len(alerts),
        "executors": where,
    }


# ---- main ---------------------------------------------------------------------------------------------


def publish(broker: Any, topic: str, partitions: int, events: list[dict]) -> None:
    """Create ``topic`` and publish ``events`` to it, each keyed by its cluster."""
    from confluent_kafka import Producer

    broker.create_topics({topic: partitions})
    producer = Producer(
        {"bootstrap.servers": broker.bootstrap_servers, "linger.ms": 20, "compression.type": "lz4"}
    )
    for e in events:
        while True:
            try:
                producer.produce(topic, key=e["cluster"].encode(), value=orjson.dumps(e))
                break
            except BufferError:
                producer.poll(0.05)
    if producer.flush(120):
        raise RuntimeError("records left undelivered")


def executors_per_million(cpu: dict[str, float], rows: int) -> float:
    """The executors' CPU-seconds (JVMs and Python workers) per million events."""
    return sum(s for role, s in cpu.items() if role.startswith("executor")) * 1e6 / rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    p.add_argument("--events", type=int, default=150_000, help="simulated events (default %(default)s)")
    p.add_argument(
        "--buckets", type=int, action="append", help="bucket count, repeatable (default 1, 8 and 64)"
    )
    p.add_argument("--shuffle-partitions", type=int, default=2, help="state partitions (default %(default)s)")
    p.add_argument(
        "--max-events-per-trigger",
        type=int,
        help="events per micro-batch (default: --events / 6, rounded up: 6 batches)",
    )
    p.add_argument("--trigger-seconds", type=float, default=0.5, help="(default %(default)s)")
    p.add_argument(
        "--warmup-events",
        type=int,
        help="events of an unmeasured warm-up run before the measured ones (default: two batches; 0: none)",
    )
    p.add_argument("--topic-partitions", type=int, default=2, help="partitions of the event topic")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--timeout", type=float, default=1200.0, help="seconds one bucket count may take")
    p.add_argument("--keep-workdir", action="store_true", help="keep logs, checkpoints and stage JSON")
    args = p.parse_args(argv)
    bucket_counts = args.buckets or [1, 8, 64]
    args.max_events_per_trigger = args.max_events_per_trigger or -(-args.events // 6)
    if args.warmup_events is None:
        args.warmup_events = 2 * args.max_events_per_trigger

    from producers.simulator import SimConfig, Simulator
    from streaming.broker import EmbeddedBroker

    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
    workdir = Path(tempfile.mkdtemp(prefix="fencewatch-partitioning-"))
    t0 = time.time()
    log(f"work directory {workdir}")
    log(f"simulating {args.events:,} events ...")
    events = list(Simulator(SimConfig(seed=args.seed, fault_rate=0.0005)).events(args.events))
    n = len(events)
    clusters = {e["cluster"] for e in events}
    assert len(clusters) == 1, clusters
    results = []
    with (
        StandaloneCluster(workdir / "cluster", cores=1, memory="2g", workers=WORKERS) as cluster,
        EmbeddedBroker() as broker,
    ):
        log(f"standalone cluster {cluster.url}: master and {WORKERS} workers with 1 core each")
        topic = "partitioning-events"
        p0 = time.time()
        publish(broker, topic, args.topic_partitions, events)
        log(f"published {n:,} events keyed by cluster in {time.time() - p0:.1f} s")
        warmup = events[: args.warmup_events]
        if warmup:
            # The driver JVM is one for every run of this process: warm it, so the
            # first measured run does not pay for its JIT and class loading alone.
            log(f"warm-up: {bucket_counts[0]} bucket(s) over the first {len(warmup):,} events, not measured")
            publish(broker, "partitioning-warmup", args.topic_partitions, warmup)
            run_buckets(
                args, cluster, broker, workdir, "partitioning-warmup", warmup, bucket_counts[0], "warmup"
            )

        for buckets in bucket_counts:
            log(f"running {buckets} bucket(s) ...")
            results.append(run_buckets(args, cluster, broker, workdir, topic, events, buckets))
            r = results[-1]
            shares = ", ".join(
                f"worker {w} {c / max(1, r['routed']):.1%}" for w, c in sorted(r["by_worker"].items())
            )
            log(f"  stateful input by worker: {shares}")

    report(args, n, results, time.time() - t0)
    if args.keep_workdir:
        log(f"kept {workdir}")
    else:
        shutil.rmtree(workdir, ignore_errors=True)
    return 0


def report(args: argparse.Namespace, n: int, results: list[dict[str, Any]], total_s: float) -> None:
    base = next((r for r in results if r["buckets"] == 1), None)
    base_cpu = per_million(base["cpu"], base["steady_rows"]) if base else None
    base_exec = executors_per_million(base["cpu"], base["steady_rows"]) if base else None
    print()
    print(
        f"machine: {os.cpu_count()} CPUs; standalone master + {WORKERS} workers x 1 core (one 1-core "
        f"executor each); shuffle partitions {args.shuffle_partitions}; {n:,} events of one cluster in "
        f"a topic of {args.topic_partitions} partitions, keyed by cluster; at most "
        f"{args.max_events_per_trigger:,} events per batch; an unmeasured warm-up run over "
        f"{args.warmup_events:,} events first; total run {total_s:.0f} s"
    )
    print(
        f"NOTE: this machine has {os.cpu_count()} cores, shared by both workers' executors, the broker, "
        "the driver, the master and the workers: wall-clock speed-up from a second worker cannot be "
        "shown here, only how the work splits and what it costs in CPU."
    )
    print()
    rows: list[tuple[str, str]] = []
    for r in results:
        b = r["buckets"]
        label = f"{b} bucket{'s' if b > 1 else ''}:"
        total = max(1, r["routed"])
        shares = "  ".join(
            f"worker {w} {c / total:.1%} ({c:,} rows)" for w, c in sorted(r["by_worker"].items())
        )
        missing = [w for w in range(1, WORKERS + 1) if w not in r["by_worker"]]
        shares += "".join(f"  worker {w} 0.0% (no stateful task)" for w in missing)
        ok = all(0.35 <= r["by_worker"].get(w, 0) / total <= 0.65 for w in range(1, WORKERS + 1))
        verdict = ("within 35-65%" if ok else "NOT within 35-65%") if b > 1 else "contrast: one key"
        rows.append((f"{label} stateful input by executor", f"{shares}  [{verdict}]"))
        parts = []
        for p in sorted(set(r["by_partition"]) | set(r["keys_by_partition"])):
            on = ", ".join(f"w{w} x{k}" for w, k in sorted(r["partition_workers"].get(p, {}).items()))
            parts.append(
                f"p{p}: {r['keys_by_partition'][p]} keys ({r['busy_keys_by_partition'][p]} with records "
                f"of their own), {r['by_partition'][p]:,} rows (expected {r['expected_by_partition'][p]:,}), "
                f"tasks on {on}"
            )
        rows.append((f"{label} shuffle partitions", "; ".join(parts)))
        written = "  ".join(f"worker {w} {c:,}" for w, c in sorted(r["map_by_worker"].items()))
        written += " (Kafka read + routing, before the shuffle)"
        rows.append((f"{label} routing tasks' rows written", written))
        rows.append(
            (
                f"{label} routed rows / events",
                f"{r['routed']:,} / {r['rows']:,} = {r['routed'] / max(1, r['rows']):.3f} "
                f"(buckets_of expects {r['expected_routed']:,}; {r['stateful_stages']} stateful stages)",
            )
        )
        without, with_broker = per_million(r["cpu"], r["steady_rows"])
        ratio = ""
        if base_cpu:
            ratio = f"; vs 1 bucket {without / base_cpu[0]:.2f}x without, "
            ratio += f"{with_broker / base_cpu[1]:.2f}x with"
        rows.append(
            (
                f"{label} CPU-s per M events",
                f"{without:.1f} without the broker, {with_broker:.1f} with it{ratio} "
                f"({r['steady_rows']:,} rows in {r['steady_batches']} batches after the first)",
            )
        )
        executors = executors_per_million(r["cpu"], r["steady_rows"])
        rows.append(
            (
                f"{label} executors' CPU-s per M",
                f"{executors:.1f} (executor JVMs + their Python workers)"
                + (f"; vs 1 bucket {executors / base_exec:.2f}x" if base_exec else "")
                + f"; task-thread CPU in the executor JVMs (Spark's executorCpuTime) "
                f"routing stages {r['task_cpu']['routing']:.1f} s, stateful stages "
                f"{r['task_cpu']['stateful']:.1f} s",
            )
        )
        rows.append(
            (
                f"{label} CPU-s by role",
                ", ".join(f"{role} {s:.1f}" for role, s in r["cpu"].items() if s or role != "other")
                + f" (counters read {r['cpu_lag'][0]:.2f} s / {r['cpu_lag'][1]:.2f} s after the "
                "first / last batch ended)",
            )
        )
        times = [b["durationMs"]["triggerExecution"] / 1000 for b in r["batches"]]
        rows.append(
            (
                f"{label} batches",
                f"{len(r['batches'])} with input; batch s: {' '.join(f'{t:.1f}' for t in times)}; "
                f"median after the first {statistics.median(times[1:] or times):.1f}",
            )
        )
        rows.append(
            (
                f"{label} wall time",
                f"{r['wall_s']:.1f} s first batch start -> last batch end "
                f"({r['rows'] / r['wall_s']:,.0f} ev/s); session + executors start-up "
                f"{r['startup_s']:.1f} s (excluded); {r['alerts']} alerts",
            )
        )
    width = max(len(k) for k, _ in rows)
    for key, value in rows:
        print(f"{key:<{width}}  {value}")

    print()
    header = ("buckets", *(f"worker {w} share" for w in range(1, WORKERS + 1)), "routed/events")
    header += ("CPU-s/M ev", "vs 1 bucket", "+broker", "vs 1 bucket", "executors", "vs 1 bucket")
    header += ("batches", "median batch s", "wall s")
    table = [header]
    for r in results:
        total = max(1, r["routed"])
        without, with_broker = per_million(r["cpu"], r["steady_rows"])
        times = [b["durationMs"]["triggerExecution"] / 1000 for b in r["batches"]]
        table.append(
            (
                str(r["buckets"]),
                *(f"{r['by_worker'].get(w, 0) / total:.1%}" for w in range(1, WORKERS + 1)),
                f"{r['routed'] / max(1, r['rows']):.3f}",
                f"{without:.1f}",
                f"{without / base_cpu[0]:.2f}x" if base_cpu else "-",
                f"{with_broker:.1f}",
                f"{with_broker / base_cpu[1]:.2f}x" if base_cpu else "-",
                f"{executors_per_million(r['cpu'], r['steady_rows']):.1f}",
                f"{executors_per_million(r['cpu'], r['steady_rows']) / base_exec:.2f}x" if base_exec else "-",
                str(len(r["batches"])),
                f"{statistics.median(times[1:] or times):.1f}",
                f"{r['wall_s']:.1f}",
            )
        )
    widths = [max(len(row[i]) for row in table) for i in range(len(header))]
    for row in table:
        print("  ".join(cell.rjust(w) for cell, w in zip(row, widths, strict=True)))


if __name__ == "__main__":
    raise SystemExit(main())
