"""Clock evidence shared by the buckets of one cluster (issue 45, decision 2).

A bucket sees the requests of its own partitions only, and a node's clock is
bounded by requests that carry an epoch soon after the record creating it
(detectors.clocks): the record is in one bucket alone, so only that bucket can
turn such a request into a bound. Left to itself a bucket's evidence is
sparse, its intervals loose, and its judgments wait for them: with 8 buckets
15.2 s of event time at p99 where the whole cluster waited 6.45 s
(docs/performance.md).

So each bucket measures what only it can, and tells the others: every bound
its clock book takes from its own claims (ClockBook.shared, the arguments of
``ClockBook._bound``) is collected (:func:`take_shared`), the buckets'
collections are merged into one *clock evidence* record per cluster
(:func:`merge`: per node, half-second of its time, side and frame only the
tightest bound matters, as in ``EvidenceLine.add``), and every bucket takes
the merged record (:func:`apply`), placing each bound exactly as the bucket
that measured it did (ClockBook.take_shared). The record is input like any
other: the streaming job publishes it to the event topic, keyed by cluster,
after each micro-batch (streaming/sinks.py), and every bucket receives it
(detectors.buckets), so a restart, a re-delivery or a replay of the topic
gives the same alerts; taking a bound twice changes nothing. The whole
cluster's detector (one bucket) has every bound already and ignores it.

A bound is taken only by a bucket whose metadata log's time is framed as the
sender's was (the same number of steps of the log's clock, the same shift):
both saw the same steps, so their times agree. Otherwise it is left out, and
the bucket measures from its own evidence as before: sound, only looser.
Bounds reach the other buckets a micro-batch late, which their judgments wait
for anyway (a judgment waits for its window's evidence, seconds of event
time), and which the 30 s clock window easily spans.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from detectors.clocks import BUCKET_MS, GAP_MS, ClockBook, SharedBound
from detectors.cluster import ClusterState
from detectors.envelope import BadRecord, DeadLetterClass, Envelope

CLOCK_EVIDENCE = "clock_evidence"


def share(cs: ClusterState) -> None:
    """Start collecting what ``cs`` (a bucket of a split cluster that measures
    clocks) measures, for the other buckets; a state that collects already is left."""
    if cs.bucket.count > 1 and cs.measures_clocks and cs.clocks.shared is None:
        cs.clocks.shared = []


def take_shared(cs: ClusterState) -> dict[str, Any] | None:
    """What ``cs`` measured since the last call, as a body for :func:`merge`
    (None: nothing), with the frame of the log's time it was measured in, and
    when it saw each node's records (ClockBook.shared_runs)."""
    book = cs.clocks
    if not book.shared and not book.shared_runs:
        return None
    bounds, book.shared = book.shared or [], []
    runs, book.shared_runs = book.shared_runs, {}
    return {
        "bucket": cs.bucket.index,
        "buckets": cs.bucket.count,
        "frame": book.frame,
        "shift_ms": cs.metadata_clock.shift_ms,
        "bounds": [[n, t, c, int(u), int(f), fr] for n, t, c, u, f, fr in bounds],
        "runs": [[node, node_runs] for node, node_runs in sorted(runs.items())],
    }


def merge(bodies: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """The bodies of one cluster's buckets as few as there are frames among
    them (one, but around a step of the log's clock), each with only the
    tightest bound per node, half-second of its time, side and frame; a tie
    keeps the first, as ``EvidenceLine.add`` does (bodies in bucket order)."""
    groups: dict[tuple[int, int, int], dict[tuple[int, int, int, int], list[int]]] = {}
    seen: dict[int, list[list[int]]] = {}
    for body in bodies:
        for node, node_runs in body["runs"]:
            seen.setdefault(node, []).extend(node_runs)
        kept = groups.setdefault((body["buckets"], body["frame"], body["shift_ms"]), {})
        for bound in body["bounds"]:
            node, node_ms, created_ms, upper, _, frame = bound
            slot = (node, node_ms // BUCKET_MS, upper, frame)
            known = kept.get(slot)
            value = node_ms - created_ms
            if known is None or (value < known[1] - known[2] if upper else value > known[1] - known[2]):
                kept[slot] = bound
    # Node times are the node's own, in no frame of the log's: every record carries all.
    runs = [[node, _union(node_runs)] for node, node_runs in sorted(seen.items())]
    return [
        {"buckets": buckets, "frame": frame, "shift_ms": shift, "bounds": list(kept.values()), "runs": runs}
        for (buckets, frame, shift), kept in groups.items()
    ]


def _union(runs: list[list[int]]) -> list[list[int]]:
    """Runs of record times from several buckets as the cluster's: joined
    where no silence longer than GAP_MS separates them."""
    out: list[list[int]] = []
    for start, end in sorted(runs):
        if out and start - out[-1][1] <= GAP_MS:
            out[-1][1] = max(out[-1][1], end)
        else:
            out.append([start, end])
    return out


def envelope_body_time(body: dict[str, Any]) -> int:
    """The time a clock evidence record is stamped with: the newest node time it names."""
    times = [bound[1] for bound in body["bounds"]] + [run[-1][1] for _, run in body["runs"] if run]
    return max(times, default=0)


def apply(cs: ClusterState, env: Envelope) -> None:
    """Take a clock evidence record: every bound, if ``cs`` is a bucket of the
    layout that sent it and frames the log's time as the senders did. Raises
    BadRecord on a body that is not one."""
    body = env.body
    buckets, frame, shift = (body.get(name) for name in ("buckets", "frame", "shift_ms"))
    bounds, runs = body.get("bounds"), body.get("runs")
    if not (
        _int(buckets) and _int(frame) and _int(shift) and isinstance(bounds, list) and isinstance(runs, list)
    ):
        raise BadRecord(
            "clock evidence must have integer buckets, frame and shift_ms and bounds and runs lists",
            DeadLetterClass.INVALID,
        )
    parsed = [_bound(bound) for bound in bounds]
    parsed_runs = [_runs(value) for value in runs]
    if buckets != cs.bucket.count or cs.bucket.count == 1 or not cs.measures_clocks:
        return  # another layout's, or the whole cluster, which measured every bound itself
    book = cs.clocks
    for node, node_runs in parsed_runs:
        _cut_as_the_cluster(book, node, node_runs)
    if (frame, shift) != (book.frame, cs.metadata_clock.shift_ms):
        return  # measured against a differently framed log time
    for bound in parsed:
        book.take_shared(bound)


def _cut_as_the_cluster(book: ClockBook, node: int, runs: list[list[int]]) -> None:
    """Where the cluster's records of ``node`` fall silent, from the union of
    every bucket's runs (:func:`merge`). A bucket sees a node's records about
    its own partitions only, so its evidence lines are cut wherever those
    fall silent for GAP_MS (EvidenceLine.saw), which the node's whole log
    need not: the cuts it made within what the runs cover are replaced by the
    cluster's, each where a run begins after a silence. Runs up to where the
    runs known already reach are taken once (a record delivered again adds
    nothing); the cuts after a backward step (blind) are the bucket's own."""
    known = book.runs_known.get(node)
    cuts: list[int] = []
    start: int | None = None
    reach = known
    for first, last in runs:
        if reach is not None and last <= reach:
            continue
        if start is None:
            # Past the runs known; a first run's own start is left as the bucket has it
            # (it may have seen the node before it began to share: a checkpoint of before).
            start = first + 1 if reach is None else reach + 1
        if reach is not None and first - reach > GAP_MS:
            cuts.append(first)
        reach = last if reach is None else max(reach, last)
    if start is None or reach is None:
        return
    book.runs_known[node] = reach
    for lines in (book.lines, *(view for _, _, view in book.views)):
        line = lines.get(node)
        if line is None:
            continue
        after_blinds = {high + 1 for _, high in line.blind}
        kept = [c for c in line.cuts if not start <= c <= reach or c in after_blinds]
        line.cuts = sorted({*kept, *cuts})
        line.version += 1


def _runs(value: Any) -> tuple[int, list[list[int]]]:
    if (
        isinstance(value, list)
        and len(value) == 2
        and _int(value[0])
        and isinstance(value[1], list)
        and all(isinstance(r, list) and len(r) == 2 and _int(r[0]) and _int(r[1]) for r in value[1])
    ):
        return value[0], value[1]
    raise BadRecord(
        f"clock evidence runs must be [node, [[first_ms, last_ms], ...]], got {value!r:.80}",
        DeadLetterClass.INVALID,
    )


def _bound(value: Any) -> SharedBound:
    if (
        isinstance(value, list)
        and len(value) == 6
        and all(_int(v) for v in value)
        and value[3] in (0, 1)
        and value[4] in (0, 1)
    ):
        node, node_ms, created_ms, upper, fresh, frame = value
        return (node, node_ms, created_ms, bool(upper), bool(fresh), frame)
    raise BadRecord(
        f"a clock evidence bound must be [node, node_ms, created_ms, upper, fresh, frame], got {value!r:.80}",
        DeadLetterClass.INVALID,
    )


def _int(value: Any) -> bool:
    return type(value) is int
