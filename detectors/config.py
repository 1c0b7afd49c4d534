"""Detector settings: typed, validated once, shared by replay and the streaming job."""

from __future__ import annotations

from dataclasses import dataclass, fields

# The node of a clock bound that holds for every node not named.
ALL_NODES = -1


@dataclass(frozen=True, slots=True)
class DetectorConfig:
    """How much the detector tolerates before it calls an outcome a violation.

    grace_ms: how long after a change of the authoritative view a broker may
        still act on the previous view (brokers apply metadata asynchronously).
        Rules that compare a broker's behaviour with the view accept any state
        the view held within ``grace_ms`` of the moment the broker acted, that
        moment being every one the node's measured clock offset allows
        (detectors.clocks). Where brokers' heartbeats are read, a broker is
        further held only to the records they show it had applied
        (detectors.applied_metadata).
    lateness_ms: how far out of ``ts_ms`` order one source's events may arrive.
        Judgments wait until every active source's event time (detectors.progress)
        has passed the judged moment plus ``grace_ms`` and this, so every event
        that can change a verdict is in before the verdict is made.
    quorum_fetch_timeout_ms: Kafka's ``quorum.fetch.timeout.ms`` (KIP-595); a
        quorum leader that keeps acting as leader 1.5x this long without fetches
        from a majority is a zombie.
    clock_window_ms: how far back a node's clock evidence counts; older evidence
        may describe a clock that has drifted since.
    clock_slack_ms: how soon after a leader epoch is created the first request
        carrying it reaches a node that serves the partition. A node whose clock
        has no lower bound of its own (a broker: Kafka's logs only show what it
        learned, never what it caused) is taken to be no further behind its
        measured upper bound than this.
    clock_limit_ms: a node whose offset interval is wider than this is "clock
        uncertain": its time-dependent verdicts are counted, not raised.
    idle_ms: a source silent this long (in the other sources' time) is idle and
        stops holding back the others' judgments.
    measure_clocks: measure each node's clock, make the metadata log's time
        continuous across its steps and combine event time per source
        (detectors.clocks, detectors.progress). Off (this class's default, as
        up to f6ae53e), the newest time of any source less the lateness is the
        watermark and every clock is taken to agree with the metadata log's
        within the grace window. Every command turns it on unless told
        ``--no-measure-clocks`` (fencewatch.options). A bucket of the streaming
        job measures from its own partitions' requests and the records every
        bucket receives, so its intervals can be wider than the whole cluster's
        and its judgments wait longer; docs/architecture.md, "Time and clocks".
    clock_bounds: what the user knows of the clocks (``--clock-bound-ms``):
        ``(node, ms)`` pairs, each node's clock within ``ms`` of the metadata
        log's (the active controller's), node ``ALL_NODES`` for every node not
        named. A bound narrows the measured interval; evidence that contradicts
        it wins and is reported (ClusterState.node_interval).
    """

    grace_ms: int = 2000
    lateness_ms: int = 1000
    quorum_fetch_timeout_ms: int = 2000
    clock_window_ms: int = 30_000
    clock_slack_ms: int = 1000
    clock_limit_ms: int = 30_000
    idle_ms: int = 2000
    measure_clocks: bool = False
    clock_bounds: tuple[tuple[int, int], ...] = ()

    def __setstate__(self, state: list[object] | dict[str, object]) -> None:
        """Restore a pickled config (its field values in order); one pickled
        before a setting existed (up to f6ae53e: no clock settings) takes that
        setting's default."""
        values = dict(state) if isinstance(state, dict) else dict(zip(_FIELDS, state, strict=False))
        for name, default in _DEFAULTS.items():
            object.__setattr__(self, name, values.get(name, default))

    def __post_init__(self) -> None:
        for name in (
            "grace_ms",
            "lateness_ms",
            "quorum_fetch_timeout_ms",
            "clock_window_ms",
            "clock_slack_ms",
            "clock_limit_ms",
            "idle_ms",
        ):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ValueError(f"{name} must be a non-negative integer of milliseconds, got {value!r}")
        for pair in self.clock_bounds:
            if (
                not isinstance(pair, tuple)
                or len(pair) != 2
                or not all(isinstance(v, int) and not isinstance(v, bool) for v in pair)
                or pair[0] < ALL_NODES
                or pair[1] < 0
            ):
                raise ValueError(f"clock_bounds must hold (node, non-negative ms) pairs, got {pair!r}")

    def clock_bound_of(self, node: int) -> int | None:
        """The bound the user gave on ``node``'s clock, or on every node's; None if none."""
        every = None
        for named, ms in self.clock_bounds:
            if named == node:
                return ms
            if named == ALL_NODES:
                every = ms
        return every

    @property
    def judge_delay_ms(self) -> int:
        """How long after its ``ts_ms`` an event is judged, in event time, for a
        node whose clock agrees with the metadata log's."""
        return self.grace_ms + self.lateness_ms

    @property
    def retention_ms(self) -> int:
        """How much view history is kept behind the newest record for judgments:
        a judgment waits until the latest moment its node's clock interval allows
        plus the grace window and the lateness, and reads back to the earliest
        moment less the grace window; the widest interval still judged is
        ``clock_limit_ms``; sources may be ``idle_ms`` apart before the slowest
        stops holding the others back."""
        return 3 * self.grace_ms + 2 * self.lateness_ms + self.clock_limit_ms + self.idle_ms


_DEFAULTS = {f.name: f.default for f in fields(DetectorConfig)}
_FIELDS = tuple(_DEFAULTS)
