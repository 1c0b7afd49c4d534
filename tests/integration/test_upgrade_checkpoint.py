"""Checkpoints written by earlier releases restore in this one.

``tests/data/upgrade/checkpoint-<release>/`` is the checkpoint of the
streaming job at ``release`` after it read the first ``split`` records of a
simulated history of two clusters; the JSON beside it says how it was made
(``make_checkpoint.py``, which this test also imports to regenerate the same
history) and what the release wrote. One case per release in ``RELEASES``:

- 67519df: state keyed by cluster, before buckets (it restores as one
  bucket); state format 0, pending judgments inside the detector's pickle.
- de81004: 8 buckets per cluster; state format 2, the ``detector`` ValueState,
  the ``partitions`` MapState keyed (topic, partition) and the ``pending``
  MapState.
- 14666cb: 8 buckets per cluster; state format 3, partition histories in the
  ``partition_groups`` MapState, remote segments still in the detector value.
- e380fe1: 8 buckets per cluster; state format 5, remote segments in the
  ``remote_partitions`` MapState, each partition history pickled as its
  objects (format 6 pickles plain values, and reads both).

Each restores its partition histories into groups and its remote segments
into the ``remote_partitions`` MapState (state format 4 on).

The job here restarts on a copy of one, over a topic of the same name holding
the whole history at the same offsets, and must go on where the old job
stopped: read only the rest, with the old job's state and its bucket count,
and raise exactly what ``fencewatch replay`` raises on the whole history and
had not raised on the first part.

Judgments pending at the split: the old job was stopped before any idle
flush (``idle_flushed_before_stop``), so its state holds the judgments still
waiting for their grace window, and this job judges them with the events that
follow. Had an idle flush run first, it would have judged them early.
``make_checkpoint.choose_split`` only accepts a split where both come to the
same alerts (a flush there raises nothing and changes nothing later); this
test checks that again with this release's detector, so the expectation below
holds whichever way the checkpoint was written.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import time
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from confluent_kafka.admin import AdminClient
from test_job import publish, read_topic, replay_alerts, replayed, wait_for
from test_source_offsets_lost import recreate

from streaming import snapshot_format
from streaming.broker import EmbeddedBroker
from streaming.bucket_layout import LAYOUT_FILE
from streaming.job import JobOptions, start
from streaming.kafka_source import partition_offsets
from streaming.sinks import TopicSink

pytestmark = pytest.mark.integration

# The releases whose checkpoints are under tests/data/upgrade: add the previous
# release's whenever the state format is raised (streaming/snapshot_format.py).
# The previous release's runs in `make test`; the older ones are extended tests.
RELEASES = (
    pytest.param("67519df", marks=pytest.mark.extended),
    pytest.param("de81004", marks=pytest.mark.extended),
    pytest.param("14666cb", marks=pytest.mark.extended),
    "e380fe1",
)
DATA = Path(__file__).resolve().parents[1] / "data" / "upgrade"
WAIT_SECONDS = 300


def load_writer() -> ModuleType:
    """``make_checkpoint.py``: the history it published and the replay helpers."""
    spec = importlib.util.spec_from_file_location("make_checkpoint", DATA / "make_checkpoint.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def relocate(checkpoint: Path, written_at: str) -> list[str]:
    """Point the copy at ``checkpoint`` at itself. Spark's transformWithState
    operator metadata names its state schema file by absolute URI (the
    directory the old job wrote to, gone since) and a restart opens it there.
    A rewritten file loses its Hadoop ``.crc`` sibling, which would no longer
    match (without one, Hadoop's local filesystem reads unchecked)."""
    old, new = f"{written_at}/".encode(), f"file:{checkpoint}/".encode()
    rewritten = []
    for path in sorted(p for p in checkpoint.rglob("*") if p.is_file()):
        data = path.read_bytes()
        if old in data:
            path.write_bytes(data.replace(old, new))
            path.with_name(f".{path.name}.crc").unlink(missing_ok=True)
            rewritten.append(str(path.relative_to(checkpoint)))
    return rewritten


def state(spark: Any, checkpoint: str, variable: str) -> list[Any]:
    """One state variable (``stateVarName``) of every bucket, through Spark's state data source."""
    return (
        spark.read.format("statestore")
        .option("path", checkpoint)
        .option("stateVarName", variable)
        .load()
        .collect()
    )


def remote_segments(spark: Any, checkpoint: str) -> set[tuple[tuple[str, int], str]]:
    """The segments the checkpoint's ``remote_partitions`` MapState tracks (state format 4 on)."""
    return {
        ((row.user_map_key.topic_id, row.user_map_key.partition), segment_id)
        for row in state(spark, checkpoint, "remote_partitions")
        for segment_id in snapshot_format.decode(row.user_map_value.segments).segments
    }


def replay_segments(events: list[dict]) -> set[tuple[tuple[str, int], str]]:
    """The remote segments replay still tracks after ``events``, as (partition, id)."""
    return {
        (key, segment_id)
        for cluster in replayed(events).clusters.values()
        for key, part in cluster.remote.partitions.items()
        for segment_id in part.segments
    }


def fresh_topic(broker: EmbeddedBroker, name: str, partitions: int) -> None:
    """``name`` empty, its offsets from 0: created, or recreated if an earlier
    run in this broker's session left it behind."""
    admin = AdminClient({"bootstrap.servers": broker.bootstrap_servers})
    if name in admin.list_topics(timeout=10).topics:
        recreate(broker, name, partitions)
    else:
        broker.create_topics({name: partitions})


def end_offsets(broker: EmbeddedBroker, topic: str) -> dict[str, int]:
    """Each partition's end offset, as the checkpoint's offset log writes them."""
    probe = TopicSink(broker.bootstrap_servers, topic, {})
    try:
        return {str(p): end for p, end in sorted(probe.end_offsets().items())}
    finally:
        probe.close()


def source_offset(progress: dict, field: str) -> dict[str, int] | None:
    raw = progress["sources"][0].get(field) if progress.get("sources") else None
    if raw is None:
        return None
    return partition_offsets(json.loads(raw) if isinstance(raw, str) else raw)


@pytest.mark.timeout(600)
@pytest.mark.parametrize("release", RELEASES)
def test_a_checkpoint_of_an_earlier_release_resumes_with_its_state(
    release: str, spark, broker: EmbeddedBroker, make_topic, tmp_path: Path
) -> None:
    writer = load_writer()
    written = json.loads(writer.facts_file(release).read_text())
    assert written["written_by"] == release, written["written_by"]
    events, _ = writer.history(written["history"])
    split, consumed = written["split"], written["consumed"]
    records = writer.records(events)
    assert len(events) == written["events"]
    assert writer.digest(records) == written["records_sha256"]["whole"], (
        "the simulator no longer produces the history the checkpoint was written from: "
        "regenerate it with make_checkpoint.py on the release it names"
    )

    # What replay raises, with this release's detector; and the split still robust with it.
    first_part = replay_alerts(events[:split])
    whole = replay_alerts(events)
    expected = set(whole) - set(first_part)
    facts = writer.split_facts(events, split)
    assert writer.robust(facts), f"the split at {split} is not robust with this detector: {facts}"
    assert set(first_part) == set(written["alerts_emitted_by_old_job"]), (
        "replay of the first part no longer raises the alerts the old job raised: alert ids changed "
        f"between releases (now {sorted(first_part)}, then {written['alerts_emitted_by_old_job']})"
    )
    needs_state = set(facts["needs_first_part_state"])
    assert expected and needs_state <= expected

    checkpoint = tmp_path / "ck"
    shutil.copytree(writer.checkpoint_dir(release), checkpoint)
    assert relocate(checkpoint, written["written_at"]) == written["files_naming_the_write_directory"]
    stored_partitions = {
        (row.user_map_key.topic, row.user_map_key.partition)
        for row in state(spark, str(checkpoint), "partitions")
    }
    assert bool(stored_partitions) == (written["state_format"] < snapshot_format.GROUPED_PARTITIONS)
    if written["state_format"] < snapshot_format.REMOTE_PARTITIONS:
        stored_segments = {
            (key, segment_id)
            for row in state(spark, str(checkpoint), "detector")
            for cluster in snapshot_format.decode(row.value.snapshot).clusters.values()
            for key, part in cluster.remote.partitions.items()
            for segment_id in part.segments
        }
    else:
        stored_segments = remote_segments(spark, str(checkpoint))
    assert stored_segments, "the old job tracked no remote segment: their move would not be shown"
    topic = written["source_topic"]
    fresh_topic(broker, topic, written["source_partitions"])
    publish(broker, topic, records[:split])
    assert end_offsets(broker, topic) == consumed, (
        f"the first part did not land at the offsets the old job read ({consumed}): the restored "
        "offsets would not line up with the records"
    )
    publish(broker, topic, records[split:])
    ends = end_offsets(broker, topic)
    assert sum(ends.values()) == len(records), ends

    options = JobOptions(
        bootstrap_servers=broker.bootstrap_servers,
        topic=topic,
        checkpoint=str(checkpoint),
        alerts_topic=make_topic(1),
        dead_letter_topic=make_topic(1),
        max_events_per_trigger=400,
        trigger_seconds=0.5,
        idle_flush_ms=2_000,
    )
    started = time.monotonic()
    query = start(spark, options, console=None)
    try:

        def data_batches() -> list[dict]:
            return sorted(
                (p for p in query.recentProgress if p["numInputRows"] > 0), key=lambda p: p["batchId"]
            )

        def committed() -> dict[str, int] | None:
            found = writer.committed_source_offsets(checkpoint)
            return None if found is None else partition_offsets(found[1])

        wait_for(lambda: bool(data_batches()), query, WAIT_SECONDS, "the first batch after the restart")
        resumed = data_batches()[0]
        assert resumed["batchId"] == written["last_batch_id"] + 1, (
            f"the restarted query ran batch {resumed['batchId']} first, not "
            f"{written['last_batch_id'] + 1}: it did not resume the checkpoint's logs"
        )
        assert source_offset(resumed, "startOffset") == consumed, (
            f"the restarted query read from {source_offset(resumed, 'startOffset')}, not from where the "
            f"old job stopped ({consumed}): it did not resume the checkpoint's offsets"
        )
        wait_for(lambda: committed() == ends, query, WAIT_SECONDS, "the rest of the history committed")

        # Judgments pending at the end of the input are made by the idle flush,
        # which runs in the two empty batches the source plans once the topic is
        # quiet; after them no batch runs, so nothing more can come.
        def idle_batches() -> list[int]:
            return [
                p["batchId"]
                for p in query.recentProgress
                if p["numInputRows"] == 0 and "addBatch" in p["durationMs"]
            ]

        wait_for(lambda: len(idle_batches()) >= 2, query, 60, "the idle flush")
    finally:
        query.stop()
    print(f"\nresumed at batch {resumed['batchId']}; done {time.monotonic() - started:.1f}s after the start")
    assert query.exception() is None, query.exception()
    read = sum(p["numInputRows"] for p in data_batches())
    assert read == len(records) - split, (
        f"the restarted query read {read} records, not the {len(records) - split} after the split"
    )

    ids = [headers["fencewatch-id"] for headers, _ in read_topic(broker, options.alerts_topic)]
    again = sorted(set(ids) & set(first_part))
    assert not again, (
        f"{len(again)} of the {len(first_part)} alerts the old job had raised were raised again: "
        "the restarted job judged the first part anew, so its state was not restored"
    )
    assert len(ids) == len(set(ids)), f"alerts delivered twice: {sorted(i for i in ids if ids.count(i) > 1)}"
    missing, extra = sorted(expected - set(ids)), sorted(set(ids) - expected)
    assert not (set(missing) & needs_state), (
        f"alerts that need the first part's state were not raised ({sorted(set(missing) & needs_state)}): "
        "the restored state was not used"
    )
    assert not missing and not extra, f"missing {missing}, extra {extra}"
    assert read_topic(broker, options.dead_letter_topic) == []
    # A checkpoint from before buckets runs on as one bucket, and records that.
    layout = json.loads((checkpoint / LAYOUT_FILE).read_text())
    assert layout["buckets"] == (written["buckets"] or 1), (
        f"the restarted job recorded {layout['buckets']} buckets for a checkpoint written with "
        f"{written['buckets']}: it did not keep the checkpoint's layout"
    )
    # The partition histories of state formats before 3 were moved into groups.
    assert state(spark, str(checkpoint), "partitions") == []
    grouped = {
        (row.user_map_key.topic, partition)
        for row in state(spark, str(checkpoint), "partition_groups")
        for partition in snapshot_format.decode(row.user_map_value.histories)
    }
    assert grouped >= stored_partitions, (
        f"of the {len(stored_partitions)} partitions the old job stored, "
        f"{len(stored_partitions - grouped)} are in no group after the restart"
    )
    # The remote segments of state formats before 4 were moved under their partitions:
    # the job tracks, across its buckets, exactly the segments replay tracks at the end.
    tracked = remote_segments(spark, str(checkpoint))
    assert tracked == replay_segments(events), "the job's remote segments differ from replay's"
    assert tracked & stored_segments, "none of the old job's segments is tracked after the restart"
