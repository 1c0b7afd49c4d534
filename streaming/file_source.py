"""Backfill: the streaming job's detector over envelope files, on Spark.

``fencewatch replay --engine spark FILE...`` runs the job's stateful part
(``streaming.job.detect``: routing to buckets, then ``DetectorProcessor``) over
envelope JSONL files read with Spark's file source (``format("text")``) under
an available-now trigger: the query reads every file named and stops. Alerts,
dead letters and the summary are replay's.

Order. The processor judges each bucket's rows in (partition, offset) order.
Here a row's partition is its file's place among the files named (0, 1, ...)
and its offset grows with its line number, so every bucket reads the files
one after the other, each in line order: their concatenation. For one file
that is exactly what replay reads. For several files it is what replay's
merge by ts_ms (detectors/merge.py) gives when they are consecutive pieces of
one stream named in order (cut anywhere between lines): the two orders then
differ only by records of different sources swapping within lateness, which
changes no verdict (docs/architecture.md, "Ordering and grace"). Files that
are not such pieces (one file per node or per log, pieces named out of order,
the same file twice) would be judged in another order than replay's;
:func:`check_in_order` refuses them before any detection: for every cluster,
no file may hold a record more than lateness before the newest ts_ms of the
files named before it. (Concatenated into one file, any input is judged
exactly as replay judges that file.)

Offsets and line numbers. Spark's text source yields the lines of each split
of a file (a byte range; Spark splits large files so that tasks read them in
parallel) in order, but not their numbers, and ``monotonically_increasing_id``
is not allowed in a stream. A ``mapInArrow`` step counts each split's lines
as they pass: a line's offset is ``2 * split start + its index in the split``,
which grows with the line number and never reaches the next split's first
offset (a split of n bytes holds at most n + 1 line starts). It applies
replay's own rules: ``bytes.strip()``, blank lines skipped (but counted), a
line over ``--max-record-bytes`` a ``too_large`` dead letter. How many lines
each split held, and the too_large lines, leave the stream as an observed
metric (the way kafka_source reports vanished offsets) and reach the driver
with the query's progress; the driver then turns every offset in a dead
letter or an alert's evidence into replay's ``file:line``. Lines keep their
bytes (the source is read with ``lineSep`` "\n" and never decoded), so
non-UTF-8 lines become the same ``malformed_json`` letters as in replay. A
line is read whole by Spark whatever its length: one over 2 GB fails the
query.

One micro-batch, flush at its end. The whole input is one micro-batch (no
``maxFilesPerTrigger``), and the processor's idle flush is set to -1 ms: the
timer a bucket arms after its rows has expired when Spark turns to the batch's
timers, later in the same batch, so every bucket judges what it still holds
once, at the end of its input, as replay does at the end of its files. (With
several batches each would end in such a flush, and the result would differ:
:func:`backfill` checks there was one.) The cost: the processor holds a
bucket's rows of the batch at once, so a Python worker needs memory of a few
times the input divided by ``--buckets`` (more for a cluster with fewer
partitions than buckets, whose higher buckets get only cluster-wide records).
The operator's rows (alerts, dead letters, detector snapshots) are written to
Parquet by the foreachBatch and read back on the driver after the query, so
the state partitions run in parallel and the driver holds the alerts only.

Where it runs. The checkpoint (the file source's log and the RocksDB state)
and the directory of links that names the files for the source, and the
operator's rows are in a temporary directory (``$TMPDIR``), deleted afterwards. On a multi-host Spark
cluster (``--master spark://...``) every executor reads the files and writes
state at the driver's paths, so the files and ``$TMPDIR`` must be on a file
system all hosts mount at the same place.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import threading
import time
from bisect import bisect_right
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from itertools import accumulate
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson
import pyarrow as pa

from detectors.cluster import Counters
from detectors.config import DetectorConfig
from detectors.envelope import KINDS, MAX_TS_MS, DeadLetterClass, dumps
from detectors.lines import DEFAULT_MAX_RECORD_BYTES, EXCERPT_BYTES, LongLine, over_limit
from detectors.render import plural
from streaming.bucket_layout import DEFAULT_BUCKETS, check_buckets
from streaming.query_start import start_query
from streaming.schema import ALERT, DEAD_LETTER, STATS

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming import DataStreamWriter, StreamingQuery

# The ``topic`` of every row: positions read "fencewatch-files/<file index>@<offset>".
FILE_TOPIC = "fencewatch-files"
QUERY_NAME = "fencewatch-backfill"
# The observed metric: lines per split, and the too_large lines.
LINES_METRIC = "fencewatch_backfill_lines"
# The processor arms its idle timer this long after a batch: already expired
# when the same batch's timers are handled, so each bucket flushes at the end.
FLUSH_AT_END_MS = -1
# What the numbering step yields: a line (value set), a too_large line (head set,
# size when replay would know it), or a split's line count (split_lines set).
_NUMBERED_ARROW = pa.schema(
    [
        ("partition", pa.int32()),
        ("offset", pa.int64()),
        ("value", pa.binary()),
        ("head", pa.binary()),
        ("size", pa.int64()),
        ("split_lines", pa.int64()),
    ]
)
_NUMBERED_SCHEMA = "partition int, offset long, value binary, head binary, size long, split_lines long"


class FilesOutOfOrder(ValueError):
    """Several files that are not consecutive pieces of one stream named in order."""


class BackfillFailed(RuntimeError):
    """The query failed, or ran otherwise than the backfill assumes."""


@dataclass(frozen=True)
class BackfillOptions:
    files: Sequence[str]  # as named; positions and messages use these names
    buckets: int = DEFAULT_BUCKETS
    detector: DetectorConfig = field(default_factory=DetectorConfig)
    max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES
    # Spark tasks that share the buckets; None: the session's default parallelism.
    shuffle_partitions: int | None = None
    progress_seconds: float | None = 10.0  # None: no progress lines
    check_order: bool = True  # refuse several files that are not pieces in order
    split_bytes: int | None = None  # bytes per read task; None: Spark's (spark.sql.files.*)


@dataclass
class BackfillResult:
    alerts: list[str]  # SPEC 3 alert JSON, ordered by (ts_ms, alert id)
    dead_letters: int
    counters: Counters
    lines: int  # lines read, blank ones included
    batches: int
    seconds: float


# ---- reading: files -> the event columns of kafka_source.read_events -----------------------------


def stage_files(files: Sequence[str], directory: Path) -> str:
    """Link every file into ``directory`` under its index (00000000, ...): the
    source reads that directory, and a row's file name gives its index. The
    names carry no extension, so Spark decompresses nothing (replay does not)."""
    directory.mkdir()
    for index, name in enumerate(files):
        os.symlink(os.path.abspath(name), directory / f"{index:08d}")
    return directory.resolve().as_uri()


def _numberer(limit: int) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """The mapInArrow function: a task's lines (whole splits, each in order)
    in; numbered lines, too_large lines and each split's line count out."""

    def number(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        split: tuple[str, int] | None = None  # (file name, split start) being read
        index = base = count = 0
        for batch in batches:
            files = batch.column("file").to_pylist()
            starts = batch.column("split_start").to_pylist()
            raws = batch.column("value").to_pylist()
            out: tuple[list[Any], ...] = ([], [], [], [], [], [])
            for file, start, raw in zip(files, starts, raws, strict=True):
                if (file, start) != split:
                    if count:
                        _add(out, index, base, None, None, None, count)
                    split, index, base, count = (file, start), int(file), 2 * start, 0
                offset = base + count
                count += 1
                long = _too_large(raw, limit)
                if long is not None:
                    _add(out, index, offset, None, long.head, long.size, None)
                    continue
                value = raw.strip()
                if value:
                    _add(out, index, offset, value, None, None, None)
            yield _batch(out)
        if count:
            out = ([], [], [], [], [], [])
            _add(out, index, base, None, None, None, count)
            yield _batch(out)

    return number


def _add(out: tuple[list[Any], ...], *row: Any) -> None:
    for column, value in zip(out, row, strict=True):
        column.append(value)


def _batch(out: tuple[list[Any], ...]) -> pa.RecordBatch:
    return pa.RecordBatch.from_arrays(
        [pa.array(column, field.type) for column, field in zip(out, _NUMBERED_ARROW, strict=True)],
        schema=_NUMBERED_ARROW,
    )


def _too_large(raw: bytes, limit: int) -> LongLine | None:
    """What replay's reader (detectors.lines.read_lines) makes of a line that
    had ``raw`` before its newline: it reads ``limit + 2`` bytes at most, so it
    knows the size only of a line one byte over the limit."""
    if len(raw) + 1 <= limit + 2:
        return over_limit(raw + b"\n", limit)
    return LongLine(raw[:EXCERPT_BYTES], limit)


def read_files(spark: SparkSession, stage_uri: str, max_record_bytes: int) -> DataFrame:
    """A streaming DataFrame of kafka_source's event columns from the staged
    files: topic FILE_TOPIC, partition the file index, offset as the module
    docstring says. Split line counts and too-large lines are reported in the
    LINES_METRIC observed metric instead. Run the query under
    :func:`query_settings`."""
    from pyspark.sql import functions as F

    lines = spark.readStream.format("text").option("lineSep", "\n").load(stage_uri)
    numbered = lines.select(
        F.col("_metadata.file_name").alias("file"),
        F.col("_metadata.file_block_start").alias("split_start"),
        F.col("value").cast("binary").alias("value"),
    ).mapInArrow(_numberer(max_record_bytes), _NUMBERED_SCHEMA)
    split_lines, head = F.col("split_lines"), F.col("head")
    reported = numbered.observe(
        LINES_METRIC,
        F.collect_list(F.when(split_lines.isNotNull(), F.struct("partition", "offset", "split_lines"))).alias(
            "splits"
        ),
        # Hex: the progress that carries the metric to the driver is JSON.
        F.collect_list(
            F.when(head.isNotNull(), F.struct("partition", "offset", "size", F.hex(head).alias("head")))
        ).alias("too_large"),
    )
    return reported.where(F.col("value").isNotNull()).select(
        F.lit(None).cast("string").alias("key"),
        "value",
        F.lit(FILE_TOPIC).alias("topic"),
        "partition",
        "offset",
        F.lit(None).cast("long").alias("timestamp"),
    )


def query_settings(shuffle_partitions: int, split_bytes: int | None = None) -> dict[str, str]:
    """The session settings the backfill query runs under."""
    from streaming.job import FILE_SYSTEM_CHECKPOINTS, STATE_STORE_SETTINGS

    settings = {
        # As the job runs on a local checkpoint (streaming/job.py); ours is in $TMPDIR.
        **STATE_STORE_SETTINGS,
        "spark.sql.streaming.checkpointFileManagerClass": FILE_SYSTEM_CHECKPOINTS,
        # One data batch and no other: a no-data batch would only cost.
        "spark.sql.streaming.noDataMicroBatches.enabled": "false",
        "spark.sql.shuffle.partitions": str(shuffle_partitions),
    }
    if split_bytes is not None:
        settings["spark.sql.files.maxPartitionBytes"] = str(split_bytes)
    return settings


@contextmanager
def session_settings(spark: SparkSession, settings: dict[str, str]) -> Iterator[None]:
    """``settings`` in the session while inside; the previous values after.
    A query reads them when it plans a batch, in its own thread, after its
    start() has returned: hold them until it ends."""
    saved = {key: spark.conf.get(key, None) for key in settings}
    try:
        for key, value in settings.items():
            spark.conf.set(key, value)
        yield
    finally:
        for key, old in saved.items():
            if old is None:
                spark.conf.unset(key)
            else:
                spark.conf.set(key, old)


# ---- the order check ----------------------------------------------------------------------------


def check_in_order(spark: SparkSession, stage_uri: str, names: Sequence[str], lateness_ms: int) -> None:
    """Raise FilesOutOfOrder unless, for every cluster, each file's earliest
    ts_ms is at most ``lateness_ms`` before the newest ts_ms of the files named
    before it (a Spark batch job over the files: cluster and ts_ms of each line
    that looks like an envelope)."""
    from pyspark.sql import functions as F

    lines = spark.read.format("text").option("lineSep", "\n").load(stage_uri)
    fields = F.from_json(F.col("value"), "cluster string, ts_ms long, kind string")
    ranges = (
        lines.select(F.col("_metadata.file_name").alias("file"), fields.alias("envelope"))
        .select("file", "envelope.*")
        # Roughly the envelopes replay would merge: a line it dead-letters has no time there.
        .where((F.length("cluster") > 0) & F.col("kind").isin(*KINDS) & F.col("ts_ms").between(0, MAX_TS_MS))
        .groupBy("cluster", "file")
        .agg(F.min("ts_ms").alias("first"), F.max("ts_ms").alias("last"))
        .collect()
    )
    by_cluster: dict[str, list[tuple[int, int, int]]] = {}
    for row in ranges:
        by_cluster.setdefault(row.cluster, []).append((int(row.file), row.first, row.last))
    for cluster, files in sorted(by_cluster.items()):
        newest: tuple[int, int] | None = None  # (ts_ms, file index) of the newest record so far
        for index, first, last in sorted(files):
            if newest is not None and first < newest[0] - lateness_ms:
                raise FilesOutOfOrder(
                    f"{names[index]} has a record of cluster {cluster!r} at ts_ms {first}, "
                    f"{newest[0] - first} ms before {names[newest[1]]}, named earlier, ends "
                    f"({newest[0]}; lateness {lateness_ms} ms): the Spark engine reads files one after "
                    "another, so it takes only consecutive pieces of one stream named in time order"
                )
            if newest is None or last > newest[0]:
                newest = (last, index)


# ---- output: the operator's rows, with replay's positions ----------------------------------------


class LineIndex:
    """Offsets (``FILE_TOPIC/<file index>@<offset>``) to replay's ``<file>:<line>``,
    from how many lines each split of each file held."""

    def __init__(self, names: Sequence[str], splits: Iterable[tuple[int, int, int]]):
        """``splits``: (file index, first offset, lines) of every split that held a line."""
        self.names = names
        by_file: dict[int, list[tuple[int, int]]] = {}
        for index, first, lines in splits:
            by_file.setdefault(index, []).append((first, lines))
        # Per file: the splits' first offsets, ascending, and the lines before each.
        self._firsts: dict[int, list[int]] = {}
        self._before: dict[int, list[int]] = {}
        for index, found in by_file.items():
            found.sort()
            self._firsts[index] = [first for first, _ in found]
            self._before[index] = list(accumulate((lines for _, lines in found[:-1]), initial=0))

    def line(self, index: int, offset: int) -> int:
        firsts = self._firsts[index]
        at = bisect_right(firsts, offset) - 1
        return self._before[index][at] + offset - firsts[at] + 1

    def position(self, position: str) -> str:
        """``position`` as replay names it; anything else as it is."""
        topic, _, rest = position.rpartition("/")
        index, at, offset = rest.partition("@")
        if topic != FILE_TOPIC or not at or not index.isdigit() or not offset.isdigit():
            return position
        if int(index) not in self._firsts:
            return position
        return f"{self.names[int(index)]}:{self.line(int(index), int(offset))}"


class Collector:
    """The foreachBatch function: the batch's rows (alerts, dead letters and
    detector snapshots) written to Parquet under ``directory``; :meth:`read`
    reads them back once the line index is known."""

    def __init__(self, spark: SparkSession, directory: str):
        self.spark = spark
        self.directory = directory
        self.batches: list[str] = []

    def __call__(self, batch: DataFrame, batch_id: int) -> None:
        path = f"{self.directory}/batch-{batch_id}"
        batch.write.mode("overwrite").parquet(path)  # a re-run batch replaces its rows
        if path not in self.batches:
            self.batches.append(path)

    def read(self) -> Iterator[Any]:
        for path in self.batches:
            yield from self.spark.read.parquet(path).toLocalIterator()


@dataclass
class _Output:
    """What the driver makes of the operator's rows."""

    index: LineIndex
    on_dead_letter: Callable[[str], None]
    alerts: list[tuple[int, str, str]] = field(default_factory=list)  # (ts_ms, id, payload)
    dead_letters: int = 0
    snapshots: dict[tuple[str, int], dict[str, Any]] = field(default_factory=dict)

    def row(self, row: Any) -> None:
        if row.record_type == ALERT:
            self.alerts.append((row.ts_ms, row.id, self.alert(row.payload)))
        elif row.record_type == DEAD_LETTER:
            self.dead_letter(orjson.loads(row.payload))
        elif row.record_type == STATS:
            snap = orjson.loads(row.payload)
            key = (snap["cluster"], snap["bucket"])
            kept = self.snapshots.get(key)
            if kept is None or snap["state_version"] >= kept["state_version"]:
                self.snapshots[key] = snap

    def alert(self, payload: str) -> str:
        """The alert JSON with its evidence's positions named as replay names them."""
        record = orjson.loads(payload)
        for evidence in record.get("evidence") or []:
            if isinstance(evidence.get("position"), str):
                evidence["position"] = self.index.position(evidence["position"])
        return dumps(record)

    def dead_letter(self, record: dict[str, Any]) -> None:
        """One letter, as replay prints it."""
        self.dead_letters += 1
        letter = {"position": self.index.position(record["position"]), "reason": record["reason"]}
        self.on_dead_letter(dumps({**letter, "raw": record["raw"]}))

    def counters(self, too_large: int) -> Counters:
        """The buckets' counters summed, as one replay detector counts them."""
        total = Counters()
        for snap in self.snapshots.values():
            for name in ("events", "unverified", "dead_letters"):
                table = getattr(total, name)
                for key, n in snap[name].items():
                    table[key] = table.get(key, 0) + n
            for rule, severity, status, n in snap["alerts"]:
                total.alerts[(rule, severity, status)] = total.alerts.get((rule, severity, status), 0) + n
            for rule, severity, status, n in snap.get("possible_alerts", ()):
                key = (rule, severity, status)
                total.possible[key] = total.possible.get(key, 0) + n
            total.late += snap["late"]
            total.duplicates += snap["duplicates"]
        if too_large:
            kind = DeadLetterClass.TOO_LARGE.value
            total.dead_letters[kind] = total.dead_letters.get(kind, 0) + too_large
        return total


# ---- the query ------------------------------------------------------------------------------------


def backfill(
    spark: SparkSession,
    options: BackfillOptions,
    on_dead_letter: Callable[[str], None],
    progress: Callable[[str], None] | None = None,
) -> BackfillResult:
    """Run the detector over ``options.files`` and wait for it. Dead letters go
    to ``on_dead_letter`` (replay's JSON) once the query has ended; alerts are
    returned. Raises FilesOutOfOrder (several files that are not pieces of one
    stream in order; nothing detected) or BackfillFailed."""
    from streaming.job import detect

    check_buckets(options.buckets)
    if not options.files:
        raise ValueError("no files to read")
    started = time.monotonic()
    work = Path(tempfile.mkdtemp(prefix="fencewatch-backfill-"))
    try:
        stage_uri = stage_files(options.files, work / "files")
        checkpoint = (work / "checkpoint").as_uri()
        if options.check_order and len(options.files) > 1:
            if progress:
                progress(f"checking that the {len(options.files)} files are pieces of one stream in order")
            check_in_order(spark, stage_uri, options.files, options.detector.lateness_ms)
        partitions = options.shuffle_partitions or spark.sparkContext.defaultParallelism
        if progress:
            size = sum(os.path.getsize(name) for name in options.files)
            progress(
                f"reading {plural(len(options.files), 'file')} ({size / 1e6:.1f} MB) on "
                f"{spark.sparkContext.master}: "
                f"{options.buckets} buckets per cluster, {partitions} state partitions"
            )
        events = read_files(spark, stage_uri, options.max_record_bytes)
        detected = detect(events, options.detector, checkpoint, FLUSH_AT_END_MS, options.buckets)
        collector = Collector(spark, (work / "output").as_uri())
        with session_settings(spark, query_settings(partitions, options.split_bytes)):
            writer = (
                detected.writeStream.foreachBatch(collector)
                .option("checkpointLocation", checkpoint)
                .trigger(availableNow=True)
                .queryName(f"{QUERY_NAME}-{work.name}")
            )
            query = _run(spark, writer, started, progress, options.progress_seconds)
        error = query.exception()
        if error is not None:
            # Without the plan and offsets Spark appends.
            message = str(error).split("=== Streaming Query ===")[0].strip()
            raise BackfillFailed(f"the Spark query failed: {message}")
        return _result(query, collector, options, on_dead_letter, started, progress)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _run(
    spark: SparkSession,
    writer: DataStreamWriter,
    started: float,
    progress: Callable[[str], None] | None,
    every_s: float | None,
) -> StreamingQuery:
    """Start the query (streaming.query_start) and wait for it to end; every
    ``every_s`` seconds, a line on its tasks, from before its start."""
    if progress is None or every_s is None:
        query = start_query(writer)
        query.awaitTermination()
        return query
    stop = threading.Event()
    tracker = spark.sparkContext.statusTracker()
    running: list[StreamingQuery] = []

    def report() -> None:
        while not stop.wait(every_s):
            stages = [tracker.getStageInfo(s) for s in sorted(tracker.getActiveStageIds())]
            tasks = ", ".join(
                f"stage {s.stageId} {s.numCompletedTasks}/{s.numTasks} tasks" for s in stages if s is not None
            )
            query = running[0] if running else None
            done = len([p for p in query.recentProgress if p.numInputRows]) if query else 0
            status = query.status["message"].lower() if query else "starting the query"
            progress(f"{time.monotonic() - started:.0f}s: {plural(done, 'batch')} done; {tasks or status}")

    reporter = threading.Thread(target=report, name="backfill-progress", daemon=True)
    reporter.start()
    try:
        running.append(start_query(writer))
        running[0].awaitTermination()
        return running[0]
    except BaseException:
        if running:
            running[0].stop()
        raise
    finally:
        stop.set()
        reporter.join()


def _result(
    query: StreamingQuery,
    collector: Collector,
    options: BackfillOptions,
    on_dead_letter: Callable[[str], None],
    started: float,
    progress: Callable[[str], None] | None,
) -> BackfillResult:
    batches = [p for p in query.recentProgress if p.numInputRows]
    if len(batches) > 1:
        raise BackfillFailed(
            f"Spark read the files in {len(batches)} micro-batches, not one: each ends in a flush, so "
            "the alerts could differ from replay's"
        )
    splits: list[tuple[int, int, int]] = []
    too_large: list[Any] = []
    for p in batches:
        metric = p.observedMetrics.get(LINES_METRIC)
        if metric is not None:
            # Rows, or dicts where the progress came back as JSON.
            splits.extend((s["partition"], s["offset"], s["split_lines"]) for s in metric["splits"])
            too_large.extend(metric["too_large"])
    index = LineIndex(options.files, splits)
    output = _Output(index, on_dead_letter)
    for row in collector.read():
        output.row(row)
    for long in sorted(too_large, key=lambda t: (t["partition"], t["offset"])):
        line = index.line(long["partition"], long["offset"])
        letter = LongLine(bytes.fromhex(long["head"]), options.max_record_bytes, long["size"]).dead_letter(
            f"{options.files[long['partition']]}:{line}", f"line {line}"
        )
        output.dead_letter(letter.to_dict())
    lines = sum(n for _, _, n in splits)
    seconds = time.monotonic() - started
    if progress:
        progress(
            f"{seconds:.0f}s: {plural(len(batches), 'batch')} done: {plural(lines, 'line')}, "
            f"{plural(len(output.alerts), 'alert')}, {plural(output.dead_letters, 'dead letter')}"
        )
    return BackfillResult(
        alerts=[payload for _, _, payload in sorted(output.alerts)],
        dead_letters=output.dead_letters,
        counters=output.counters(len(too_large)),
        lines=lines,
        batches=len(batches),
        seconds=seconds,
    )
