"""The detector: envelopes in, alerts out. The same object runs under
``fencewatch replay`` and inside the streaming job's stateful operator, so both
raise the same alerts from the same events.

Metadata, quorum and remote-log records update the view as they arrive,
each offset-ordered log in its own offset order (see detectors.redelivery).
Judgments of request outcomes wait, per cluster, until the event-time
watermark has passed the latest moment the judged node's clock offset allows
plus ``grace_ms``: then every event that can change the verdict is in, whatever
order the sources arrived in. The watermark is the slowest active source's
progress, in the metadata log's clock, minus ``lateness_ms``
(detectors.progress); each node's offset to that clock is measured from the
requests it handled (detectors.clocks), which the detector reads for that as it
ingests them.

Input arrives at least once: a record delivered again is recognised by its
identity and counted as a duplicate, never applied or judged twice. A request
that arrives after its own judgment was due (behind the watermark) is refused,
counted as unverified: the view may have pruned the states its window needs,
and a re-delivery that old could not be told from a new record.
"""

from __future__ import annotations

import heapq
import math
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any, TypeVar

from detectors import clock_exchange, rules
from detectors.alerts import Alert, Evidence
from detectors.buckets import WHOLE, Bucket
from detectors.clock_exchange import CLOCK_EVIDENCE
from detectors.clocks import ClockInterval, MetadataClock
from detectors.cluster import ClusterState, Counters, handling_ms, new_clock_book
from detectors.config import DetectorConfig
from detectors.envelope import (
    BadRecord,
    DeadLetter,
    DeadLetterClass,
    Envelope,
    Unverified,
    dumps,
    without_body,
)
from detectors.errors import KafkaError
from detectors.fast_path import nothing_to_judge
from detectors.fields import INT16, get_int, get_obj
from detectors.gc_tuning import collector_paused
from detectors.history import History
from detectors.progress import Progress, SourceKey, source_key
from detectors.quorum import KRAFT_VOTERS, LEADER_CHANGE
from detectors.redelivery import (
    Arrival,
    OffsetOrder,
    PartitionedOffsetOrder,
    RecentIds,
    RememberedIds,
    content_identity,
)
from detectors.requests import (
    ALTER_PARTITION,
    API_NAMES,
    BEGIN_QUORUM_EPOCH,
    BROKER_HEARTBEAT,
    END_QUORUM_EPOCH,
    FETCH,
    LEADER_AND_ISR,
    LIST_OFFSETS,
    OFFSET_FOR_LEADER_EPOCH,
    PRODUCE,
    STOP_REPLICA,
    UPDATE_METADATA,
    VOTE,
    AlterPartition,
    Header,
    PartitionOutcome,
    StopReplica,
    alter_partition,
    broker_heartbeat,
    decoded_once,
    header,
    is_quorum_fetch,
    leader_and_isr,
    partition_outcomes,
    stop_replica,
    update_metadata,
)
from detectors.rules.base import Deferred
from detectors.stats import UnverifiedReason, cluster_snapshot
from detectors.view import PartitionChange, PartitionState, own_topic_key

Judgment = Callable[[], None]

# A pending judgment as plain data, without the cluster state it judges:
# ``(due_ms, ts_ms, arrival, judge, event, facts)``; it runs as ``judge(cs, event, *facts)``
# (rules.base.Deferred), in (due_ms, ts_ms, arrival) order.
#
# What it references, and why it can be pickled apart from the detector: ``judge``
# is a module-level rule function (pickled by name); ``event`` is the event
# without its body, a frozen Envelope made for this record alone (without_body),
# shared only by the judgments of the same record, which are scheduled together
# and so stored together; ``facts`` are frozen values parsed from that record
# (Header, PartitionOutcome, StopReplica, AlterPartition, ints, bools), except
# rules.remote._judge_delete's Segment, which rules.remote.ingest removes from
# ``cs.remote`` as it schedules the judgment, so the judgment is its only holder.
# The cluster state ``cs`` itself, which every queued judgment is bound to, is
# left out and bound again on restore (Detector.keep_pending_apart).
PendingJudgment = tuple[int, int, int, Callable[..., None], Envelope, tuple[Any, ...]]

TOO_LATE = UnverifiedReason.TOO_LATE
T = TypeVar("T")
# Held records from which a release runs with the collector paused. A bucket of
# the job holds a few records nearly always and looks for due ones at every
# event; the pause costs 1.6-2.4 us each time (timeit), against about 44 us for
# detecting an event in replay (docs/performance.md, "What measuring clocks
# costs replay").
BULK_RELEASE = 1_000


def _plain(entry: tuple[int, int, int, Judgment]) -> PendingJudgment:
    """A queued judgment without the cluster state it is bound to (see PendingJudgment)."""
    due_ms, ts_ms, arrival, judgment = entry
    assert isinstance(judgment, partial) and not judgment.keywords
    _cs, event, *facts = judgment.args
    return (due_ms, ts_ms, arrival, judgment.func, event, tuple(facts))


def wall_clock_ms() -> int:
    return time.time_ns() // 1_000_000


# The events counter's key per request API, made once instead of per event.
_REQUEST_EVENT_KEYS = {api_key: f"request:{name}" for api_key, name in API_NAMES.items()}


@dataclass
class PendingChanges:
    """What changed in a cluster's pending judgments since the last look
    (Detector.pending_changes), for a store that keeps them apart."""

    scheduled: list[PendingJudgment] = field(default_factory=list)  # still waiting
    decided: list[int] = field(default_factory=list)  # arrivals of judgments scheduled before the last look


@dataclass
class _Journal:
    """Heap entries pushed and arrivals popped since the last look."""

    pushed: list[tuple[int, int, int, Judgment]] = field(default_factory=list)
    popped: list[int] = field(default_factory=list)


class _Cluster(ClusterState):
    """A cluster's state plus its own watermark and pending judgments."""

    def __init__(self, *args: object, **kwargs: object):
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.progress = Progress()
        self.watermark: float | None = None  # see Detector._refresh_watermark
        self.pending: list[tuple[int, int, int, Judgment]] = []
        # Set while the pending judgments are kept apart from pickles of this state.
        self.journal: _Journal | None = None
        self.expired_at_ms = 0
        self._start_redelivery_state()

    def _start_redelivery_state(self) -> None:
        """What recognises re-delivered records (detectors.redelivery)."""
        self.metadata_log = OffsetOrder()
        self.remote_log = PartitionedOffsetOrder()
        self.recent_ids = RecentIds()
        self.quorum_state_ids = RememberedIds()
        self.quorum_states: dict[int, bytes] = {}  # node -> its newest state's content identity

    def __setstate__(self, state: dict[str, Any]) -> None:
        """Restore a pickled snapshot. One written before buckets (up to 67519df)
        owned the whole cluster. One written before re-deliveries were
        recognised (up to 06212d9) has none of their state: it starts empty,
        and the metadata log resumes after the last offset that release applied."""
        self.__dict__.update(state)
        self.__dict__.setdefault("bucket", WHOLE)
        self.__dict__.setdefault("journal", None)
        self.__dict__.setdefault("bound_contradicted", {})
        self.measures_clocks = self.config.measure_clocks
        if "progress" not in state:
            # Up to f6ae53e one newest time stood for every source, and no clock was measured.
            self.progress = Progress()
            self.progress.max_ts_ms = self.__dict__.pop("max_ts_ms", None)
            self.watermark = None
            self.clocks = new_clock_book(self.config)
            self.metadata_clock = MetadataClock()
        if "metadata_log" not in state:
            self._start_redelivery_state()
            self.metadata_log.last = state["view"].__dict__.pop("last_metadata_offset", None)
        elif isinstance(self.remote_log, OffsetOrder):
            # Up to 082e290 one order held every __remote_log_metadata partition's records.
            self.remote_log = PartitionedOffsetOrder.of_one(self.remote_log)

    def __getstate__(self) -> dict[str, Any]:
        if self.journal is None:
            return self.__dict__
        # Kept apart (Detector.keep_pending_apart): their store holds them, so a
        # snapshot of the rest need not carry them. Restored, the state has none
        # until keep_pending_apart puts the stored ones back.
        return {**self.__dict__, "pending": [], "journal": None}

    def ordered_log(self, env: Envelope) -> OffsetOrder | None:
        """The offset-ordered log ``env`` belongs to, if it carries its offset."""
        if env.offset is None:
            return None
        if env.kind == "metadata":
            return self.metadata_log
        if env.kind == "remote_log_metadata":
            return self.remote_log.log_of(env)
        return None

    def held_count(self) -> int:
        return self.metadata_log.held_count() + self.remote_log.held_count()

    @property
    def max_ts_ms(self) -> int | None:
        """The newest ``ts_ms`` of any source, uncorrected (for the snapshot)."""
        return self.progress.max_ts_ms

    @property
    def watermark_ms(self) -> float | None:
        return self.watermark

    def release_ms(self) -> float | None:
        """Until when held records of the offset-ordered logs are waited for: a
        record held for a missing predecessor is applied once any source has
        gone ``lateness_ms`` past it. This is about arrival within one log, not
        about clocks: the judgments' watermark would wait for the log itself."""
        newest = self.progress.max_ts_ms
        return None if newest is None else max(newest - self.config.lateness_ms, self.watermark or -math.inf)

    def held(self, key: SourceKey) -> bool:
        """A log with records held for their offset order: never idle."""
        log = (
            self.metadata_log
            if key[0] == "metadata"
            else self.remote_log
            if key[0] == "remote_log_metadata"
            else None
        )
        return log is not None and log.held_count() > 0

    def corrected(self, key: SourceKey, ts_ms: int) -> float:
        """``ts_ms`` of source ``key`` at the earliest moment of the metadata log's
        (continuous) clock its node's measured offset allows."""
        if key[0] == "metadata":
            return ts_ms + self.metadata_clock.shift_ms
        if key[0] not in ("request", "quorum_state"):
            return ts_ms
        return corrected_by(self.node_interval(key[1], ts_ms), ts_ms)


# The kinds a node stamps by its own clock; the others carry the metadata log's.
_NODE_CLOCKED = ("request", "quorum_state", "remote_log_metadata")


def _clock_of(cs: ClusterState, env: Envelope, clock: ClockInterval | None) -> ClockInterval | None:
    """:meth:`ClusterState.clock` of ``env`` (``clock``: a request's, if looked up
    already), or None for a kind stamped by the metadata log's clock."""
    if env.kind not in _NODE_CLOCKED:
        return None
    if clock is not None:
        return clock
    writer = None
    if env.kind == "remote_log_metadata":
        # Stamped by the broker that wrote it (detectors.remote).
        data = env.body.get("data")
        broker = data.get("brokerId") if isinstance(data, dict) else None
        writer = broker if type(broker) is int else None
    return cs.clock(env, writer)


def corrected_by(interval: ClockInterval, ts_ms: int) -> float:
    """``ts_ms`` of a clock whose offset is in ``interval`` at the earliest moment
    of the metadata log's clock it allows (unmeasured or unbounded: as it is)."""
    return ts_ms - interval.high_ms if interval.measured and math.isfinite(interval.high_ms) else ts_ms


class Detector:
    """Feed envelopes with :meth:`ingest`; collect alerts with :meth:`drain`;
    call :meth:`flush` at the end of a finite input to judge what is pending.

    ``bucket``: the part of each cluster's partitions this detector judges,
    when the streaming job splits a cluster over several (detectors.buckets);
    by default all of them."""

    def __init__(
        self,
        config: DetectorConfig | None = None,
        now_ms: Callable[[], int] = wall_clock_ms,
        bucket: Bucket = WHOLE,
        fast_path: bool = True,
    ):
        self.config = config or DetectorConfig()
        self.now_ms = now_ms
        self.bucket = bucket
        # Off only to hold it equal to the full judgment (tests/unit/test_fast_path.py).
        self.fast_path = fast_path
        self.counters = Counters()
        self.clusters: dict[str, _Cluster] = {}
        self._arrivals = 0

    def __setstate__(self, state: dict[str, Any]) -> None:
        # A detector pickled before buckets (up to 67519df) judged whole clusters.
        self.__dict__.update(state)
        self.__dict__.setdefault("bucket", WHOLE)
        self.__dict__.setdefault("fast_path", True)  # pickled before it existed (up to b9cb326)

    def cluster(self, name: str) -> _Cluster:
        cs = self.clusters.get(name)
        if cs is None:
            cs = self.clusters[name] = _Cluster(
                name, self.config, self.counters, self.now_ms, bucket=self.bucket
            )
        return cs

    def ingest(self, env: Envelope, home: bool = True) -> list[DeadLetter]:
        """Take one event. Returns the dead letters it caused: its own if its
        body cannot be used, and those of held records it released.

        ``home`` is False for a copy of a record that several buckets receive
        and another bucket counts: the copy updates this bucket's view and is
        judged for this bucket's partitions, but is not counted, dead-lettered
        or judged for what belongs to no partition (detectors.buckets)."""
        cs = self.cluster(env.cluster)
        if env.kind == CLOCK_EVIDENCE:
            return self._clock_evidence(cs, env, home)
        letters: list[DeadLetter] = []
        before = cs.watermark
        newest = cs.progress.max_ts_ms
        source: SourceKey | None = None
        ts_ms: float = env.ts_ms
        # A request's clock interval, looked up once for its late check and its due time.
        clock: ClockInterval | None = None
        if cs.measures_clocks:
            source = key = source_key(env.kind, env.node)
            if before is not None:
                if env.kind == "request":
                    clock = cs.node_interval(env.node, env.ts_ms)
                    ts_ms = corrected_by(clock, env.ts_ms)
                else:
                    ts_ms = cs.corrected(key, env.ts_ms)
            advanced = cs.progress.observe(key, env.ts_ms)
        else:
            # Every clock taken to agree: progress is the newest time of any source.
            advanced = cs.progress.observe_newest(env.ts_ms)
        if home and before is not None and ts_ms < before and not self._uncertain(clock):
            # Arrived after the watermark passed it (judged all the same while its
            # window is open). A clock known only as loosely as a take-over leaves
            # it places the request nowhere, so whether it is late cannot be told:
            # it is judged when due, by the interval known then.
            self.counters.late += 1
        if advanced or before is None:
            self._refresh_watermark(cs, source)
        # Held records whose time has now passed come before this one. Their time
        # (release_ms) moves with the newest time and the watermark only: a record
        # held since was looked at as it was held (_judge_due) unless there was no
        # watermark yet.
        if (before is None or cs.watermark != before or cs.progress.max_ts_ms != newest) and cs.held_count():
            self._release(cs, cs.release_ms(), letters)
            clock = None  # the records applied may have measured it anew
        log = cs.ordered_log(env)
        if log is not None:
            arrival = log.offer(env)
            if arrival is Arrival.APPLY:
                self._process(cs, env, letters, home)
            elif home and arrival is Arrival.DUPLICATE:
                self.counters.duplicates += 1
            elif home and arrival is Arrival.OUT_OF_ORDER:
                letters.append(self._out_of_order(env, log))
        else:
            due = self._first_delivery(cs, env, home, clock)
            if due is not None:
                self._process(cs, env, letters, home, due)
        watermark = cs.watermark
        # A late record's judgment may be due at once; an applied offset may free held successors.
        if watermark is not None and (
            watermark != before or log is not None or (cs.pending and cs.pending[0][0] <= watermark)
        ):
            self._judge_due(cs, watermark, letters)
        return letters

    def _refresh_watermark(self, cs: _Cluster, moved: SourceKey | None) -> None:
        config = self.config
        if not cs.measures_clocks:
            newest = cs.progress.max_ts_ms
            cs.watermark = None if newest is None else newest - config.lateness_ms
            return
        progress = cs.progress.watermark(
            moved, cs.corrected, config.idle_ms, max(config.idle_ms, config.clock_limit_ms), cs.held
        )
        cs.watermark = None if progress is None else progress - self.config.lateness_ms

    def _uncertain(self, clock: ClockInterval | None) -> bool:
        """A request's clock interval too wide to place it (``--clock-limit-ms``)."""
        return clock is not None and clock.measured and clock.width_ms > self.config.clock_limit_ms

    def due_ms(self, cs: ClusterState, env: Envelope, clock: ClockInterval | None = None) -> int:
        """When, in the metadata log's clock, every event that can change the
        verdict on ``env`` is in: the latest moment its node's clock offset
        allows, plus the grace window. ``clock``: a request's clock interval,
        if looked up already."""
        grace = self.config.grace_ms
        if not cs.measures_clocks:
            return env.ts_ms + grace
        interval = _clock_of(cs, env, clock)
        if interval is None:
            return env.ts_ms + grace
        low = interval.low_ms
        # Unmeasured, contradictory, or wider than the limit: judged at once (the
        # last counted as clock uncertain).
        if not interval.measured or not low <= interval.high_ms <= low + self.config.clock_limit_ms:
            return env.ts_ms + grace
        return math.ceil(env.ts_ms - low) + grace

    def _first_delivery(
        self, cs: _Cluster, env: Envelope, home: bool, clock: ClockInterval | None = None
    ) -> int | None:
        """The record's due time (:meth:`due_ms`, ``clock`` as there) on its first delivery; None for a
        record seen before (counted as a duplicate) and for one too late to judge
        (counted as unverified); see detectors.redelivery."""
        if env.kind == "quorum_state":
            # The file has no time: a shipper that restarts publishes the state it
            # holds again, stamped anew. An earlier state coming back later (after
            # an epoch regression, say) is a new observation, not a re-delivery.
            assert env.node is not None
            content = content_identity(env, with_time=False)
            first = (
                cs.quorum_state_ids.add(content_identity(env)) and cs.quorum_states.get(env.node) != content
            )
            cs.quorum_states[env.node] = content
            until_ms = self.due_ms(cs, env)
        else:
            interval = _clock_of(cs, env, clock) if cs.measures_clocks else None
            until_ms = self.due_ms(cs, env, interval)
            # A clock with no evidence in reach is taken to agree with the log's for
            # its verdict, but it may be off by anything up to the clock limit: its
            # record is too late only if it is so for every such offset, and its
            # identity is remembered that long. (A controller that spoke only at
            # elections, 3 s behind: its double vote was refused as too late, a
            # violation missed in benchmarks/clock_campaign.py.)
            unmeasured = interval is not None and not interval.measured
            latest_ms = until_ms + self.config.clock_limit_ms if unmeasured else until_ms
            watermark = cs.watermark
            if watermark is not None and latest_ms < watermark:
                if home:
                    cs.unverified(TOO_LATE)
                if env.kind == "request" and cs.measures_clocks:
                    _note_step_back(cs, env)
                return None
            first = cs.recent_ids.add(env.read_digest or content_identity(env), latest_ms, far=unmeasured)
        if not first:
            if home:
                self.counters.duplicates += 1
            return None
        return until_ms

    def _out_of_order(self, env: Envelope, log: OffsetOrder) -> DeadLetter:
        letter = DeadLetter(
            env.position,
            f"{env.kind} offset {env.offset} arrived after offset {log.last} was applied and was never "
            "applied itself: the view cannot be rewound to take it. Ship this log in offset order "
            "(replay merges a log cut into several files), or raise --lateness-ms if its records "
            "arrive further apart than that",
            dumps(env.to_dict()),
            kind=DeadLetterClass.OUT_OF_ORDER,
        )
        self.counters.bump(self.counters.events, "dead_letter")
        self.dead_letter(letter)
        return letter

    def _process(
        self, cs: _Cluster, env: Envelope, letters: list[DeadLetter], home: bool, due: int | None = None
    ) -> None:
        """Apply or schedule one first-delivered record; ``due``: its due time if
        known (judgments check it again when it comes)."""
        try:
            judgments = self._dispatch(cs, env, home)
        except BadRecord as exc:
            if not home:
                return
            self.counters.bump(self.counters.events, "dead_letter")
            letter = exc.dead_letter(env.position)
            self.dead_letter(letter)
            letters.append(letter)
            return
        except Unverified as exc:
            if home:
                cs.unverified(exc.reason)
            return
        if judgments:
            self._schedule(cs, env, judgments, self.due_ms(cs, env) if due is None else due)

    def _schedule(self, cs: _Cluster, env: Envelope, judgments: list[Deferred], due: int) -> None:
        """Queue each judgment until the watermark passes ``due`` (``ts_ms +
        grace_ms`` where clocks are not measured), bound to the event without
        its body (see rules.base.Deferred)."""
        lean = without_body(env)
        for judge, facts in judgments:
            self._arrivals += 1
            judgment: Judgment = partial(judge, cs, lean, *facts)
            entry = (due, env.ts_ms, self._arrivals, judgment)
            heapq.heappush(cs.pending, entry)
            if cs.journal is not None:
                cs.journal.pushed.append(entry)

    def dead_letter(self, letter: DeadLetter) -> None:
        """Count a record that could not be used, by its class."""
        # The plain string: counters are pickled with the detector and exported as labels.
        self.counters.bump(self.counters.dead_letters, letter.kind.value)

    def snapshot(self, cluster: str) -> dict[str, Any]:
        """Counters and state sizes of one cluster (see detectors.stats)."""
        return cluster_snapshot(self.cluster(cluster))

    def drain(self) -> list[Alert]:
        """Alerts raised since the last call, in the order they were raised."""
        out: list[Alert] = []
        for cs in self.clusters.values():
            if cs.out:
                out.extend(cs.out)
                cs.out.clear()
        return out

    def flush(self) -> list[DeadLetter]:
        """End of input: apply every held record and judge everything still
        waiting for its grace window. Returns the dead letters that caused."""
        letters: list[DeadLetter] = []
        for cs in self.clusters.values():
            self._judge_due(cs, None, letters)
        return letters

    def pending_count(self) -> int:
        """Judgments and held records waiting for the watermark."""
        return sum(len(cs.pending) + cs.held_count() for cs in self.clusters.values())

    def keep_pending_apart(self, cluster: str, stored: Iterable[PendingJudgment]) -> None:
        """From now on pickles of this detector leave ``cluster``'s pending
        judgments out, for a store that keeps them apart and writes what
        :meth:`pending_changes` reports. ``stored``: the judgments that store
        holds, queued again here. Judgments already queued (restored from a
        snapshot that carried them) are not in the store yet: the first
        :meth:`pending_changes` reports them as scheduled."""
        cs = self.cluster(cluster)
        assert cs.journal is None, f"{cluster}: pending judgments already kept apart"
        journal = _Journal(pushed=list(cs.pending))
        for due_ms, ts_ms, arrival, judge, event, facts in stored:
            cs.pending.append((due_ms, ts_ms, arrival, partial(judge, cs, event, *facts)))
        heapq.heapify(cs.pending)
        cs.journal = journal

    def pending_changes(self, cluster: str) -> PendingChanges:
        """The judgments of ``cluster`` scheduled since the last call (or since
        :meth:`keep_pending_apart`) and still waiting, and the arrivals of those
        decided since then that were scheduled before. A judgment both scheduled
        and decided in between appears in neither."""
        cs = self.clusters[cluster]
        journal = cs.journal
        assert journal is not None, f"{cluster}: pending judgments are not kept apart"
        cs.journal = _Journal()
        decided = set(journal.popped)
        pushed = {entry[2] for entry in journal.pushed}
        return PendingChanges(
            [_plain(entry) for entry in journal.pushed if entry[2] not in decided],
            [arrival for arrival in journal.popped if arrival not in pushed],
        )

    def _release(self, cs: _Cluster, watermark_ms: float | None, letters: list[DeadLetter]) -> None:
        """Apply the held records of the offset-ordered logs that are due."""
        for log in (cs.metadata_log, cs.remote_log):
            held = log.held_count()
            if held >= BULK_RELEASE:
                # A burst held together (a large cluster's snapshot) comes due together:
                # applying it makes a million objects and no reference cycles, and the
                # collections those objects trigger would walk all of them again and
                # again (docs/performance.md, "A million partitions' records applied").
                with collector_paused():
                    self._apply_ready(cs, log, watermark_ms, letters)
            elif held:
                self._apply_ready(cs, log, watermark_ms, letters)

    def _apply_ready(
        self,
        cs: _Cluster,
        log: OffsetOrder | PartitionedOffsetOrder,
        watermark_ms: float | None,
        letters: list[DeadLetter],
    ) -> None:
        for env in log.ready(watermark_ms):
            # Held records lost the routing's word on their home: recompute it.
            self._process(cs, env, letters, cs.bucket.is_home(env))

    def _judge_due(self, cs: _Cluster, watermark_ms: float | None, letters: list[DeadLetter]) -> None:
        self._release(cs, None if watermark_ms is None else cs.release_ms(), letters)
        pending, journal = cs.pending, cs.journal
        while pending and (watermark_ms is None or pending[0][0] <= watermark_ms):
            _, ts_ms, arrival, judgment = heapq.heappop(pending)
            if journal is not None:
                journal.popped.append(arrival)
            if watermark_ms is not None and cs.measures_clocks:
                # The node's offset was measured again since: its verdict may need later records.
                assert isinstance(judgment, partial)
                due = self.due_ms(cs, judgment.args[1])
                if due > watermark_ms:
                    self._arrivals += 1
                    entry: tuple[int, int, int, Judgment] = (due, ts_ms, self._arrivals, judgment)
                    heapq.heappush(pending, entry)
                    if journal is not None:
                        journal.pushed.append(entry)
                    continue
            try:
                assert isinstance(judgment, partial)
                if self.fast_path and nothing_to_judge(cs, judgment):
                    continue  # an everyday Produce or Fetch (detectors.fast_path)
                if judgment.func in rules.CLOCK_WINDOWED and cs.measures_clocks:
                    cs.judge(judgment, judgment.args[1])
                else:
                    judgment()
            except Unverified as exc:
                cs.unverified(exc.reason)
        if watermark_ms is not None:
            cs.recent_ids.forget(watermark_ms)
        if watermark_ms is not None and watermark_ms - cs.expired_at_ms > self.config.retention_ms:
            expiry = int(watermark_ms)
            cs.expired_at_ms = expiry
            cs.view.expire(expiry)
            cs.quorum.prune(expiry - self.config.retention_ms - 2 * self.config.quorum_fetch_timeout_ms)
            cs.remote.forget_deleted(expiry - self.config.retention_ms)

    # ---- per-kind handling -----------------------------------------------------------

    def _clock_evidence(self, cs: _Cluster, env: Envelope, home: bool) -> list[DeadLetter]:
        """Bounds the cluster's other buckets measured (detectors.clock_exchange):
        no event of the cluster, so neither counted nor part of its progress."""
        try:
            clock_exchange.apply(cs, env)
        except BadRecord as exc:
            if not home:
                return []
            letter = exc.dead_letter(env.position)
            self.dead_letter(letter)
            return [letter]
        return []

    def _dispatch(self, cs: _Cluster, env: Envelope, home: bool) -> list[Deferred]:
        kind = env.kind
        if kind == "metadata":
            if home:
                self.counters.bump(self.counters.events, "metadata")
            raw = env
            placed = self._place_metadata(cs, env) if cs.measures_clocks else env.ts_ms
            if placed != env.ts_ms:
                env = Envelope(
                    env.cluster, env.node, placed, env.kind, env.offset, env.body, env.position, env.seq
                )
            if env.body.get("type") == LEADER_CHANGE:
                # Fanned out like every cluster-wide record (detectors.buckets), it
                # takes its offset in each bucket's log; its home, bucket 0, judges it.
                return rules.quorum.ingest_leader_change(cs, env) if home else []
            if env.body.get("type") == KRAFT_VOTERS:
                return rules.quorum.ingest_voters(cs, env) if home else []
            change = cs.view.apply(env)
            if change is not None:
                # A record stamped before its predecessor was written no later than
                # placed and no earlier than its own stamp (MetadataClock.place).
                _note_created(cs, change, min(env.ts_ms, raw.ts_ms + cs.metadata_clock.shift_ms))
                # Alerts keep the record's own time, as the log has it.
                rules.isr.judge_change(cs, replace(change, env=raw) if raw is not env else change)
            return []
        if kind == "request":
            return self._request(cs, env, home)
        # Quorum and remote log records are never copied to several buckets.
        if kind == "quorum_state":
            self.counters.bump(self.counters.events, "quorum_state")
            return rules.quorum.ingest_state(cs, env)
        self.counters.bump(self.counters.events, "remote_log_metadata")
        return rules.remote.ingest(cs, env)

    def _place_metadata(self, cs: _Cluster, env: Envelope) -> int:
        """The metadata record's time on the log's continuous clock; a step of
        that clock, or a new controller taking over the log, loosens the
        clock evidence from before (ClockBook.rebased)."""
        clock = cs.metadata_clock
        shift = clock.shift_ms
        body = env.body
        kind = body.get("type")
        # Told first: a controller back in office resumes its shift (MetadataClock.took_over).
        took_over = kind == LEADER_CHANGE and _took_over(clock, body)
        before_ms = None if clock.last_raw_ms is None else clock.last_raw_ms + shift
        placed = clock.place(env.ts_ms, env.offset, kind == "NO_OP_RECORD", took_over)
        moved = clock.shift_ms - shift
        if took_over:
            # The new controller's clock may be off the old one's by anything the
            # election's silence hid, which is placed as a silence: a real
            # fail-over's (MetadataClock._place), or a step forward, or both
            # (ClockBook.taken_over).
            longest = max(clock.gaps, default=0)
            silence = 0 if before_ms is None else max(0, placed - before_ms - longest)
            cs.clocks.taken_over(placed, clock.step_margin_ms(), silence)
        elif moved:
            # A step forward (the time moved back) may have been a silence
            # instead, as long as the step: bounds from before allow both.
            cs.clocks.rebased(placed, clock.step_margin_ms(), max(0, -moved))
        if took_over or moved:
            # Every source's time in the log's clock moved with the evidence: a
            # watermark worked out before is of the frame that ended, up to the
            # step ahead of this one, and refused its first requests as too late
            # (a fail-over after a 5 s silence: the new controller's AlterPartition).
            self._refresh_watermark(cs, None)
        return placed

    def _request(self, cs: _Cluster, env: Envelope, home: bool) -> list[Deferred]:
        h = header(env.body)
        if env.node is not None and cs.measures_clocks:
            cs.clocks.saw(env.node, env.ts_ms)
        if home:
            self.counters.bump(self.counters.events, _REQUEST_EVENT_KEYS.get(h.api_key, "request:unchecked"))
        body = env.body
        owned = cs.bucket.owned
        if h.api_key == PRODUCE:
            acks = get_int(get_obj(body, "request", "body"), "acks", "body.request", bounds=INT16)
            outcomes = owned(partition_outcomes(PRODUCE, body))
            _note_known_epochs(cs, env, outcomes)
            return [(rules.produce.judge, (h, acks, outcomes))]
        if h.api_key == FETCH and is_quorum_fetch(body):
            return rules.quorum.ingest_request(cs, env, h)
        if h.api_key in (FETCH, LIST_OFFSETS, OFFSET_FOR_LEADER_EPOCH):
            outcomes = owned(partition_outcomes(h.api_key, body))
            _note_known_epochs(cs, env, outcomes)
            judged = rules.fetch.judged(list(outcomes))
            return [(rules.fetch.judge, (h, judged))] if judged else []
        if h.api_key == STOP_REPLICA:
            request = _decoded(cs, stop_replica, body, h.api_version)
            if request.error == 0:
                # Every bucket receives StopReplica: the epoch is the broker's, for all its partitions.
                self._accepted_controller_epoch(cs, env, request.controller_epoch)
            if cs.bucket.count > 1:
                mine = owned(request.partitions)
                if not home and not mine:
                    # A copy sent for the controller epoch alone: no partition of it is this
                    # bucket's, and the epoch is judged at home, so there is nothing to judge.
                    return []
                request = replace(request, partitions=tuple(mine))
            _note_stop_replica(cs, env, request)
            return [(rules.stop_replica.judge, (h, request, home))]
        if h.api_key == LEADER_AND_ISR:
            self._leader_and_isr(cs, env, h)
            return []
        if h.api_key == UPDATE_METADATA:
            # Kafka's ReplicaManager.maybeUpdateMetadataCache takes the controller epoch of an
            # UpdateMetadata it accepts, as stopReplicas does: StopReplica is then held to it.
            controller_epoch, error = _decoded(cs, update_metadata, body)
            if error == 0:
                self._accepted_controller_epoch(cs, env, controller_epoch)
            return []
        if h.api_key == ALTER_PARTITION:
            alter = alter_partition(body)
            _note_alter_partition(cs, env, alter)
            return [(rules.alter_partition.judge, (h, alter, home))]
        if h.api_key in (VOTE, BEGIN_QUORUM_EPOCH, END_QUORUM_EPOCH):
            return rules.quorum.ingest_request(cs, env, h)
        if h.api_key == BROKER_HEARTBEAT:
            # Every bucket receives it: how far its broker had applied the metadata log.
            cs.heard_heartbeat(env, _decoded(cs, broker_heartbeat, body))
        return []

    def _accepted_controller_epoch(self, cs: _Cluster, env: Envelope, epoch: int) -> None:
        node = env.node
        assert node is not None
        history = cs.controller_epochs.get(node)
        if history is not None and epoch <= history.latest[0]:
            return  # the epoch every copy in every bucket repeats, most of the time
        evidence = Evidence.of("view", env, f"broker {node} accepted controller epoch {epoch}")
        if history is None:
            cs.controller_epochs[node] = History(env.ts_ms, (epoch, evidence))
        else:
            history.prune(env.ts_ms - self.config.retention_ms)
            history.append(env.ts_ms, (epoch, evidence))

    def _leader_and_isr(self, cs: _Cluster, env: Envelope, h: Header) -> None:
        """ZooKeeper mode: an accepted LeaderAndIsr is the epoch source where no
        metadata log is shipped."""
        controller_epoch, error, partitions = _decoded(cs, leader_and_isr, env.body)
        if error != 0:
            return
        self._accepted_controller_epoch(cs, env, controller_epoch)
        if cs.metadata_log.started():
            return  # the metadata log is authoritative
        for p in partitions:
            if p.error != 0 or not cs.bucket.owns(p.partition):
                continue
            key = own_topic_key(p.topic, p.topic_id)
            state = PartitionState(
                leader=p.leader,
                leader_epoch=p.leader_epoch,
                partition_epoch=p.partition_epoch,
                isr=p.isr,
                replicas=p.replicas,
                elr=(),
                source=Evidence.of(
                    "view", env, f"LeaderAndIsr {p.topic}-{p.partition} epoch {p.leader_epoch}"
                ),
            )
            cs.view.set_partition_from_request((key, p.partition), p.topic, env.ts_ms, state)


def _decoded(cs: ClusterState, decode: Callable[..., T], body: dict[str, Any], *args: Any) -> T:
    """``decode(*args, body)`` of a request every bucket receives: once for all
    the buckets of a process when the cluster is split (requests.decoded_once)."""
    return decoded_once(decode, body, *args) if cs.bucket.count > 1 else decode(*args, body)


# ---- clock evidence (detectors.clocks) ------------------------------------------------


def _took_over(clock: MetadataClock, body: dict[str, Any]) -> bool:
    """Whether a LeaderChange record hands the log to another controller's
    clock (MetadataClock.took_over); a record too malformed to tell is left to
    the quorum rule, which dead-letters it with the reason."""
    try:
        epoch, leader = rules.quorum.leader_change(body)
    except BadRecord:
        return False
    return clock.took_over(epoch, leader)


def _note_created(cs: ClusterState, change: PartitionChange, earliest_ms: int) -> None:
    """The epochs a metadata record created, written between ``earliest_ms`` and
    its placed time. A snapshot's PARTITION_RECORD that re-states a partition
    (partition epoch above 0) created nothing: its epochs are older than the record."""
    if not cs.measures_clocks:
        return
    before, after = change.before, change.after
    ts_ms = change.env.ts_ms
    created: list[tuple[str, int]] = []
    if before is None:
        if after.partition_epoch == 0:
            created = [("L", after.leader_epoch), ("P", 0)]
    else:
        if after.leader_epoch != before.leader_epoch:
            created.append(("L", after.leader_epoch))
        if after.partition_epoch != before.partition_epoch:
            created.append(("P", after.partition_epoch))
    if not created:
        return
    # Requests name a topic by id or, before Kafka's topic ids reached them, by name.
    topic_id, index = change.key
    name = cs.view.topic_name(topic_id)
    keys = [change.key] if name is None else [change.key, (own_topic_key(name, None), index)]
    for key in keys:
        for kind, epoch in created:
            cs.clocks.created_epoch((key, kind, epoch), earliest_ms, ts_ms)


def _arrival(env: Envelope) -> int:
    return env.ts_ms - handling_ms(env)


def _note_step_back(cs: ClusterState, env: Envelope) -> None:
    """A request line refused as too late may be the first sign that its
    node's clock stepped back (ClockBook.refused): after a step back longer
    than the grace window, the requests are too late by the clock of before.
    Only Produce and Fetch-like requests are read, most of a broker's log."""
    node = env.node
    try:
        api_key = header(env.body).api_key
        if node is None or api_key not in (PRODUCE, FETCH, LIST_OFFSETS, OFFSET_FOR_LEADER_EPOCH):
            return
        if api_key == FETCH and is_quorum_fetch(env.body):
            return
        outcomes = partition_outcomes(api_key, env.body)
    except BadRecord:
        return  # refused all the same: what it says is not read
    refs = [
        ((own_topic_key(o.topic, o.topic_id), o.partition), "L", o.epoch)
        for o in outcomes
        if o.epoch >= 0 and o.error != KafkaError.UNKNOWN_LEADER_EPOCH
    ]
    cs.clocks.refused(node, _arrival(env), refs)


def _note_known_epochs(cs: ClusterState, env: Envelope, outcomes: Sequence[PartitionOutcome]) -> None:
    """Every leader epoch a client stated: it had learned it, so the epoch existed.
    An UNKNOWN_LEADER_EPOCH answer is left out: the broker had not heard of the
    epoch, which is what a guessed one (a probe's future epoch) looks like."""
    node = env.node
    if node is None or not cs.measures_clocks:
        return
    arrival = _arrival(env)
    knows = cs.clocks.knows
    for outcome in outcomes:
        if outcome.epoch >= 0 and outcome.error != KafkaError.UNKNOWN_LEADER_EPOCH:
            partition = (own_topic_key(outcome.topic, outcome.topic_id), outcome.partition)
            knows(node, arrival, (partition, "L", outcome.epoch))


def _note_stop_replica(cs: ClusterState, env: Envelope, request: StopReplica) -> None:
    """The controller that sent a StopReplica knew the leader epochs it names
    (``request``: this bucket's partitions of it, whose records the bucket has)."""
    node = env.node
    if node is None or not cs.measures_clocks:
        return
    arrival = _arrival(env)
    for part in request.partitions:
        if part.leader_epoch >= 0:
            cs.clocks.knows(
                node, arrival, ((own_topic_key(part.topic, None), part.partition), "L", part.leader_epoch)
            )


def _note_alter_partition(cs: ClusterState, env: Envelope, request: AlterPartition) -> None:
    """An AlterPartition's leader knew the epochs it names; the change the
    controller accepted was written while handling it, after it arrived."""
    node = env.node
    if node is None or not cs.measures_clocks:
        return
    arrival = _arrival(env)
    # A copy in another bucket notes that bucket's partitions (detectors.buckets).
    for entry in cs.bucket.owned(request.partitions):
        partition = (own_topic_key(entry.topic, entry.topic_id), entry.partition)
        if entry.leader_epoch >= 0:
            cs.clocks.knows(node, arrival, (partition, "L", entry.leader_epoch))
        if entry.partition_epoch >= 0:
            cs.clocks.knows(node, arrival, (partition, "P", entry.partition_epoch))
        if (
            entry.error == KafkaError.NONE
            and request.error == KafkaError.NONE
            and entry.result_partition_epoch > 0
        ):
            cs.clocks.caused(node, arrival, env.ts_ms, (partition, "P", entry.result_partition_epoch))
