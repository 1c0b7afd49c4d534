"""Everything the detector knows about one cluster, and the one place alerts
are made, so every rule produces the same alert shape."""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from types import EllipsisType
from typing import Any

from detectors.alerts import FIRING, Alert, Evidence, make_alert_id
from detectors.buckets import WHOLE, Bucket
from detectors.clocks import ASSUMED, ClockBook, ClockInterval, MetadataClock
from detectors.config import DetectorConfig
from detectors.envelope import Envelope
from detectors.history import History
from detectors.quorum import QuorumView
from detectors.remote import RemoteView
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

    def bump(self, table: dict[Any, int], key: Any) -> None:
        table[key] = table.get(key, 0) + 1

    def alerts_by_rule(self, status: str = FIRING) -> dict[str, int]:
        """Alerts of one status per rule: ``firing`` counts violations,
        ``resolved`` the timer alerts that ended."""
        by_rule: dict[str, int] = {}
        for (rule, _, alert_status), n in self.alerts.items():
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

    def describe(self, key: PartitionKey) -> str:
        """``topic-partition`` with the topic's name where the view knows it."""
        name = self.view.topic_name(key[0]) or key[0].removeprefix("name:")
        return f"{name}-{key[1]}"

    def unverified(self, reason: str) -> None:
        """Count an event that cannot be judged; ``reason`` is an
        :class:`UnverifiedReason`, kept as its plain string value (counters are
        pickled with the detector and exported as metric labels)."""
        self.counters.bump(self.counters.unverified, str(reason))

    def clock(self, env: Envelope, node: int | None = None) -> ClockInterval:
        """The offset interval of the clock that stamped ``env`` (detectors.clocks).
        ``node``: the writer of a remote log metadata record (its broker's clock)."""
        if not self.measures_clocks:
            return ASSUMED
        if env.kind == "remote_log_metadata" and node is not None:
            return self.clocks.interval(node, env.ts_ms)
        if env.kind not in ("request", "quorum_state"):
            return ASSUMED
        return self.clocks.interval(env.node, env.ts_ms)

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
        interval = self.clocks.interval(node, ts_ms)
        if not interval.measured:
            return None if self.measures_clocks else (ts_ms, ts_ms)
        if not math.isfinite(interval.width_ms):
            return None
        width = min(interval.width_ms, self.config.clock_limit_ms)
        earliest = math.floor(ts_ms - interval.high_ms)
        return earliest, math.ceil(earliest + width)

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
    ) -> None:
        """Raise an alert once. ``identity`` names the violation (never a read
        position or wall time): it makes the alert id."""
        topic_key, index = partition_key if partition_key else (None, None)
        topic_id = topic_key if topic_key and not topic_key.startswith("name:") else None
        topic = self.view.topic_name(topic_key) or (
            topic_key.removeprefix("name:") if topic_key and topic_key.startswith("name:") else None
        )
        alert_id = make_alert_id(self.cluster, rule.id, status, topic_key, index, node, *identity)
        if alert_id in self._emitted:
            return
        self._emitted[alert_id] = None
        if len(self._emitted) > REMEMBERED_ALERT_IDS:
            self._emitted.popitem(last=False)
        # A verdict on a partition placed the request among its states by the clock;
        # the violating event stays last.
        interval = self.clock(env) if partition_key is not None else ASSUMED
        clock = (clock_evidence(env, interval),) if interval.measured else ()
        chain = (*evidence, *clock, Evidence.of("violation", env, violation_summary or message))
        alert = Alert(
            alert_id=alert_id,
            rule=rule.id,
            severity=severity or rule.severity,
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
        )
        self.counters.bump(self.counters.alerts, (rule.id, alert.severity, status))
        self.out.append(alert)


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


def clock_evidence(env: Envelope, interval: ClockInterval) -> Evidence:
    """The clock offset interval a verdict on ``env`` allowed for, as evidence."""
    bounds = interval.to_dict()
    low, high = bounds["low_ms"], bounds["high_ms"]
    how = "causal evidence" if interval.low_measured else "the clock slack assumed below the upper bound"
    summary = (
        f"{interval.describe(env.node)} (offset {low}..{high} ms from {interval.evidence} half-seconds "
        f"of evidence, lower bound from {how}): the verdict holds for every offset in it"
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
