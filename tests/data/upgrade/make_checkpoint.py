"""Write ``checkpoint-<release>/`` and ``checkpoint-<release>.json`` beside this
file: a streaming-job checkpoint of an earlier release for
``tests/integration/test_upgrade_checkpoint.py``, which restores each of them.

When the state format (streaming/snapshot_format.py) is raised, run it on the
release before the change, with that release's tree first on the path and this
project's venv, and add the release to the test's ``RELEASES``::

    git worktree add /tmp/old-de81004 de81004
    PYTHONPATH=/tmp/old-de81004 .venv/bin/python tests/data/upgrade/make_checkpoint.py --release de81004
    git worktree remove --force /tmp/old-de81004

The checkpoints here:

- 67519df (the default ``--release``): state keyed by cluster, before buckets;
  state format 0 (bare pickles), pending judgments inside the detector.
- de81004: state keyed by (cluster, bucket), 8 buckets (``--buckets``, for
  releases that have them; default the release's own); state format 2, pending
  judgments in their own ``pending`` MapState.
- 14666cb: 8 buckets; state format 3, partition histories in groups, remote
  segments in the detector value.
- e380fe1: 8 buckets; state format 5, remote segments in their own MapState,
  partition histories pickled as objects.

It starts an embedded broker, publishes the first part of a small simulated
history of two clusters (records keyed by cluster), runs ``streaming.job.start``
until Spark has committed the batch that read the last of them, stops the
query and copies its checkpoint here. The JSON says what the test needs to
line offsets up on a fresh broker and what to expect, and what the release
wrote (``buckets``: null before buckets; ``state_format``).

The test imports this file for :func:`history`, :func:`split_facts` and
:func:`committed_source_offsets`, so the history it regenerates is the one
published here; nothing runs on import, and those use only APIs every
release has (the simulator, the detector, Spark's checkpoint files). What
differs between releases' job APIs (``JobOptions.buckets``) is looked up at run
time.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import heapq
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

DEFAULT_RELEASE = "67519df"
HERE = Path(__file__).resolve().parent
# Written by a release that keeps the bucket count in its checkpoint (streaming/bucket_layout.py).
LAYOUT_FILE = "fencewatch-layout.json"

# A fixed name: the checkpoint's offset log names the topic it read, and the
# test recreates a topic of this name.
SOURCE_TOPIC = "fencewatch-upgrade-events"
SOURCE_PARTITIONS = 3
# Informational only: the test publishes to topics of its own.
ALERTS_TOPIC = "fencewatch-upgrade-alerts"
DEAD_LETTER_TOPIC = "fencewatch-upgrade-dead-letters"

# Two clusters, so the state store holds two keys: "sim-1" and "sim-5" go to
# different shuffle partitions (Spark's hash of the key, two partitions) and,
# keyed by cluster, to source partitions 0 and 2 of three (librdkafka's CRC32
# partitioner); partition 1 stays empty. 50 events per simulated second make
# each cluster's 1,000 events span about 20 s of event time, several grace
# windows (grace 2 s + lateness 1 s): judgments fall due inside each half.
HISTORY: dict[str, Any] = {
    "clusters": [{"cluster": "sim-1", "seed": 3}, {"cluster": "sim-5", "seed": 4}],
    "events_per_cluster": 1_000,
    "fault_rate": 0.01,
    "warmup_ms": 2_000,
    "events_per_second": 50,
}

MAX_EVENTS_PER_TRIGGER = 500  # the first part is read in three micro-batches
TRIGGER_SECONDS = 0.5
# An hour: no idle flush runs before the query is stopped, so the checkpoint
# keeps the judgments pending at the split (and their processing-time timer)
# for the new release to restore. The split is chosen so that an idle flush
# there would have changed nothing (see choose_split).
IDLE_FLUSH_MS = 3_600_000
WAIT_SECONDS = 300.0


# ---- the history (shared with the test) ----------------------------------------------------------


def history(spec: Mapping[str, Any]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The events of every cluster in ``spec`` (HISTORY's shape), interleaved by
    ``ts_ms``, and the ground truth. Each cluster's own order is kept (heapq.merge
    only ever takes the head of an input), which is all the detector needs."""
    from producers.simulator import SimConfig, Simulator

    per_cluster, truth = [], []
    for cluster in spec["clusters"]:
        sim = Simulator(
            SimConfig(
                cluster=cluster["cluster"],
                seed=cluster["seed"],
                fault_rate=spec["fault_rate"],
                warmup_ms=spec["warmup_ms"],
                events_per_second=spec["events_per_second"],
                # Checkpoints made before NoOps, the clock slack, requests stamped at
                # their completion and LeaderChange records were simulated have none of them.
                noop_interval_ms=spec.get("noop_interval_ms", 0),
                clock_slack_ms=spec.get("clock_slack_ms", 0),
                stamp_requests_at_completion=spec.get("stamp_requests_at_completion", False),
                leader_change_records=spec.get("leader_change_records", False),
            )
        )
        per_cluster.append(list(sim.events(spec["events_per_cluster"])))
        truth.extend(sim.truth)
    return list(heapq.merge(*per_cluster, key=lambda e: e["ts_ms"])), truth


def records(events: Sequence[dict[str, Any]]) -> list[tuple[bytes, bytes]]:
    """Kafka records as the tests publish them: keyed by cluster, the envelope as JSON."""
    import orjson

    return [(e["cluster"].encode(), orjson.dumps(e)) for e in events]


def digest(recs: Sequence[tuple[bytes, bytes]]) -> str:
    h = hashlib.sha256()
    for key, value in recs:
        h.update(len(key).to_bytes(4, "big") + key + len(value).to_bytes(8, "big") + value)
    return h.hexdigest()


class Replay:
    """``fencewatch replay``'s loop (test_job.replay_alerts) over a slice of the
    history, with an explicit flush: alert ids in the order raised, dead letters."""

    def __init__(self) -> None:
        from detectors.engine import Detector

        self.detector = Detector()
        self.ids: list[str] = []
        self.letters: list[Any] = []

    def feed(self, events: Sequence[dict[str, Any]], start: int = 0, stop: int | None = None) -> Replay:
        from detectors.envelope import envelope_from_obj

        for i in range(start, len(events) if stop is None else stop):
            self.letters.extend(self.detector.ingest(envelope_from_obj(events[i], f"mem:{i}", i)))
            self.ids.extend(a.alert_id for a in self.detector.drain())
        return self

    def flush(self) -> Replay:
        self.letters.extend(self.detector.flush())
        self.ids.extend(a.alert_id for a in self.detector.drain())
        return self


def split_facts(events: Sequence[dict[str, Any]], split: int) -> dict[str, Any]:
    """What a split at ``split`` gives, and whether it is robust.

    The old job stops with the judgments that wait for their grace window at
    the split either still pending (no idle flush ran) or judged early by an
    idle flush (``Detector.flush``), depending on timing. A split is *robust*
    when both are the same thing: flushing there raises no alert (so the old
    job emitted exactly replay's alerts of the first part, whether or not it
    flushed), and a flush there changes no alert raised later (so the new job
    raises replay's alerts of the whole minus those, either way)."""
    whole = Replay().feed(events).flush()
    first = Replay().feed(events, 0, split)
    before_flush = list(first.ids)
    pending = first.detector.pending_count()
    first.flush()
    flushed_then_rest = Replay().feed(events, 0, split).flush().feed(events, split).flush()
    rest_alone = Replay().feed(events[split:]).flush()
    after = [i for i in whole.ids if i not in set(first.ids)]
    return {
        "whole": whole.ids,
        "first": first.ids,
        "after": after,
        "needs_first_part_state": [i for i in after if i not in set(rest_alone.ids)],
        "pending_at_split": pending,
        "flush_at_split_raises_nothing": before_flush == first.ids,
        "flush_at_split_changes_nothing_later": sorted(flushed_then_rest.ids) == sorted(whole.ids),
        "dead_letters": len(whole.letters) + len(first.letters) + len(flushed_then_rest.letters),
    }


def robust(facts: Mapping[str, Any]) -> bool:
    return bool(
        facts["flush_at_split_raises_nothing"]
        and facts["flush_at_split_changes_nothing_later"]
        and facts["dead_letters"] == 0
        and facts["first"]  # a re-processed first part would show as repeated alerts
        and facts["after"]  # there is something to detect after the restart
        and facts["needs_first_part_state"]  # ...that only the restored state can detect
    )


def choose_split(events: Sequence[dict[str, Any]]) -> tuple[int, dict[str, Any]]:
    """The robust split nearest the middle (searched outwards in steps of 5)."""
    middle = len(events) // 2
    for distance in range(0, middle * 2 // 5, 5):
        for split in (middle - distance, middle + distance):
            facts = split_facts(events, split)
            if robust(facts):
                return split, facts
    raise SystemExit("no robust split within 40% of the middle: change HISTORY")


# ---- writing the checkpoint ----------------------------------------------------------------------


def committed_source_offsets(checkpoint: Path) -> tuple[int, dict[str, int]] | None:
    """The newest committed batch id and the source offset it read to (Spark's
    offset log: a version line, the batch metadata, then one line per source)."""
    commits = checkpoint / "commits"
    if not commits.is_dir():
        return None
    done = sorted(int(p.name) for p in commits.iterdir() if p.name.isdigit())
    if not done:
        return None
    lines = (checkpoint / "offsets" / str(done[-1])).read_text().splitlines()
    return done[-1], json.loads(lines[2])


def release_of(root: Path) -> str:
    try:
        out = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "--short=7", "HEAD"],
            capture_output=True,
            text=True,
            check=True,
        )
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return out.stdout.strip()


def spark_session(root: Path, warehouse: Path):
    """As tests/integration/conftest.py's ``spark`` fixture: local[2], two shuffle partitions."""
    from pyspark.sql import SparkSession

    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")]))
    session = (
        SparkSession.builder.master("local[2]")
        .appName("fencewatch-upgrade-checkpoint")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.warehouse.dir", str(warehouse))
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    return session


def checkpoint_dir(release: str) -> Path:
    return HERE / f"checkpoint-{release}"


def facts_file(release: str) -> Path:
    return HERE / f"checkpoint-{release}.json"


def state_format() -> int:
    """The state format the imported release writes: its
    ``streaming.snapshot_format.FORMAT``, or 0 (bare pickles) for a release
    before that module."""
    if importlib.util.find_spec("streaming.snapshot_format") is None:
        return 0
    from streaming import snapshot_format

    return int(snapshot_format.FORMAT)


def layout_buckets(checkpoint: Path) -> int | None:
    """The bucket count the checkpoint records, or None (written before buckets)."""
    layout = checkpoint / LAYOUT_FILE
    return int(json.loads(layout.read_text())["buckets"]) if layout.exists() else None


def files_naming(directory: Path, needle: str) -> list[str]:
    return sorted(
        str(p.relative_to(directory))
        for p in directory.rglob("*")
        if p.is_file() and needle.encode() in p.read_bytes()
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--release",
        default=DEFAULT_RELEASE,
        help=f"the release (short commit) of the tree on PYTHONPATH; names what is written "
        f"(default {DEFAULT_RELEASE})",
    )
    parser.add_argument("--allow-other-release", action="store_true", help="run on a tree not at --release")
    parser.add_argument(
        "--buckets", type=int, help="buckets per cluster, for a release that has them (default: its default)"
    )
    args = parser.parse_args()

    import streaming

    root = Path(streaming.__file__).resolve().parents[1]
    release = release_of(root)
    if release != args.release and not args.allow_other_release:
        raise SystemExit(
            f"streaming is imported from {root} at {release}, not {args.release}: set PYTHONPATH"
        )
    checkpoint_out, facts_out = checkpoint_dir(args.release), facts_file(args.release)
    sys.path.insert(0, str(root / "tests" / "integration"))
    # Spark starts its Python workers with `python -m`, which puts the working
    # directory first on their path: run from the release's tree, or a checkout
    # we are run from would shadow it.
    os.chdir(root)

    import pyspark
    from test_job import publish, read_topic

    from streaming.broker import EmbeddedBroker
    from streaming.job import JobOptions, start
    from streaming.sinks import TopicSink

    # Options only some releases' JobOptions have.
    extra: dict[str, Any] = {}
    if "buckets" in {f.name for f in dataclasses.fields(JobOptions)}:
        from streaming.bucket_layout import DEFAULT_BUCKETS

        extra["buckets"] = args.buckets or DEFAULT_BUCKETS
    elif args.buckets is not None:
        raise SystemExit(f"the release at {root} predates buckets: drop --buckets")
    written_format = state_format()

    events, truth = history(HISTORY)
    split, facts = choose_split(events)
    recs = records(events)
    split_ts_ms = max(e["ts_ms"] for e in events[:split])
    assert any(t["ts_ms"] > split_ts_ms for t in truth), "no violation injected after the split"
    print(
        f"{len(events)} events, split at {split}: {len(facts['first'])} alerts before, "
        f"{len(facts['after'])} after ({len(facts['needs_first_part_state'])} need the first part's "
        f"state), {facts['pending_at_split']} judgments pending at the split"
    )
    # The new release must restore judgments still waiting for their grace window.
    assert facts["pending_at_split"] > 0, "no judgment pending at the split: change HISTORY"

    work = Path(tempfile.mkdtemp(prefix="fencewatch-upgrade-"))
    checkpoint = work / "ck"
    started = time.monotonic()
    with EmbeddedBroker() as broker:
        broker.create_topics({SOURCE_TOPIC: SOURCE_PARTITIONS, ALERTS_TOPIC: 1, DEAD_LETTER_TOPIC: 1})
        publish(broker, SOURCE_TOPIC, recs[:split])
        probe = TopicSink(broker.bootstrap_servers, SOURCE_TOPIC, {})
        ends = {str(p): end for p, end in sorted(probe.end_offsets().items())}
        probe.close()
        assert sum(ends.values()) == split, ends

        spark = spark_session(root, work / "warehouse")
        options = JobOptions(
            bootstrap_servers=broker.bootstrap_servers,
            topic=SOURCE_TOPIC,
            checkpoint=str(checkpoint),
            alerts_topic=ALERTS_TOPIC,
            dead_letter_topic=DEAD_LETTER_TOPIC,
            max_events_per_trigger=MAX_EVENTS_PER_TRIGGER,
            trigger_seconds=TRIGGER_SECONDS,
            idle_flush_ms=IDLE_FLUSH_MS,
            **extra,
        )
        query = start(spark, options, console=None)
        try:
            deadline = time.monotonic() + WAIT_SECONDS
            while True:
                if query.exception() is not None:
                    raise SystemExit(f"the query failed: {query.exception()}")
                committed = committed_source_offsets(checkpoint)
                if committed is not None and committed[1] == ends:
                    break
                if time.monotonic() > deadline:
                    raise SystemExit(f"timed out: committed {committed}, want {ends}")
                query.awaitTermination(0.5)
        finally:
            query.stop()
        if query.exception() is not None:
            raise SystemExit(f"the query failed: {query.exception()}")
        final = committed_source_offsets(checkpoint)
        assert final is not None
        last_batch, consumed = final
        emitted = [h["fencewatch-id"] for h, _ in read_topic(broker, ALERTS_TOPIC)]
        letters = read_topic(broker, DEAD_LETTER_TOPIC)
        spark.stop()
    elapsed = time.monotonic() - started

    assert sorted(emitted) == sorted(facts["first"]), (emitted, facts["first"])
    assert letters == [], letters
    assert "idle_ticks" not in consumed, f"an idle flush ran before the stop: {consumed}"
    buckets = layout_buckets(checkpoint)
    assert buckets == extra.get("buckets"), (
        f"the checkpoint records {buckets} buckets, not {extra.get('buckets')}"
    )
    # A lock file or a leftover temporary file would only confuse a restore.
    for stray in [*checkpoint.rglob("fencewatch.lock"), *checkpoint.rglob("*.tmp")]:
        stray.unlink()
    absolute = files_naming(checkpoint, str(work))
    if checkpoint_out.exists():
        shutil.rmtree(checkpoint_out)
    shutil.copytree(checkpoint, checkpoint_out)
    shutil.rmtree(work)
    size = sum(p.stat().st_size for p in checkpoint_out.rglob("*") if p.is_file())

    written = {
        "written_by": release,
        "pyspark": pyspark.__version__,
        "script": "tests/data/upgrade/make_checkpoint.py",
        "history": HISTORY,
        "events": len(events),
        "split": split,
        "split_ts_ms": split_ts_ms,
        "records_sha256": {"first": digest(recs[:split]), "whole": digest(recs)},
        "source_topic": SOURCE_TOPIC,
        "source_partitions": SOURCE_PARTITIONS,
        # Per source partition, how many records the old job read (its committed
        # offset): the first `split` records, keyed by cluster.
        "consumed": consumed,
        "last_batch_id": last_batch,
        "shuffle_partitions": 2,
        "job_options": {
            "max_events_per_trigger": MAX_EVENTS_PER_TRIGGER,
            "trigger_seconds": TRIGGER_SECONDS,
            "idle_flush_ms": IDLE_FLUSH_MS,
            "alerts_topic": ALERTS_TOPIC,
            "dead_letter_topic": DEAD_LETTER_TOPIC,
            **extra,
        },
        # The bucket count the checkpoint records (null: written before buckets,
        # state keyed by cluster alone, which restores as one bucket).
        "buckets": buckets,
        # streaming/snapshot_format.py's number for the state the release wrote.
        "state_format": written_format,
        "idle_flushed_before_stop": False,
        "pending_judgments_at_split": facts["pending_at_split"],
        "flush_at_split_raises_nothing": facts["flush_at_split_raises_nothing"],
        "flush_at_split_changes_nothing_later": facts["flush_at_split_changes_nothing_later"],
        "alerts_emitted_by_old_job": sorted(emitted),
        "alerts_expected_after_restart": sorted(facts["after"]),
        "alerts_needing_first_part_state": sorted(facts["needs_first_part_state"]),
        "violations_injected": {
            "first": sum(t["ts_ms"] <= split_ts_ms for t in truth),
            "after": sum(t["ts_ms"] > split_ts_ms for t in truth),
        },
        "checkpoint_bytes": size,
        # Spark's transformWithState operator metadata (state/0/_metadata/v2/<batch>)
        # points at its state schema file by absolute URI, and a restart reads it
        # there: a copy must be relocated (the test rewrites these files).
        "written_at": f"file:{checkpoint}",
        "files_naming_the_write_directory": absolute,
    }
    facts_out.write_text(json.dumps(written, indent=2) + "\n")
    print(f"wrote {checkpoint_out} ({size} bytes) and {facts_out.name} in {elapsed:.0f}s")
    if absolute:
        print(f"files naming the directory the checkpoint was written in: {absolute}")


if __name__ == "__main__":
    main()
