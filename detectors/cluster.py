"""Everything the detector knows about one cluster, and the one place alerts
are made, so every rule produces the same alert shape."""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from types import EllipsisType
from typing import Any

from detectors.alerts import (
    CERTAIN,
    FIRING,
    POSSIBLE,
    POSSIBLE_SEVERITY,
    Alert,
    ClockCondition,
    Evidence,
    make_alert_id,
)
from detectors.applied_metadata import AppliedMetadata, superseding_offset
from detectors.buckets import WHOLE, Bucket
from detectors.clocks import ASSUMED, ClockBook, ClockInterval, MetadataClock
from detectors.config import DetectorConfig
from detectors.envelope import Envelope, Unverified
from detectors.errors import KafkaError
from detectors.history import History, watching_changes
from detectors.quorum import QuorumView
from detectors.remote import RemoteView
from detectors.requests import BrokerHeartbeat
from detectors.rules.base import Rule
from detectors.stats import UnverifiedReason
from detectors.view import NULL_TOPIC_ID, ClusterView, PartitionKey, PartitionState

# Alert ids remembered to suppress a second report of the same violation (the
# same fact seen from two sources, or a re-shipped event). Alerts are rare, so
# this bounds memory only for a cluster that is failing badly.
REMEMBERED_ALERT_IDS = 100_000


@dataclass
class Counters:
    """What happened to the events, for the summary and for metrics."""

    events: dict[str, int] = field(default_factory=dict)
    unverified: dict[str, int] = field(default_factory=dict)  # by UnverifiedReason value
    duplicates: int = 0
    late: int = 0
    dead_letters: dict[str, int] = field(default_factory=dict)  # by DeadLetterClass value
    alerts: dict[tuple[str, str, str], int] = field(default_factory=dict)  # (rule, severity, status)
    # Possible violations (detectors.alerts.POSSIBLE), apart: ``alerts`` keeps the certain ones.
    possible: dict[tuple[str, str, str], int] = field(default_factory=dict)

    def __setstate__(self, state: dict[str, Any]) -> None:
        # Counters pickled before possible violations were raised had none.
        self.__dict__.update(state)
        self.__dict__.setdefault("possible", {})

    def bump(self, table: dict[Any, int], key: Any) -> None:
        table[key] = table.get(key, 0) + 1

    def alerts_by_rule(self, status: str = FIRING, confidence: str = CERTAIN) -> dict[str, int]:
        """Alerts of one status per rule: ``firing`` counts violations,
        ``resolved`` the timer alerts that ended; certain ones, or possible ones."""
        by_rule: dict[str, int] = {}
        table = self.alerts if confidence == CERTAIN else self.possible
        for (rule, _, alert_status), n in table.items():
            if alert_status == status:
                by_rule[rule] = by_rule.get(rule, 0) + n
        return by_rule


class ClusterState:
    def __init__(
        self,
        cluster: str,
        config: DetectorConfig,
        counters: Counters,
        now_ms: Callable[[], int],
        bucket: Bucket = WHOLE,
    ):
        """``bucket``: the part of the cluster's partitions this state judges
        (detectors.buckets); by default all of them."""
        self.cluster = cluster
        self.bucket = bucket
        self.config = config
        self.counters = counters
        self.now_ms = now_ms
        self.view = ClusterView(config.retention_ms)
        self.quorum = QuorumView()
        self.remote = RemoteView()
        self.clocks = new_clock_book(config)
        # The metadata log's time made continuous across its writers' clocks.
        self.metadata_clock = MetadataClock()
        self.measures_clocks = config.measure_clocks
        # Newest controller epoch each broker accepted (StopReplica / LeaderAndIsr / UpdateMetadata).
        self.controller_epochs: dict[int, History[tuple[int, Evidence]]] = {}
        self.out: list[Alert] = []
        self._emitted: OrderedDict[str, None] = OrderedDict()
        # Nodes whose clock evidence contradicts the bound the user gave
        # (DetectorConfig.clock_bounds): node -> [its measured low, high, the bound].
        self.bound_contradicted: dict[int, list[float]] = {}

    # While a verdict is looked into at one clock offset after another (judge):
    # the request, its offset pinned, and what its rules would raise there.
    _probe: _Probe | None = None
    # How far each broker's heartbeats said it had applied the metadata log
    # (detectors.applied_metadata); None until the first heartbeat is read (and
    # in states pickled before they were), while the grace window alone bounds
    # how late a broker applies metadata.
    applied: AppliedMetadata | None = None

    def describe(self, key: PartitionKey) -> str:
        """``topic-partition`` with the topic's name where the view knows it."""
        name = self.view.topic_name(key[0]) or key[0].removeprefix("name:")
        return f"{name}-{key[1]}"

    def unverified(self, reason: str) -> None:
        """Count an event that cannot be judged; ``reason`` is an
        :class:`UnverifiedReason`, kept as its plain string value (counters are
        pickled with the detector and exported as metric labels)."""
        if self._probe is None or self._probe.offset_ms is None:
            self.counters.bump(self.counters.unverified, str(reason))

    def clock(self, env: Envelope, node: int | None = None) -> ClockInterval:
        """The offset interval of the clock that stamped ``env`` (detectors.clocks).
        ``node``: the writer of a remote log metadata record (its broker's clock)."""
        if not self.measures_clocks:
            return ASSUMED
        probe = self._probe
        if probe is not None and probe.offset_ms is not None and env is probe.env:
            return ClockInterval(probe.offset_ms, probe.offset_ms, measured=True, low_measured=True)
        if env.kind == "remote_log_metadata" and node is not None:
            return self.node_interval(node, env.ts_ms)
        if env.kind not in ("request", "quorum_state"):
            return ASSUMED
        return self.node_interval(env.node, env.ts_ms)

    def node_interval(self, node: int | None, ts_ms: int) -> ClockInterval:
        """``node``'s measured offset interval at its time ``ts_ms``
        (ClockBook.interval), narrowed by the bound the user gave for its clock
        (``--clock-bound-ms``: against the clock that stamps the metadata log
        now, the active controller's). Evidence that contradicts the bound (no
        offset within it) wins, and the node is noted in ``bound_contradicted``:
        the bound is wrong or the clock broke, and a wrong bound trusted would
        make verdicts certain that are not."""
        interval = self.clocks.interval(node, ts_ms)
        if node is None or not interval.measured or not self.config.clock_bounds:
            return interval
        bound = self.config.clock_bound_of(node)
        if bound is None:
            return interval
        shift = self.metadata_clock.shift_ms
        low, high = -bound - shift, bound - shift
        if interval.low_ms > high or interval.high_ms < low:
            self.bound_contradicted[node] = [interval.low_ms + shift, interval.high_ms + shift, bound]
            return interval
        if low <= interval.low_ms and interval.high_ms <= high:
            return interval
        return replace(
            interval,
            low_ms=max(interval.low_ms, low),
            high_ms=min(interval.high_ms, high),
            low_measured=interval.low_measured or low > interval.low_ms,
        )

    def moment(self, env: Envelope) -> tuple[int, int]:
        """The earliest and latest moments of the metadata log's clock at which
        ``env``'s node may have acted (no wider than ``clock_limit_ms`` allows)."""
        interval = self.clock(env)
        if not interval.measured or not math.isfinite(interval.width_ms):
            return env.ts_ms, env.ts_ms
        width = min(interval.width_ms, self.config.clock_limit_ms)
        took = handling_ms(env)
        earliest = math.floor(env.ts_ms - took - interval.high_ms)
        return earliest, math.ceil(earliest + took + width)

    def placed(self, node: int | None, ts_ms: int) -> tuple[int, int] | None:
        """The earliest and latest moments of the metadata log's clock at which
        ``node``'s record stamped ``ts_ms`` by its own clock may have happened, by
        what is known of that clock now (evidence from after the record too).
        None while this state measures clocks and has no measure of that one:
        then no moment is more plausible than another."""
        interval = self.node_interval(node, ts_ms)
        if not interval.measured:
            return None if self.measures_clocks else (ts_ms, ts_ms)
        if not math.isfinite(interval.width_ms):
            return None
        width = min(interval.width_ms, self.config.clock_limit_ms)
        earliest = math.floor(ts_ms - interval.high_ms)
        return earliest, math.ceil(earliest + width)

    def written_twice(self, node: int | None, ts_ms: int) -> bool:
        """Whether ``node``'s clock stepped back over its time ``ts_ms``: its log
        holds that time from before the step and from after it, so two of its
        records there cannot be ordered by their times (EvidenceLine.blind)."""
        line = self.clocks.lines.get(node) if node is not None and self.measures_clocks else None
        return line is not None and line.segment(ts_ms) is None

    def judged_window(self, env: Envelope, node: int | None = None) -> tuple[int, int] | None:
        """The metadata log's times within the grace window of some moment at which
        ``env``'s node may have acted: between the request's arrival at the
        earliest offset its node's clock interval allows and its completion at
        the latest. None (counted as "clock uncertain") when the interval is wider
        than ``clock_limit_ms``. A node without clock evidence is taken to agree
        with the metadata log, the grace window its only tolerance."""
        window = self.window_of(env, node)
        if window is None:
            self.unverified(UnverifiedReason.CLOCK_UNCERTAIN)
        return window

    def window_of(self, env: Envelope, node: int | None = None) -> tuple[int, int] | None:
        """:meth:`judged_window` without counting: every partition of one
        request is judged in the same window, looked up once."""
        grace = self.config.grace_ms
        interval = self.clock(env, node)
        if not interval.measured:
            return env.ts_ms - grace, env.ts_ms + grace
        if interval.width_ms > self.config.clock_limit_ms:
            return None
        arrival = env.ts_ms - handling_ms(env)
        return math.floor(arrival - interval.high_ms) - grace, math.ceil(env.ts_ms - interval.low_ms) + grace

    def controller_handled(self, env: Envelope) -> tuple[int, int]:
        """The metadata log's times between which the active controller that
        logged ``env`` handled it (arrival, completion). It writes the log, so
        its request lines and its records carry one clock: the shift the log's
        time had while it wrote places them exactly, whatever its interval
        (MetadataClock.shift_of)."""
        shift = self.metadata_clock.shift_of(env.node, env.ts_ms) if self.measures_clocks else 0
        return env.ts_ms - handling_ms(env) + shift, env.ts_ms + shift

    def heard_heartbeat(self, env: Envelope, heartbeat: BrokerHeartbeat) -> None:
        """A BrokerHeartbeat the active controller answered: its broker had
        applied the metadata log up to ``currentMetadataOffset`` by the moment
        it arrived (detectors.applied_metadata). Only an answer without error
        is read: the active controller handled it (QuorumController.processBrokerHeartbeat),
        the node whose clock writes the log, so its arrival is placed exactly."""
        if heartbeat.error != KafkaError.NONE:
            return
        if self.applied is None:
            self.applied = AppliedMetadata(self.config.retention_ms)
        offset = heartbeat.current_metadata_offset
        # What the broker asked for says where it stood (BrokerLifecycleManager:
        # wantFence until it is ready to be unfenced, wantShutDown in controlled shutdown).
        asked = "".join(
            f", {what}"
            for what, wanted in (
                ("wanting to stay fenced", heartbeat.want_fence),
                ("in controlled shutdown", heartbeat.want_shut_down),
            )
            if wanted
        )
        summary = (
            f"broker {heartbeat.broker_id} (epoch {heartbeat.broker_epoch}{asked}) had applied the metadata "
            f"log up to offset {offset} (its BrokerHeartbeat to controller {env.node})"
        )
        self.applied.heard(
            heartbeat.broker_id, self.controller_handled(env)[0], offset, Evidence.of("view", env, summary)
        )

    def metadata_applied(
        self,
        env: Envelope,
        node: int | None,
        key: PartitionKey,
        first: PartitionState,
        stale: Callable[[PartitionState], bool],
    ) -> list[Evidence] | None:
        """Whether ``node``, acting on ``env`` on a state that every state of
        its window from ``first`` on superseded (``stale`` of each holds), had
        applied the record that superseded it: the heartbeat that shows it, as
        evidence; [] where no heartbeat was read at all (the grace window
        alone decides, as it did before heartbeats were read); None, counted
        unverified, where its heartbeats by the earliest moment it may have
        acted do not show it (it may have been seconds behind: a pause, a
        restart). A verdict that depends on this is certain only with the
        evidence; at single clock offsets (judge) it may still hold as possible."""
        applied = self.applied
        if applied is None:
            return []
        history = self.view.partition(key)
        needed = superseding_offset(history, first, stale) if history is not None else None
        report = applied.applied_by(node, self.earliest_moment(env, node))
        if needed is None or report is None or report[0] < needed:
            self.unverified(UnverifiedReason.BROKER_METADATA_BEHIND)
            return None
        return [report[1]]

    def earliest_moment(self, env: Envelope, node: int | None = None) -> int:
        """The earliest moment of the metadata log's clock at which ``env``'s node
        may have started acting on it (a request's arrival), by its clock interval
        (``node``: as :meth:`clock`)."""
        start = env.ts_ms - handling_ms(env)
        interval = self.clock(env, node)
        if not interval.measured or not math.isfinite(interval.high_ms):
            return start
        return math.floor(start - interval.high_ms)

    def partition_window(
        self,
        topic: str | None,
        topic_id: str | None,
        index: int,
        env: Envelope,
        node: int | None = None,
        window: tuple[int, int] | EllipsisType | None = ...,
    ) -> tuple[PartitionKey, list[PartitionState]] | None:
        """The partition's states within the grace window around the moment
        ``env`` was handled (:meth:`judged_window`; ``window``: what
        :meth:`window_of` gave, if asked already), or None (counted as
        unverified) when the view does not know the partition or the moment
        is too uncertain."""
        if window is ...:
            window = self.window_of(env, node)
        if (topic_id and topic_id != NULL_TOPIC_ID) or window is None:
            key = self.view.resolve_topic(topic, topic_id, env.ts_ms)
        else:
            # A name names the topic it named when the request was handled: at
            # a moment of the metadata log's clock between the window's ends
            # less the grace. A request of a node 3 s behind about a topic
            # created less than 3 s before it was stamped named that topic,
            # though its own time comes before the topic's record (the request
            # lines of a simulated cluster whose controller ran 3 s ahead: 16%
            # unverified as unknown partitions, every topic's first 3 s).
            grace = self.config.grace_ms
            latest = self.view.resolve_topic(topic, None, window[1] - grace)
            # Unmeasured, the window is one moment's: the name is looked up once.
            earliest = (
                latest
                if window[0] + grace == window[1] - grace
                else self.view.resolve_topic(topic, None, window[0] + grace)
            )
            if earliest is not None and latest is not None and earliest != latest:
                # Deleted and created again within the clock's uncertainty: two topics had the name.
                self.unverified(UnverifiedReason.CLOCK_UNCERTAIN)
                return None
            key = earliest if latest is None else latest
        history = self.view.partition((key, index)) if key else None
        if history is None:
            self.unverified(UnverifiedReason.UNKNOWN_PARTITION)
            return None
        if window is None:
            self.unverified(UnverifiedReason.CLOCK_UNCERTAIN)
            return None
        states = history.window(*window)
        if not states:
            self.unverified(UnverifiedReason.PARTITION_CREATED_AFTER)
            return None
        assert key is not None
        return (key, index), states

    def judge(self, judgment: Callable[[], None], env: Envelope) -> None:
        """Run a judgment of the request ``env`` by rules that judge it over the
        grace windows of every moment its node's clock interval allows
        (rules.CLOCK_WINDOWED). What holds over all of them is certain and
        raised as ever. Where a state changed within them, the verdict may hold
        for some offsets of the interval and not for others: it is made again
        at each offset where what the windows hold changes (the offsets that put
        a change at a window's edge, and the interval's ends), and what holds
        at some but not at all of them is raised as a possible violation, with
        the offsets it holds for (SPEC 1.5). Dropped, as before, such a
        verdict was lost silently where evidence is thin: one broker's request
        log in an incident, its interval seconds wide."""
        interval = self.clock(env) if self.measures_clocks and env.kind == "request" else ASSUMED
        if not interval.measured or not 0 < interval.width_ms <= self.config.clock_limit_ms:
            judgment()  # one offset, or none placed (clock uncertain): nothing to look into
            return
        low, high = math.ceil(interval.low_ms), math.floor(interval.high_ms)
        certain = self._probe = _Probe(env, None)
        try:
            with watching_changes() as changes:
                judgment()
        finally:
            self._probe = None
        window = self.window_of(env)
        if window is None:
            return
        arrival, grace = env.ts_ms - handling_ms(env), self.config.grace_ms
        # A state that took effect at t is in the window of offset o while its
        # start, arrival - o - grace, is before t (o > arrival - grace - t), and
        # the one before it while its end, ts - o + grace, is t or after.
        inside = {t for t in changes if window[0] < t <= window[1]}
        if not inside:
            return  # one state throughout: the same verdict at every offset
        offsets = {low, high}
        for t in inside:
            for edge in (arrival - grace - t, env.ts_ms + grace - t):
                offsets.update(o for o in (edge, edge + 1) if low <= o <= high)
        ordered = sorted(offsets)
        holds: dict[str, set[int]] = {}
        raised: dict[str, dict[str, Any]] = {}
        for offset in ordered:
            probe = self._probe = _Probe(env, offset)
            try:
                judgment()
            except Unverified:
                continue
            finally:
                self._probe = None
            for alert_id, kwargs in probe.fired.items():
                if alert_id not in certain.fired:
                    holds.setdefault(alert_id, set()).add(offset)
                    raised.setdefault(alert_id, kwargs)
        for alert_id, at in holds.items():
            runs = _runs(ordered, at)
            condition = ClockCondition(env.node, (low, high), runs, condition_text(env.node, low, high, runs))
            self.emit(**raised[alert_id], condition=condition)

    def emit(
        self,
        rule: type[Rule],
        env: Envelope,
        *,
        message: str,
        node: int | None,
        identity: Iterable[object],
        evidence: Iterable[Evidence] = (),
        partition_key: PartitionKey | None = None,
        status: str = FIRING,
        severity: str | None = None,
        ts_ms: int | None = None,
        violation_summary: str | None = None,
        condition: ClockCondition | None = None,
    ) -> None:
        """Raise an alert once. ``identity`` names the violation (never a read
        position or wall time): it makes the alert id. ``condition``: the
        clock offsets a possible violation holds for (:meth:`judge`); it is
        raised at POSSIBLE_SEVERITY under an id of its own."""
        topic_key, index = partition_key if partition_key else (None, None)
        topic_id = topic_key if topic_key and not topic_key.startswith("name:") else None
        topic = self.view.topic_name(topic_key) or (
            topic_key.removeprefix("name:") if topic_key and topic_key.startswith("name:") else None
        )
        identity = tuple(identity)
        parts = (self.cluster, rule.id, status, topic_key, index, node, *identity)
        alert_id = make_alert_id(*parts) if condition is None else make_alert_id(*parts, POSSIBLE)
        probe = self._probe
        if probe is not None:
            probe.fired.setdefault(
                alert_id,
                {
                    "rule": rule,
                    "env": env,
                    "message": message,
                    "node": node,
                    "identity": identity,
                    "evidence": tuple(evidence),
                    "partition_key": partition_key,
                    "status": status,
                    "severity": severity,
                    "ts_ms": ts_ms,
                    "violation_summary": violation_summary,
                },
            )
            if probe.offset_ms is not None:
                return  # looked into at one offset: judge raises what holds
        if alert_id in self._emitted:
            return
        self._emitted[alert_id] = None
        if len(self._emitted) > REMEMBERED_ALERT_IDS:
            self._emitted.popitem(last=False)
        # A verdict on a partition placed the request among its states by the clock;
        # the violating event stays last.
        interval = self.clock(env) if partition_key is not None or condition is not None else ASSUMED
        clock = (clock_evidence(env, interval, condition),) if interval.measured else ()
        if condition is not None:
            message = f"{message} (possible: {condition.text})"
        chain = (*evidence, *clock, Evidence.of("violation", env, violation_summary or message))
        alert = Alert(
            alert_id=alert_id,
            rule=rule.id,
            severity=POSSIBLE_SEVERITY if condition is not None else severity or rule.severity,
            status=status,
            cluster=self.cluster,
            topic=topic,
            topic_id=topic_id,
            partition=index,
            node=node,
            ts_ms=env.ts_ms if ts_ms is None else ts_ms,
            detected_ms=self.now_ms(),
            message=message,
            evidence=chain,
            links=rule.links(),
            confidence=CERTAIN if condition is None else POSSIBLE,
            condition=condition,
        )
        table = self.counters.alerts if condition is None else self.counters.possible
        self.counters.bump(table, (rule.id, alert.severity, status))
        self.out.append(alert)


@dataclass
class _Probe:
    """A judgment looked into (ClusterState.judge): at the request ``env``'s
    clock offset ``offset_ms``, or over its whole interval (None), and the
    alerts it raised there, by id, with what raises them."""

    env: Envelope
    offset_ms: int | None
    fired: dict[str, dict[str, Any]] = field(default_factory=dict)


def _runs(offsets: list[int], holding: set[int]) -> tuple[tuple[int, int], ...]:
    """The ranges of ``offsets`` (sorted; each range between two neighbours
    holds one set of states) where a verdict holds: runs of neighbours in ``holding``."""
    runs: list[tuple[int, int]] = []
    start = previous = None
    for offset in offsets:
        if offset in holding:
            start = offset if start is None else start
            previous = offset
        elif start is not None:
            assert previous is not None
            runs.append((start, previous))
            start = None
    if start is not None:
        assert previous is not None
        runs.append((start, previous))
    return tuple(runs)


def _side(offset_ms: int) -> str:
    """``3.2 s ahead of`` / ``0.5 s behind``."""
    seconds = f"{abs(offset_ms) / 1000:.3f}".rstrip("0").rstrip(".")
    return f"{seconds} s ahead of" if offset_ms >= 0 else f"{seconds} s behind"


def condition_text(node: int | None, low: int, high: int, runs: tuple[tuple[int, int], ...]) -> str:
    """The offsets a possible violation holds for, in words: ``holds if node 3's
    clock is at most 3.2 s ahead of the metadata log's (its evidence allows
    -1 s behind .. 5 s ahead of it)``."""
    parts = []
    for a, b in runs:
        if a <= low and b >= high:
            parts.append(f"anywhere from {_side(a)} to {_side(b)}")
        elif a <= low:
            parts.append(f"at most {_side(b)}" if b >= 0 else f"at least {_side(b)}")
        elif b >= high:
            parts.append(f"at least {_side(a)}" if a >= 0 else f"at most {_side(a)}")
        else:
            parts.append(f"between {_side(a)} and {_side(b)}")
    who = f"node {node}'s clock" if node is not None else "the clock"
    return (
        f"holds if {who} is {' or '.join(parts)} the metadata log's "
        f"(its evidence allows {_side(low)} .. {_side(high)} it)"
    )


def handling_ms(env: Envelope) -> int:
    """How long the request took from arrival to the response (the request log's
    ``totalTimeMs``); its line is stamped at the end. Bodies kept for judgments
    carry only this (detectors.envelope.without_body)."""
    total = env.body.get("totalTimeMs")
    # This runs several times per request: the plain float or int JSON gives is
    # told by its type before isinstance's walk (a tuple, not ``int | float``:
    # a union type takes isinstance's slow path).
    if (
        type(total) is float
        or type(total) is int
        or (isinstance(total, (int, float)) and type(total) is not bool)
    ):
        return math.ceil(total) if 0 <= total < 2**31 else 0
    return 0


def clock_evidence(
    env: Envelope, interval: ClockInterval, condition: ClockCondition | None = None
) -> Evidence:
    """The clock offset interval a verdict on ``env`` allowed for, as evidence;
    ``condition``: the offsets a possible verdict holds for."""
    bounds = interval.to_dict()
    low, high = bounds["low_ms"], bounds["high_ms"]
    how = "causal evidence" if interval.low_measured else "the clock slack assumed below the upper bound"
    summary = (
        f"{interval.describe(env.node)} (offset {low}..{high} ms from {interval.evidence} half-seconds "
        f"of evidence, lower bound from {how}): "
        + (
            "the verdict holds for every offset in it"
            if condition is None
            else f"the verdict {condition.text}"
        )
    )
    return Evidence("clock", "clock", env.ts_ms, env.node, None, env.position, summary, low, high)


def new_clock_book(config: DetectorConfig) -> ClockBook:
    return ClockBook(
        window_ms=config.clock_window_ms,
        slack_ms=config.clock_slack_ms,
        ahead_ms=config.grace_ms,
        limit_ms=config.clock_limit_ms,
        back_ms=config.lateness_ms,
    )
