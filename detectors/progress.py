"""Event-time progress per source, combined as Flink combines its splits'
watermarks (``WatermarkOutputMultiplexer``): the minimum over the sources that
are not idle, so one fast clock cannot make the other sources late and one
slow clock is judged, not refused.

A source is one writer with one clock: a node's request log, a node's quorum
state, a cluster's metadata log, its remote log metadata. Its progress is the
newest ``ts_ms`` it wrote, corrected by its node's measured clock offset to the
metadata log's clock (detectors.clocks), at the earliest moment the offset
allows. The metadata log's NoOp records tick its progress while nothing else
changes. Quorum states and remote log metadata are written only when something
happens (a vote, an upload), so they say nothing of progress between their
records: they never hold the others back, and only when no other source is
active does their newest time stand for the cluster's.

A source is idle once the other sources have moved ``idle_ms`` past the point
where its last record arrived (FLIP-471's rule is kept: a log whose records
are held for their offset order is never idle). Idleness is judged by arrival
rather than by the source's own times, so a source whose clock runs far ahead
or behind, but which keeps writing, keeps holding the others back: its
judgments and theirs wait for each other instead of being refused as late.
"""

from __future__ import annotations

from collections.abc import Callable

SourceKey = tuple[str, int]  # (kind, node; -1 for the cluster-wide logs)
# Sources written only when something happens: no record says no time has passed.
SPARSE_KINDS = ("quorum_state", "remote_log_metadata")

# The watermark is worked out again when its slowest source moves, or when the
# newest time moved this much since (idleness and other sources' offsets change it).
_REFRESH_MS = 250


def source_key(kind: str, node: int | None) -> SourceKey:
    if kind in ("metadata", "remote_log_metadata") or node is None:
        return (kind, -1)
    return (kind, node)


class Progress:
    """One cluster's sources and its watermark (in the metadata log's clock)."""

    __slots__ = ("_refreshed_at", "_slowest", "_watermark", "max_ts_ms", "newest", "seen_at")

    def __init__(self) -> None:
        self.newest: dict[SourceKey, int] = {}  # newest ts_ms each source wrote
        self.seen_at: dict[SourceKey, int] = {}  # max_ts_ms when its last record arrived
        self.max_ts_ms: int | None = None  # the newest ts_ms of any source, uncorrected
        self._slowest: SourceKey | None = None
        self._watermark: float | None = None
        self._refreshed_at = -(2**62)

    def observe_newest(self, ts_ms: int) -> bool:
        """Record one event's time, sources aside. True if it is the newest yet."""
        if self.max_ts_ms is None or ts_ms > self.max_ts_ms:
            self.max_ts_ms = ts_ms
            return True
        return False

    def observe(self, key: SourceKey, ts_ms: int) -> bool:
        """Record one event of ``key``. True if the source's progress moved and
        the watermark is to be worked out again (not :meth:`_settled`): asked
        per event, this spares the detector the call to :meth:`watermark`."""
        if self.max_ts_ms is None or ts_ms > self.max_ts_ms:
            self.max_ts_ms = ts_ms
        self.seen_at[key] = self.max_ts_ms
        known = self.newest.get(key)
        if known is not None and ts_ms <= known:
            return False
        self.newest[key] = ts_ms
        return not self._settled(key)

    def _settled(self, moved: SourceKey) -> bool:
        """Whether the watermark stands as last worked out though ``moved``
        progressed: it is not the slowest source, and the newest time has moved
        less than _REFRESH_MS since."""
        return (
            self._watermark is not None
            and moved != self._slowest
            and self.max_ts_ms is not None
            and self.max_ts_ms - self._refreshed_at < _REFRESH_MS
        )

    def watermark(
        self,
        moved: SourceKey | None,
        corrected: Callable[[SourceKey, int], float],
        idle_ms: int,
        metadata_idle_ms: int,
        held: Callable[[SourceKey], bool],
    ) -> float | None:
        """The minimum corrected progress over the sources that are not idle.
        ``moved``: the source whose progress just moved (None: work it out anew).
        The metadata log, the authority every verdict reads, is idle only after
        the longer ``metadata_idle_ms``: a gap in it is more likely its records
        being late (a step of the controller's clock, a slow shipper) than the
        log having nothing to say, since KRaft writes a NoOp every 500 ms."""
        newest_ms = self.max_ts_ms
        if newest_ms is None:
            return None
        if moved is not None and self._settled(moved):
            return self._watermark
        self._refreshed_at = newest_ms
        slowest: SourceKey | None = None
        lowest = 0.0
        sparse: list[tuple[float, SourceKey]] = []
        for key, ts_ms in self.newest.items():
            if key[0] in SPARSE_KINDS:
                sparse.append((corrected(key, ts_ms), key))
                continue
            quiet = newest_ms - self.seen_at[key]
            if quiet > (metadata_idle_ms if key[0] == "metadata" else idle_ms) and not held(key):
                continue
            value = corrected(key, ts_ms)
            if slowest is None or value < lowest:
                slowest, lowest = key, value
        if slowest is None and sparse:
            # Nothing else is writing: the newest of what is (a quorum state, a
            # remote segment) is the only time there is.
            lowest, slowest = max(sparse)
        self._slowest = slowest
        self._watermark = lowest if slowest is not None else None
        return self._watermark
