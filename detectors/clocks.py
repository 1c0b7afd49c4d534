"""Each node's clock, measured against the metadata log's from Kafka's own
causality, as an interval of offsets (node's clock minus the metadata log's).

Kafka fences by epochs, not clocks, so its logs prove orderings, never times
(../shared/CLOCKS.md):

- Knowledge cannot precede creation. A request a node handled that carries
  leader epoch E of a partition (Fetch, ListOffsets, OffsetForLeaderEpoch and
  Produce ``currentLeaderEpoch``, a follower's fetch, StopReplica and
  AlterPartition ``leaderEpoch``) or partition epoch P (AlterPartition) arrived
  after the metadata record that created E or P was appended: whoever sent it
  had learned E. Its arrival (the line's time minus ``totalTimeMs``: Kafka's
  request logger stamps the line when the response is sent,
  ``RequestChannel.updateRequestMetrics``) minus the record's time is an upper
  bound on the node's offset. It holds on a buggy broker too: only the request's
  contents count, never the answer.
- Causation: an AlterPartition the controller answered NONE arrived before the
  PartitionChangeRecord it caused (``ReplicationControlManager`` writes the
  record while handling it), and was answered after it (``QuorumController``
  completes a write only once its records are committed): a lower and an upper
  bound on the controller's offset, as far apart as the request took.

A broker's own log shows only what reached it, never what it caused, so a
broker's offset has no lower bound of its own: it is taken to be at most
``clock_slack_ms`` below the measured upper bound, the assumption being that
some request carrying a new epoch reaches a node soon after the epoch is
created. Busy partitions make that upper bound tight (tens of milliseconds on
the simulator); where it is not, verdicts lean the lenient way (rules judge the
union of every moment the interval allows).

Offsets change: NTP steps the clock, and the metadata log's clock is the active
controller's. Evidence is kept in buckets of node time, and a node's interval at
time t is made from the evidence around t (``clock_window_ms`` back, the grace
window ahead) that agrees with the evidence nearest t: a run of later evidence
more than ``clock_slack_ms`` away from earlier evidence is a step, and evidence
from before a step is not used after it. A node with no evidence at all is
taken to agree with the metadata log (the grace window its only tolerance), and
says so: its interval is ``measured=False``.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Any, overload

from detectors.pickling import fast_pickle

BUCKET_MS = 500
# A node's records of one partition this far apart in its own time, or this far
# back, cut its evidence: its clock may have stepped in between.
GAP_MS = 1000
# The least a step of the metadata log's clock is taken to be misplaced by
# (MetadataClock.step_margin_ms).
STEP_MARGIN_MS = 100
# The (writer, shift) changes of the metadata log's clock kept for placing
# controllers' requests from before the newest (MetadataClock.shift_of).
_HISTORY = 64
# Claims whose record has not been seen are kept this long (node time) for it.
_WAITING_MS = 60_000
# At most this many epochs' records are kept for claims, and as many claims for
# records not seen: the oldest go first. A burst of partitions created at once
# (1M new partitions, 4 epochs each) kept every one for two clock windows, and
# the streaming job pickles a bucket's clocks every micro-batch: 22 MB a bucket,
# the job's JVM out of heap at 1 GB and 15 s batches at 3 GB (docs/performance.md,
# "A burst of created epochs"). An epoch dropped early bounds no clock, which
# leaves a node's interval wider (its verdicts clock uncertain, never false).
MAX_EPOCHS_KEPT = 20_000

# What a claim refers to: ((topic key, partition), "L" leader epoch or "P" partition epoch, epoch).
EpochRef = tuple[tuple[str, int], str, int]
# One bound as a bucket measured it, for the cluster's other buckets
# (ClockBook.take_shared): (node, its time, the record's time, upper, fresh, frame).
SharedBound = tuple[int, int, int, bool, bool, int]
# How far a step of the metadata log's clock moved the bounds of before it:
# upper bounds up, the spread of their estimates, lower bounds down (EvidenceLine.loosen).
Loosening = tuple[int, int, int]


@fast_pickle
@dataclass(frozen=True, slots=True)
class ClockInterval:
    """``node``'s clock minus the metadata log's clock, in ``[low_ms, high_ms]``.

    ``measured``: from evidence (else no evidence: taken as 0, the grace window
    the only tolerance). ``low_measured``: the lower bound came from causal
    evidence rather than ``clock_slack_ms``. ``evidence``: how many buckets of
    evidence made it."""

    low_ms: float
    high_ms: float
    measured: bool
    low_measured: bool = False
    evidence: int = 0

    @property
    def width_ms(self) -> float:
        return self.high_ms - self.low_ms if self.low_ms <= self.high_ms else math.inf

    def describe(self, node: int | None) -> str:
        """``node 3's clock is 2.9-3.1 s ahead of the metadata log's``."""
        who = f"node {node}'s clock" if node is not None else "the clock"
        if not self.measured:
            return f"{who} has no evidence yet: taken to agree with the metadata log's"
        if not math.isfinite(self.width_ms):
            return f"{who} has contradictory or one-sided evidence: its offset is unknown"
        low, high = self.low_ms / 1000, self.high_ms / 1000
        if low >= 0:
            return f"{who} is {_seconds(low)}-{_seconds(high)} s ahead of the metadata log's"
        if high <= 0:
            return f"{who} is {_seconds(-high)}-{_seconds(-low)} s behind the metadata log's"
        return f"{who} is within -{_seconds(-low)}..+{_seconds(high)} s of the metadata log's"

    def to_dict(self) -> dict[str, Any]:
        return {
            "low_ms": _plain(self.low_ms),
            "high_ms": _plain(self.high_ms),
            "measured": self.measured,
            "low_measured": self.low_measured,
            "evidence": self.evidence,
        }


def _seconds(value: float) -> str:
    return f"{value:.1f}" if abs(value) >= 0.1 or value == 0 else f"{value:.3f}"


def _plain(value: float) -> int | None:
    return int(value) if math.isfinite(value) else None


def _line_of(lines: dict[int, EvidenceLine], node: int) -> EvidenceLine:
    line = lines.get(node)
    if line is None:
        line = lines[node] = EvidenceLine()
    return line


def _extend_run(runs: list[list[int]], ts_ms: int) -> None:
    """``ts_ms`` into a node's runs of record times (ClockBook.shared_runs)."""
    if runs and ts_ms - runs[-1][1] <= GAP_MS:
        runs[-1][1] = max(runs[-1][1], ts_ms)
    else:
        runs.append([ts_ms, ts_ms])


def _add_moved(
    line: EvidenceLine,
    node_ms: int,
    bound: int,
    created_ms: int | None,
    upper: bool,
    keep_ms: int,
    by: Loosening,
) -> bool:
    """A bound against a record of an earlier frame, moved as the steps since moved
    that frame's bounds (EvidenceLine.loosen); whether it tightened its bucket."""
    up, spread, down = by
    if upper:
        return line.add(node_ms, bound + up, created_ms, True, keep_ms, spread)
    return line.add(node_ms, bound - down, None, False, keep_ms)


ASSUMED = ClockInterval(0, 0, measured=False)
# Evidence exists but none bounds this moment: a step cut it off, or nothing is in reach.
UNKNOWN = ClockInterval(-math.inf, math.inf, measured=True)


class EvidenceLine:
    """One node's evidence about one partition (or, for reports, about all):
    per bucket of node time the tightest upper and lower bound, and the cuts
    where the node's own records jumped, before which evidence says nothing
    about the clock after."""

    __slots__ = ("blind", "cuts", "high", "last_ts", "low", "newest", "spread", "version")

    def __init__(self) -> None:
        # bucket -> (the lowest upper bound, when the record it refers to was written:
        # None for a record whose epoch had been followed by the next already)
        self.high: dict[int, tuple[int, int | None]] = {}
        self.low: dict[int, int] = {}
        # bucket -> how much wider than its upper bound alone says its estimate is:
        # bounds from before a step of the metadata log's clock (loosen).
        self.spread: dict[int, int] = {}
        self.newest = -(2**62)
        self.version = 0
        self.last_ts: int | None = None  # the node's newest record of the line
        self.cuts: list[int] = []  # node times where a segment starts, ascending
        # Node times ([from, to]) that a backward step wrote twice over: no estimate there.
        self.blind: list[tuple[int, int]] = []

    def saw(self, ts_ms: int, gap_ms: int | None, back_ms: int) -> None:
        """The node wrote a record of this line at ``ts_ms`` (in its log's order).
        ``gap_ms``: a silence this long cuts the line (None: never)."""
        last = self.last_ts
        if last is not None:
            if gap_ms is not None and ts_ms - last > gap_ms:
                self.cuts.append(ts_ms)
                self.version += 1
            elif last - ts_ms > back_ms and not self._blind_already(ts_ms, last):
                # The clock stepped back: times in [ts_ms, last] were written twice,
                # before and after the step, and cannot be told apart.
                self.blind.append((ts_ms, last))
                self.cuts.append(last + 1)
                self.version += 1
        if last is None or ts_ms > last:
            self.last_ts = ts_ms

    def stepped_back(self, at_ms: int) -> None:
        """The clock stepped back between the node's newest record before and
        its time ``at_ms`` (ClockBook._stepped_back): the node times between the
        two may have been written on both sides of the step, and evidence after
        the later of them is of the new clock."""
        last = at_ms if self.last_ts is None else self.last_ts
        low, high = min(at_ms, last), max(at_ms, last)
        if not self._blind_already(low, high):
            self.blind.append((low, high))
            self.cuts.append(high + 1)
            self.version += 1

    def _blind_already(self, ts_ms: int, last: int) -> bool:
        """Whether the step back that made the newest blind spot covers ``ts_ms``
        too: every record after a step back is behind ``last`` until the clock
        passes it again, and each added a blind spot and a cut of its own (400
        of each after a step back of 8 s, every one of which the node's
        estimates walked)."""
        return bool(self.blind) and self.blind[-1][1] == last and self.blind[-1][0] <= ts_ms

    def __setstate__(self, state: tuple[None, dict[str, Any]]) -> None:
        for name, value in state[1].items():
            setattr(self, name, value)
        if "spread" not in state[1]:
            self.spread = {}  # a line saved before spreads existed

    def copy(self) -> EvidenceLine:
        line = EvidenceLine()
        line.high, line.low, line.spread = dict(self.high), dict(self.low), dict(self.spread)
        line.newest, line.last_ts = self.newest, self.last_ts
        line.cuts, line.blind = list(self.cuts), list(self.blind)
        return line

    def loosen(self, by: Loosening) -> None:
        """Every bound so far moved as a step moves them (ClockBook.rebased); an
        estimate from a loosened upper bound reaches as far below it as the
        bound moved (``spread``), since the bound moved for want of knowing the
        frame, not because the clock did."""
        up, widened, down = by
        self.spread = {b: self.spread.get(b, 0) + widened for b in self.high}
        self.high = {b: (bound + up, created) for b, (bound, created) in self.high.items()}
        self.low = {b: bound - down for b, bound in self.low.items()}
        self.version += 1

    def tighten(self, buckets: list[int], by_ms: int) -> None:
        """``buckets`` loosened by a take-over come ``by_ms`` back down (ClockBook._settle);
        a bucket whose bound was since replaced by a new one is left as it is."""
        for b in buckets:
            if b in self.spread and b in self.high:
                bound, created = self.high[b]
                self.high[b] = (bound - by_ms, created)
                self.spread[b] -= by_ms
        self.version += 1

    def lowers(self, node_ms: int, bound: int) -> bool:
        """Whether an upper bound at ``node_ms`` is below its bucket's: else it changes nothing."""
        known = self.high.get(node_ms // BUCKET_MS)
        return known is None or bound < known[0]

    def add(
        self, node_ms: int, bound: int, created_ms: int | None, upper: bool, keep_ms: int, spread_ms: int = 0
    ) -> bool:
        """An upper or lower bound of the node's offset at ``node_ms``; whether it
        tightened its bucket. ``created_ms``: when the record the request knew
        was written, None where that cannot corroborate another bound
        (ClockBook._corroborated); ``spread_ms``: how far below it the estimate
        reaches, for a bound loosened across steps (loosen)."""
        bucket = node_ms // BUCKET_MS
        if upper:
            if not self.lowers(node_ms, bound):
                return False
            self.high[bucket] = (bound, created_ms)
            if spread_ms:
                self.spread[bucket] = spread_ms
            else:
                self.spread.pop(bucket, None)
        else:
            old = self.low.get(bucket)
            if old is not None and bound <= old:
                return False
            self.low[bucket] = bound
        self.version += 1
        if bucket > self.newest:
            self.newest = bucket
            cutoff = bucket - keep_ms // BUCKET_MS
            if len(self.high) + len(self.low) > 2 * keep_ms // BUCKET_MS:
                for old in [b for b in self.high if b < cutoff]:
                    del self.high[old]
                    self.spread.pop(old, None)
                for old in [b for b in self.low if b < cutoff]:
                    del self.low[old]
            horizon = node_ms - keep_ms
            while len(self.cuts) > 1 and self.cuts[1] < horizon:
                del self.cuts[0]
            while self.blind and self.blind[0][1] < horizon:
                del self.blind[0]
        return True

    def next_blind(self, ts_ms: int) -> int:
        """Where the next blind spot after ``ts_ms`` begins (evidence beyond it
        may be from after a backward step)."""
        return min((lo for lo, _ in self.blind if lo > ts_ms), default=2**62)

    def after_blind(self, start_ms: int) -> bool:
        """Whether a segment starting at ``start_ms`` starts where a blind spot ends."""
        return any(hi + 1 == start_ms for _, hi in self.blind)

    def segment(self, ts_ms: int) -> tuple[int, int] | None:
        """The node times around ``ts_ms`` with no cut between, or None in a blind spot."""
        for lo, hi in self.blind:
            if lo <= ts_ms <= hi:
                return None
        i = bisect_right(self.cuts, ts_ms)
        start = self.cuts[i - 1] if i else -(2**62)
        end = self.cuts[i] if i < len(self.cuts) else 2**62
        return start, end


class ClockBook:
    """One cluster's clocks (or one bucket's of them, in the streaming job: a
    bucket sees its own partitions' records and requests): the records that
    created epochs, the claims of knowledge and causation waiting for them,
    and each node's evidence, which verdicts, reports and progress all read."""

    def __init__(self, window_ms: int, slack_ms: int, ahead_ms: int, limit_ms: int, back_ms: int):
        self.window_ms = window_ms
        self.slack_ms = slack_ms
        self.ahead_ms = ahead_ms
        self.limit_ms = limit_ms
        self.back_ms = back_ms
        self.lines: dict[int, EvidenceLine] = {}
        # When each epoch was created (the metadata record's time), for a while.
        self.created: dict[EpochRef, int] = {}
        # A record stamped before its predecessor is placed at its predecessor's
        # time (MetadataClock.place) until the next record shows whether the clock
        # stepped: it was written somewhere between its own stamp (``created``,
        # which upper bounds use) and the time it was placed at (here; lower bounds).
        self.created_late: dict[EpochRef, int] = {}
        self._created_order: deque[tuple[int, EpochRef]] = deque()
        # The records of before the newest step of the metadata log's clock, for
        # requests about them that arrive after it (ClockBook.rebased): ref -> (its
        # time, as late as, the frame it was written in); frames are numbered by
        # the steps that end them.
        self.earlier: dict[EpochRef, tuple[int, int, int]] = {}
        self.frame = 0
        # Each step the earlier records come from, oldest first: [the frame it
        # ended, how far it moved upper bounds up, their spread, lower bounds down].
        self.steps: list[list[int]] = []
        self._takeover: int | None = None  # the frame the newest take-over ended
        # Claims whose record has not been applied yet: ref -> (node, upper, bucket) -> arrival.
        self.waiting: dict[EpochRef, dict[tuple[int, bool, int], int]] = {}
        self._waiting_order: deque[tuple[int, EpochRef]] = deque()
        # (node, bucket of its time, the view's frame or None) -> (its line, the line's
        # version then, the node times [from, to) of the bucket it holds for, the
        # interval): valid while the line's version is unchanged.
        self._cache: dict[
            tuple[int | None, int, int | None], tuple[EvidenceLine, int, int, int, ClockInterval | None]
        ] = {}
        # Since the newest take-over: each node's lowest offset before it (those
        # measured tightly), the buckets each line had then, and how far up those
        # are loosened now (ClockBook.taken_over).
        self.unsettled: tuple[dict[int, float], dict[int, list[int]], int] | None = None
        # The evidence of each recent frame as it stood when a step ended it, kept
        # up to date as if no later step had come (ClockBook.interval):
        # [the frame, the step's record's time, each node's line].
        self.views: list[tuple[int, int, dict[int, EvidenceLine]]] = []
        # After a take-over whose silence may have hidden a step forward of the new
        # clock (ClockBook.taken_over): the frame it began, the newest record time
        # whose bounds a moment from before it can reach, and how far they may be
        # too low for such a moment.
        self.silenced: tuple[int, int, int] | None = None
        # The bounds this book measured itself since the cluster's other buckets
        # were last told them (detectors.clock_exchange); None: not shared. And
        # the node times it saw each node's records at since, as runs without a
        # silence longer than GAP_MS: [first, last].
        self.shared: list[SharedBound] | None = None
        self.shared_runs: dict[int, list[list[int]]] = {}
        # How far in each node's time the runs of every bucket have come in
        # (detectors.clock_exchange.apply): its cuts up to there are the cluster's.
        self.runs_known: dict[int, int] = {}

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_cache": {}}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self.__dict__.setdefault("created_late", {})  # state saved before it existed
        self.__dict__.setdefault("unsettled", None)
        self.__dict__.setdefault("silenced", None)  # state saved before take-overs' silences were placed
        for name, empty in (("earlier", {}), ("frame", 0), ("steps", []), ("_takeover", None), ("views", [])):
            self.__dict__.setdefault(name, empty)  # state saved before records outlived a step
        self.__dict__.setdefault("shared", None)  # state saved before buckets shared their bounds
        self.__dict__.setdefault("shared_runs", {})
        self.__dict__.setdefault("runs_known", {})

    # ---- evidence -------------------------------------------------------------------------

    def saw(self, node: int, ts_ms: int) -> None:
        """``node`` logged a record at ``ts_ms`` (in its log's order)."""
        self._line(node).saw(ts_ms, GAP_MS, self.back_ms)
        if self.shared is not None:
            _extend_run(self.shared_runs.setdefault(node, []), ts_ms)
        for _, _, lines in self.views:
            _line_of(lines, node).saw(ts_ms, GAP_MS, self.back_ms)

    def rebased(self, at_ms: int, margin_ms: int, up_ms: int = 0, down_ms: int = 0) -> None:
        """The metadata log's continuous time was anchored anew (MetadataClock
        took a step): the new controller's clock is lined up with the old one's
        only as well as the true gap between their records is guessed, within
        ``margin_ms``; after a step forward, which may as well have been a silence
        (a fail-over's election) as far as the log shows, up to ``up_ms`` more
        the other way; after a take-over's silence, which may as well have hidden a
        step forward of the new clock, up to ``down_ms`` more down. Every bound
        measured before is loosened by them. Claims
        still waiting for their records keep waiting: a record applied after the
        step was written after it, so the bound it completes is of the new frame,
        as when the request is read after the record (forgotten, a claim read
        first bounded nothing, and a node's evidence depended on which piece of
        the input came first). The records of before are
        kept apart: a request that knew one and arrives after the step (a
        broker's log shipped late, or held back by replay's merge while its
        clock runs ahead) bounds its node's clock as loosely as if it had
        arrived before the step (``_since``). Forgotten, they left such a
        broker unmeasured, taken to agree with the log, and its requests judged
        seconds off (a broker 4 s ahead whose log replay read after a take-over:
        444 false alarms, tests/unit/test_redelivery.py).

        ``at_ms``: the time the step's record was placed at. The evidence as it
        stands is kept as the frame's view, for verdicts that read nothing of
        the log from the step on (``interval``)."""
        by = (margin_ms + up_ms, 2 * margin_ms + up_ms + down_ms, margin_ms + down_ms)
        self.views.append((self.frame, at_ms, {node: line.copy() for node, line in self.lines.items()}))
        for line in self.lines.values():
            line.loosen(by)
        late = self.created_late
        for ref, ts_ms in self.created.items():
            self.earlier[ref] = (ts_ms, late.get(ref, ts_ms), self.frame)
        self.steps.append([self.frame, *by])
        self.frame += 1
        self.created.clear()
        self.created_late.clear()

    def taken_over(self, at_ms: int, margin_ms: int, silence_ms: int = 0) -> None:
        """Another controller's clock stamps the metadata log from here on (a
        LeaderChange record). Its clock may be off the old one's by anything the
        election's silence hid: a step back as long as the silence leaves no
        record stamped before its predecessor, or a step forward as long as the
        silence, ``silence_ms`` (placed as a silence: MetadataClock._place). So
        every bound from before is loosened as far up as the clock window reaches
        (older evidence is not used), and by ``margin_ms`` and the silence down
        (every offset may have dropped by the step it hid), until a node whose
        offset was measured tightly before is bounded by a record of the new
        clock: its offset cannot have risen more than that bound less its
        lowest offset before, and bounds from before are settled to that
        (``_settle``). Until then intervals are wider than the clock limit:
        verdicts are counted "clock uncertain", never judged on a guess. Each
        later bound of such a node may settle them lower.

        The other way round, a step forward hidden in the silence lowers every
        offset, and a bound of the new clock is then too low, by up to the
        silence and the margin, for a moment from before the take-over that it
        reaches (an estimate reaches ``ahead_ms`` on): a request a broker
        served just before a fail-over onto a controller 3 s ahead, measured by
        the bounds of after it, was placed 3 s late, after the new epochs, and
        judged stale (tests/unit/test_clocks.py). So the bounds against records
        written within that reach of the take-over are kept as high as that,
        with the estimate reaching down to them (``spread``): wider for the
        first seconds of the new clock, never placed wrong."""
        lows = {}
        for node, line in self.lines.items():
            tight = self._estimate(line, line.newest * BUCKET_MS + BUCKET_MS - 1, tight_only=True)
            if tight is not None and math.isfinite(tight.low_ms):
                lows[node] = tight.low_ms
        # Upper bounds up by the window, lower ones down by the silence too.
        self.rebased(at_ms, margin_ms, self.window_ms - margin_ms, silence_ms)
        drop = margin_ms + silence_ms
        self.silenced = (self.frame, at_ms + drop + self.ahead_ms, drop) if silence_ms > 0 else None
        self.unsettled = (lows, {node: list(line.high) for node, line in self.lines.items()}, self.window_ms)
        self._takeover = self.frame - 1

    def _settle(self, rise_ms: float) -> None:
        """The new clock is bounded: offsets rose by at most ``rise_ms`` at the
        take-over, so the bounds loosened then come down to that, if lower."""
        assert self.unsettled is not None
        lows, buckets, up = self.unsettled
        rise = min(up, max(0, math.ceil(rise_ms)))
        if rise == up:
            return
        # Views of frames ended after the take-over hold its loosening too.
        takeover = self._takeover
        assert takeover is not None  # set with self.unsettled (taken_over)
        later = [lines for frame, _, lines in self.views if frame > takeover]
        for node, loosened in buckets.items():
            for lines in (self.lines, *later):
                line = lines.get(node)
                if line is not None:
                    line.tighten(loosened, up - rise)
        for step in self.steps:
            if step[0] == self._takeover:
                step[1] -= up - rise
                step[2] -= up - rise
        self.unsettled = (lows, buckets, rise)

    def created_epoch(self, ref: EpochRef, ts_ms: int, late_ms: int | None = None) -> None:
        """The metadata record written at ``ts_ms`` (or as late as ``late_ms``) created ``ref``."""
        if ref in self.created:
            return
        self.earlier.pop(ref, None)  # a topic created again under its old name
        self.created[ref] = ts_ms
        late = ts_ms if late_ms is None else max(ts_ms, late_ms)
        if late != ts_ms:
            self.created_late[ref] = late
        self._created_order.append((ts_ms, ref))
        horizon = ts_ms - 2 * self.window_ms
        order = self._created_order
        while order and (order[0][0] < horizon or len(order) > MAX_EPOCHS_KEPT):
            _, old = order.popleft()
            self.created.pop(old, None)
            self.created_late.pop(old, None)
            self.earlier.pop(old, None)
        if self.steps:
            # Steps older than the oldest record kept loosen nothing any more.
            oldest = self.earlier.get(order[0][1]) if order else None
            first = self.frame if oldest is None else oldest[2]
            while self.steps and self.steps[0][0] < first:
                del self.steps[0]
        while self.views and self.views[0][1] < horizon:
            del self.views[0]
        for (node, upper, _), arrival in self.waiting.pop(ref, {}).items():
            self._bound(node, arrival, ts_ms if upper else late, upper, fresh=True)

    def knows(self, node: int, arrival_ms: int, ref: EpochRef) -> None:
        """``node`` handled, from ``arrival_ms`` on, a request that carried ``ref``."""
        created = self.created.get(ref)
        line = self.lines.get(node)
        # Most claims repeat one already made in their bucket (every fetch of a
        # partition at its epoch): one that cannot lower the bucket's upper bound
        # changes nothing (EvidenceLine.lowers), so it is dropped before the work
        # of placing it.
        if created is not None and line is not None:
            if not line.lowers(arrival_ms, arrival_ms - created):
                return
            self._stepped_back(node, line, arrival_ms, arrival_ms - created)
        self._claim(node, arrival_ms, ref, upper=True)

    def refused(self, node: int, arrival_ms: int, refs: Iterable[EpochRef]) -> None:
        """A request ``node`` handled from ``arrival_ms`` on, knowing the epochs
        ``refs``, refused as too late: it bounds nothing (its verdict is not
        made), but it may show the node's clock stepped back (``_stepped_back``),
        and after a step back of seconds the first requests are all too late by
        the clock of before."""
        line = self.lines.get(node)
        created = self.created
        bounds = [arrival_ms - created[ref] for ref in refs if ref in created]
        if line is not None and bounds:
            self._stepped_back(node, line, arrival_ms, min(bounds))

    def _stepped_back(self, node: int, line: EvidenceLine, arrival_ms: int, bound: int) -> None:
        """An upper bound ``bound`` of ``node``'s offset at ``arrival_ms`` below the
        low end of its interval there: the clock stepped back since that evidence
        was measured (or the interval was wrong), so the node times around the
        step are blind (EvidenceLine.stepped_back). A request read before never
        does this: its bound is in the evidence the interval was made of. A step
        back shows in the node's times going back (EvidenceLine.saw) only where
        it is longer than the node's silence around it: broker 3 stepped back
        2 s after 1.5 s without a request went back 480 ms, its bounds of after
        the step were read into the buckets of before, and a request of before
        was judged 2 s late, a certain false PRODUCE_STALE_EPOCH_ACCEPTED
        (benchmarks/clock_campaign.py --step-grid, seed 3, 30,000 events)."""
        interval = self._interval_in(self.lines, node, arrival_ms, None)
        if interval.measured and bound < interval.low_ms:
            line.stepped_back(arrival_ms)
            for _, _, lines in self.views:
                _line_of(lines, node).stepped_back(arrival_ms)

    def caused(self, node: int, arrival_ms: int, completed_ms: int, ref: EpochRef) -> None:
        """A request ``node`` received at ``arrival_ms`` and answered at
        ``completed_ms`` caused the record creating ``ref``: the record was
        written in between."""
        self._claim(node, arrival_ms, ref, upper=False)
        self._claim(node, completed_ms, ref, upper=True)

    def _claim(self, node: int, arrival_ms: int, ref: EpochRef, upper: bool) -> None:
        created = self.created.get(ref)
        across: tuple[Loosening, int] | None = None
        if created is not None:
            late = self.created_late.get(ref, created)
        elif ref in self.earlier:
            created, late, frame = self.earlier[ref]
            by = self._since(frame)
            if by is None:
                return  # a step it crossed is forgotten: how far to loosen is not known
            across = (by, frame)
        if created is not None:
            # A claim about an epoch already followed by the next (a stale client,
            # a zombie's request) bounds the clock, loosely: it says nothing of how
            # soon the node learns new epochs, so it corroborates nothing.
            partition, kind, epoch = ref
            following = (partition, kind, epoch + 1)
            fresh = following not in self.created and following not in self.earlier
            self._bound(node, arrival_ms, created if upper else late, upper, fresh, across)
            return
        claims = self.waiting.get(ref)
        if claims is None:
            claims = self.waiting[ref] = {}
            self._waiting_order.append((arrival_ms, ref))
            while self._waiting_order and (
                self._waiting_order[0][0] < arrival_ms - _WAITING_MS
                or len(self._waiting_order) > MAX_EPOCHS_KEPT
            ):
                _, old = self._waiting_order.popleft()
                self.waiting.pop(old, None)
        # Per node and bucket only the tightest claim can matter (EvidenceLine.add).
        slot = (node, upper, arrival_ms // BUCKET_MS)
        known = claims.get(slot)
        if known is None or (arrival_ms < known if upper else arrival_ms > known):
            claims[slot] = arrival_ms

    def _line(self, node: int) -> EvidenceLine:
        return _line_of(self.lines, node)

    def _bound(
        self,
        node: int,
        node_ms: int,
        created_ms: int,
        upper: bool,
        fresh: bool,
        across: tuple[Loosening, int] | None = None,
    ) -> None:
        """Evidence: ``node``'s request at ``node_ms`` knew of (or caused) the record at ``created_ms``;
        ``fresh``: the epoch was still the newest the cluster had created (else the
        bound may corroborate nothing: EvidenceLine.add). ``across``: for a record
        written before the steps since, how far they moved the bounds of then
        (``_since``) and the record's frame: the bound is moved as those were."""
        if self.shared is not None:
            frame = self.frame if across is None else across[1]
            self.shared.append((node, node_ms, created_ms, upper, fresh, frame))
        line = self._line(node)
        bound = node_ms - created_ms
        keep_ms = 2 * self.window_ms
        if across is None:
            silenced = self.silenced
            if upper and silenced is not None and silenced[0] == self.frame and created_ms <= silenced[1]:
                # Reachable from before a take-over that may have hidden a step forward.
                drop = silenced[2]
                if line.add(node_ms, bound + drop, created_ms if fresh else None, upper, keep_ms, drop):
                    self._replaced(node, node_ms)
            else:
                line.add(node_ms, bound, created_ms if fresh else None, upper, keep_ms)
            if upper and self.unsettled is not None:
                # A record of the new clock bounds it.
                low = self.unsettled[0].get(node)
                if low is not None:
                    self._settle(bound - low)
            return
        # A record of an old clock says nothing of the new one: it settles nothing.
        by, frame = across
        created = created_ms if fresh else None
        for view_frame, _, lines in self.views:
            # Views of the record's frame and later ones: moved by the steps up to theirs only.
            then = self._between(frame, view_frame)
            if then is not None:
                _add_moved(_line_of(lines, node), node_ms, bound, created, upper, keep_ms, then)
        if (
            _add_moved(line, node_ms, bound, created, upper, keep_ms, by)
            and upper
            and self.unsettled is not None
            and self._takeover is not None
            and frame <= self._takeover
        ):
            # Loosened by the take-over's rise so far: settled with the bounds of then.
            loosened = self.unsettled[1].setdefault(node, [])
            if node_ms // BUCKET_MS not in loosened:
                loosened.append(node_ms // BUCKET_MS)

    def _replaced(self, node: int, node_ms: int) -> None:
        """A bound of the new clock replaced the one a take-over loosened in its
        bucket: settling the take-over must not move it (EvidenceLine.tighten
        tells a replaced bucket by its spread, which this bound has too)."""
        if self.unsettled is not None:
            loosened = self.unsettled[1].get(node)
            if loosened is not None and node_ms // BUCKET_MS in loosened:
                loosened.remove(node_ms // BUCKET_MS)

    def take_shared(self, bound: SharedBound) -> None:
        """A bound another bucket of the cluster measured (detectors.clock_exchange),
        in the frame it names: placed exactly as the claim that made it was there.
        A frame this book has not reached, or whose steps it has forgotten, is
        left out: how far to move the bound is not known."""
        node, node_ms, created_ms, upper, fresh, frame = bound
        shared, self.shared = self.shared, None  # not told back to the others
        try:
            if frame == self.frame:
                self._bound(node, node_ms, created_ms, upper, fresh)
            elif frame < self.frame:
                by = self._since(frame)
                if by is not None:
                    self._bound(node, node_ms, created_ms, upper, fresh, (by, frame))
        finally:
            self.shared = shared

    def _since(self, frame: int) -> Loosening | None:
        """How far the steps since ``frame`` moved its bounds (None: one of them is forgotten)."""
        return self._between(frame, self.frame)

    def _between(self, frame: int, until: int) -> Loosening | None:
        """How far the steps that ended frames ``frame`` to ``until`` (excluded) moved
        the bounds of ``frame`` (None: one of them is forgotten, or ``until`` is earlier)."""
        if until < frame:
            return None
        since = [step for step in self.steps if frame <= step[0] < until]
        if len(since) != until - frame:
            return None
        return (sum(s[1] for s in since), sum(s[2] for s in since), sum(s[3] for s in since))

    # ---- estimates -------------------------------------------------------------------------

    def interval(self, node: int | None, ts_ms: int) -> ClockInterval:
        """``node``'s offset interval at its own time ``ts_ms``: the same for every
        time in one bucket of evidence and one segment of the node's line
        (estimated at the earliest of them), so the answer never depends on which
        time was asked first or whether the cache survived a restart.

        Nor, where the frame measured it tightly, on whether a step of the
        metadata log's clock came in before it was asked. The log is applied as
        it arrives, so a take-over read before a verdict on an earlier moment
        was due loosened its interval past the clock limit (clock uncertain),
        and the same verdict made before the take-over was read was judged
        (tests/unit/test_redelivery.py). A moment whose verdict reads nothing of
        the log from a step on (the grace window past the latest moment its
        interval allows ends before the step's record, by the evidence as it
        stands and by the frame's) is measured by the frame's view, if that
        measures it tightly. A loose estimate is left to the evidence as it
        stands: it leans on evidence up to the clock window ahead
        (``_across_cuts``), which a view lacks past its step; so does a tight one
        that only old epochs' requests make look corroborated."""
        current = self._interval_in(self.lines, node, ts_ms, None)
        if node is None or not self.views:
            return current
        for frame, at_ms, lines in self.views:
            if ts_ms - current.low_ms + self.ahead_ms >= at_ms:
                continue
            view = self._interval_in(lines, node, ts_ms, frame)
            if view is not None and ts_ms - view.low_ms + self.ahead_ms < at_ms:
                return view
        return current

    @overload
    def _interval_in(
        self, lines: dict[int, EvidenceLine], node: int | None, ts_ms: int, frame: None
    ) -> ClockInterval: ...
    @overload
    def _interval_in(
        self, lines: dict[int, EvidenceLine], node: int | None, ts_ms: int, frame: int
    ) -> ClockInterval | None: ...
    def _interval_in(
        self, lines: dict[int, EvidenceLine], node: int | None, ts_ms: int, frame: int | None
    ) -> ClockInterval | None:
        """:meth:`interval` from ``lines``: the evidence as it stands (``frame``
        None), or a frame's view, tight estimates only (else None)."""
        # Looked up about four times per event: a hit costs one dict look-up and
        # a range check. A node without a line (or None) is never cached.
        bucket = ts_ms // BUCKET_MS
        key = (node, bucket, frame)
        cached = self._cache.get(key)
        if cached is not None and cached[0].version == cached[1] and cached[2] <= ts_ms < cached[3]:
            return cached[4]
        line = lines.get(node) if node is not None else None
        if line is None or node is None:
            return ASSUMED if frame is None else None
        segment = line.segment(ts_ms)
        if segment is None:
            return UNKNOWN if frame is None else None
        start = max(bucket * BUCKET_MS, segment[0])
        result = self._estimate(line, start, tight_only=frame is not None)
        if len(self._cache) > 65536:
            self._cache.clear()
        self._cache[key] = (
            line,
            line.version,
            start,
            min(segment[1], (bucket + 1) * BUCKET_MS),
            result,
        )
        return result

    @overload
    def _estimate(self, line: EvidenceLine, ts_ms: int) -> ClockInterval: ...
    @overload
    def _estimate(self, line: EvidenceLine, ts_ms: int, tight_only: bool) -> ClockInterval | None: ...
    def _estimate(self, line: EvidenceLine, ts_ms: int, tight_only: bool = False) -> ClockInterval | None:
        """The interval at ``ts_ms``; ``tight_only``: None unless causal evidence
        bounds it on both sides or corroborates its upper bound."""
        segment = line.segment(ts_ms)
        if segment is None:
            return None if tight_only else UNKNOWN
        slack = self.slack_ms
        bucket = ts_ms // BUCKET_MS
        first = max(ts_ms - self.window_ms, segment[0]) // BUCKET_MS
        last = (min(ts_ms + self.ahead_ms, segment[1]) - 1) // BUCKET_MS
        # A backward step wrote its blind node times twice, and a bucket that
        # holds one of them holds bounds from both sides of the step: the bucket
        # a blind spot begins in is left out before it, the one it ends in after
        # it. Kept, a broker stepped back 2 s had requests of before the step
        # measured by the bounds of after it, 1.8-2.8 s behind instead of
        # agreeing, and raised certain false alarms (benchmarks/clock_campaign.py
        # --step-grid).
        last = min(last, line.next_blind(ts_ms) // BUCKET_MS - 1)
        if line.after_blind(segment[0]):
            first = max(first, -(-segment[0] // BUCKET_MS))
        found = [(b, line.high[b]) for b in range(first, last + 1) if b in line.high]
        lows = [line.low[b] for b in range(first, last + 1) if b in line.low]
        if not found and not lows:
            # Nothing in reach: the nearest older evidence of the segment, if any.
            older = [b for b in line.high if segment[0] // BUCKET_MS <= b < first]
            if tight_only:
                return None  # one bucket of evidence corroborates nothing
            if older:
                found = [(max(older), line.high[max(older)])]
            else:
                return self._before_cut(line, ts_ms, segment[0])
        if lows:
            two_sided = self._two_sided(line, bucket, first, last)
            if two_sided is not None:
                return two_sided
        # No lower bound of its own (a broker). The lowest upper bound in reach is
        # taken for tight where it is corroborated: then the clock is at most the
        # slack below it.
        high = min(h for _, (h, _) in found)
        # A loosened bound (one from before a step of the metadata log's clock)
        # allows the clock as far below it as it moved, whether or not it is the
        # lowest: the lowest may come from after the step, in another frame.
        spread = line.spread
        floor = min([high, *(h - spread[b] for b, (h, _) in found if b in spread)]) if spread else high
        if self._corroborated([v for _, v in found], high):
            return ClockInterval(floor - slack, high, measured=True, evidence=len(found))
        if tight_only:
            return None
        # Loose evidence only says the clock is not further ahead than it: it may
        # be anywhere from the slack behind agreement with the metadata log up to
        # that far ahead, or, if it proves the clock behind, up to the slack below
        # it (a broker 236 ms behind whose only evidence in a bucket is loose must
        # not be judged as if it agreed: tried, benchmarks/clock_skew.py --buckets 8).
        # A bound looser than the clock limit (requests about an epoch long
        # established, a quiet cluster's usual case) says nothing: the node is
        # taken to agree, as without evidence.
        if floor > self.limit_ms:
            return ASSUMED
        # A tight measure of the same clock just across a cut of this segment (a
        # controller's two-sided evidence once it takes over, a node's before a
        # silence) is as plausible as agreement, so the interval allows both: a
        # controller 2.8 s behind, taken near agreement on loose evidence, had its
        # claim to a new epoch placed seconds too early and an old leader's last
        # fetch judged a zombie's (benchmarks/clock_campaign.py, 1M events).
        low: float = min(0, high) - slack - (high - floor)
        for near in self._across_cuts(line, ts_ms, segment):
            low = min(low, near.low_ms)
        return ClockInterval(low, high, measured=True, evidence=len(found))

    def _across_cuts(self, line: EvidenceLine, ts_ms: int, segment: tuple[int, int]) -> list[ClockInterval]:
        """The tight estimates at the near ends of the segments before and after
        ``segment``, within the window of ``ts_ms``."""
        out = []
        for at in (segment[0] - 1, segment[1]):
            if abs(at - ts_ms) <= self.window_ms:
                near = self._estimate(line, at, tight_only=True)
                if near is not None:
                    out.append(near)
        return out

    def _before_cut(self, line: EvidenceLine, ts_ms: int, start_ms: int) -> ClockInterval:
        """A segment without evidence yet (a controller that just took over, a
        node back from a silence): the clock as last measured before the cut,
        within the window, is more plausible than agreement with the metadata log."""
        horizon = (ts_ms - self.window_ms) // BUCKET_MS
        before = [b for b in (*line.high, *line.low) if horizon <= b < start_ms // BUCKET_MS]
        if not before or start_ms <= -(2**62):
            return ASSUMED
        return self._estimate(line, max(before) * BUCKET_MS + BUCKET_MS - 1)

    def _two_sided(self, line: EvidenceLine, bucket: int, first: int, last: int) -> ClockInterval | None:
        """A node with causal evidence too (a controller): the bounds of the
        buckets nearest ``bucket`` that agree, ahead first, then back; a bucket
        whose bounds contradict them marks a step, and the walk stops there."""
        high, low, count = math.inf, -math.inf, 0
        for order in (range(bucket, last + 1), range(bucket - 1, first - 1, -1)):
            for b in order:
                h, lo = line.high.get(b), line.low.get(b)
                new_high = min(high, h[0]) if h is not None else high
                new_low = max(low, lo) if lo is not None else low
                if new_low > new_high:
                    break
                high, low = new_high, new_low
                count += (h is not None) + (lo is not None)
        if low == -math.inf:
            return None
        return ClockInterval(low, high, True, True, count)

    def _corroborated(self, found: list[tuple[int, int | None]], high: float) -> bool:
        """Whether the lowest upper bound is taken to be tight: requests about
        records written at least ``clock_slack_ms`` apart give upper bounds within
        ``clock_slack_ms`` of it. A request long after its epoch was created (a
        stale client at a former leader) gives a loose bound that grows with its
        age; two about different records agree only if both came soon after."""
        slack = self.slack_ms
        near = [created for bound, created in found if created is not None and bound <= high + slack]
        return len(near) >= 2 and max(near) - min(near) >= slack

    def measured_nodes(self, shift_ms: int = 0) -> dict[int, ClockInterval]:
        """Every node whose evidence, at its newest, measures its clock. Offsets
        are measured against the metadata log's continuous time; ``shift_ms``
        (MetadataClock.shift_ms) turns them into offsets against the clock that
        stamps the log now, the active controller's, which is what people compare
        with."""
        out: dict[int, ClockInterval] = {}
        for node, line in sorted(self.lines.items()):
            if line.high or line.low:
                interval = self._interval_in(self.lines, node, line.newest * BUCKET_MS + BUCKET_MS - 1, None)
                if interval.measured:
                    out[node] = replace(
                        interval, low_ms=interval.low_ms + shift_ms, high_ms=interval.high_ms + shift_ms
                    )
        return out


class MetadataClock:
    """The metadata log's time, made continuous across the steps of its clock.

    The log carries the active controller's clock, so a fail-over onto a node
    whose clock is off moves every later record's time at once. Other nodes'
    offsets are measured against this continuous time, so such a step is not a
    step of every node at once. A step shows in the log's own order: a record
    older than its predecessor (the new clock is behind), or, while the log's
    NoOp records tick steadily (``metadata.max.idle.interval.ms``, 500 ms by
    default, since Kafka 3.3), a silence much longer than its recent gaps (the
    new clock is ahead), unless the record after it hands the log over. A
    crashed leader's successor writes only after an election, and the log is
    silent meanwhile (voters wait ``controller.quorum.fetch.timeout.ms``, 2 s by
    default, before they stand: KafkaRaftClient): on a real Kafka 4.4 cluster
    those silences ran 2.3-3.8 s with every clock right. Such a silence is
    placed as it is, and the bounds from before allow a step of the new clock
    hidden in it instead (Detector._place_metadata, ClockBook.taken_over). The shift
    that makes the log continuous is off by at most the true gap there. A small
    step forward cannot be told from a pause and is left alone: it only lowers
    every node's offset, which the upper bounds follow at once.

    Left alone, those would add up: a hand-over onto a slower clock moves the
    time ahead by the step and the longest recent gap, the hand-over back is a
    small step forward and is left, and a log handed back and forth between
    two controllers drifts ahead by both at every round. So the shift each
    named controller wrote with is kept, and a controller that takes the log
    back resumes its own: its clock has not moved for being out of office.
    Only where that would place its first record before its predecessor (the
    shift it left with was a guess ahead of the true gap, or its clock
    stepped back since) is the time moved forward, and only as far as the
    predecessor; a silence it leaves is an election's, as at any take-over.
    The time then runs ahead of the first
    controller's by at most what the first hand-over onto each controller
    guessed, however often the log changes hands; offsets are measured against
    it all the same, and reports say so."""

    __slots__ = (
        "back",
        "gaps",
        "history",
        "last_noop_ms",
        "last_raw_ms",
        "noop_gaps",
        "shift_ms",
        "shifts",
        "steps",
        "unnamed_ms",
        "writer",
    )

    def __init__(self) -> None:
        self.shift_ms = 0
        self.last_raw_ms: int | None = None
        self.gaps: deque[int] = deque(maxlen=16)
        self.steps: deque[tuple[int | None, int]] = deque(maxlen=16)  # (offset, ms the clock moved)
        self.last_noop_ms: int | None = None
        self.noop_gaps: deque[int] = deque(maxlen=3)
        # A record stamped before its predecessor, not yet taken for a step: (its
        # predecessor's time, the gap back).
        self.back: tuple[int, int] | None = None
        # The newest LeaderChange record's (epoch, leader): whose clock stamps the log.
        self.writer: tuple[int, int] | None = None
        # The shift each named controller's clock was last placed with.
        self.shifts: dict[int, int] = {}
        # The shift before the first LeaderChange seen, whose writer none named.
        self.unnamed_ms: int | None = None
        # Each (writer, shift) the log took, from which of its records on: (that
        # record's own time, the writer named then or None, the shift).
        self.history: deque[tuple[int, int | None, int]] = deque(maxlen=_HISTORY)

    def __getstate__(self) -> tuple[Any, ...]:
        return (
            self.shift_ms,
            self.last_raw_ms,
            list(self.gaps),
            list(self.steps),
            self.last_noop_ms,
            list(self.noop_gaps),
            self.back,
            self.writer,
            self.shifts,
            self.unnamed_ms,
            list(self.history),
        )

    def __setstate__(self, state: tuple[Any, ...]) -> None:
        self.shift_ms, self.last_raw_ms = state[0], state[1]
        self.gaps = deque(state[2], maxlen=16)
        self.steps = deque(state[3], maxlen=16)
        self.last_noop_ms = state[4]
        self.noop_gaps = deque(state[5], maxlen=3)
        self.back = state[6]
        # State saved before writers, and then their shifts, were kept.
        self.writer = state[7] if len(state) > 7 else None
        self.shifts = state[8] if len(state) > 8 else {}
        self.unnamed_ms = state[9] if len(state) > 9 else None
        self.history = deque(state[10] if len(state) > 10 else (), maxlen=_HISTORY)

    def ticking(self) -> bool:
        """The log's NoOps have come at a steady beat lately: a long silence is
        then a step of the clock, not a quiet controller. Logs written before
        Kafka 3.3 (KIP-835) have no NoOps: their silences are never taken for steps."""
        return len(self.noop_gaps) == self.noop_gaps.maxlen and max(self.noop_gaps) <= GAP_MS

    def took_over(self, epoch: int, leader: int) -> bool:
        """A LeaderChange record: ``leader`` (-1 when the dump does not name it)
        leads ``epoch``. Whether the log's clock may have changed hands: a new
        epoch led by another controller, or by one not named. The new leader
        writes this record first thing in its epoch, by its own clock
        (KafkaRaftClient.onBecomeLeader, LeaderState.appendStartOfEpochControlRecords),
        so it is told before the record is placed, and a controller that wrote
        the log before resumes its shift there (``place``'s ``took_over``)."""
        last = self.writer
        if last is not None and epoch <= last[0]:
            return False
        self.writer = (epoch, leader)
        if last is None:
            self.unnamed_ms = self.shift_ms
            return False
        if leader >= 0 and leader == last[1]:
            return False
        if last[1] >= 0:
            self.shifts[last[1]] = self.shift_ms
        return True

    def shift_of(self, node: int | None, ts_ms: int) -> int:
        """The shift that places controller ``node``'s own time ``ts_ms`` in the
        log's (exactly, while its clock holds): the one in force then, as the
        log's newest changes of writer or shift tell (a writer's newest shift
        is a later tenure's once it took the log back, and a request from
        before it was placed by that: a verdict that then depended on how far
        the log had been read, tests/unit/test_redelivery.py). Older than
        those: the one the log had while ``node`` last wrote it; while no
        LeaderChange names the writer, the current one; for a node none
        named, the one from before the first LeaderChange (it wrote the log
        then, if ever)."""
        for since_ms, writer_node, shift in reversed(self.history):
            if since_ms <= ts_ms and writer_node in (None, node):
                return shift
        writer = self.writer
        if writer is None or writer[1] < 0 or writer[1] == node:
            return self.shift_ms
        known = self.shifts.get(node) if node is not None else None
        if known is not None:
            return known
        return self.shift_ms if self.unnamed_ms is None else self.unnamed_ms

    def step_margin_ms(self) -> int:
        """How far off the newest step's placement may be: the true gap there is
        taken to lie within the longest recent gap of where it was placed (at
        least STEP_MARGIN_MS)."""
        return max(max(self.gaps, default=0), STEP_MARGIN_MS)

    def place(self, ts_ms: int, offset: int | None, noop: bool = False, took_over: bool = False) -> int:
        """The continuous time of the record at ``ts_ms`` (in log order);
        ``noop``: a NO_OP_RECORD, the log's heartbeat; ``took_over``: a
        LeaderChange record that handed the log over (:meth:`took_over`)."""
        placed = self._place(ts_ms, offset, noop, took_over)
        writer = None if self.writer is None or self.writer[1] < 0 else self.writer[1]
        history = self.history
        last = history[-1] if history else None
        if last is None or last[1] != writer or last[2] != self.shift_ms:
            history.append((ts_ms, writer, self.shift_ms))
        return placed

    def _place(self, ts_ms: int, offset: int | None, noop: bool, took_over: bool) -> int:
        ticking = self.ticking()
        if noop:
            if self.last_noop_ms is not None:
                self.noop_gaps.append(ts_ms - self.last_noop_ms)
            self.last_noop_ms = ts_ms
        last = self.last_raw_ms
        if took_over and last is not None and self.writer is not None:
            resume = self.shifts.get(self.writer[1])
            if resume is not None:  # a controller back in office
                return self._resume(ts_ms, offset, last + self.shift_ms, resume)
        # After a step the record is placed the longest recent gap after its
        # predecessor: the true gap was shorter, so the continuous time runs a
        # little ahead of the old clock's, and every node's offset measured before
        # the step stays an upper bound after it.
        longest = max(self.gaps, default=0)
        back = self.back
        if back is not None:
            self.back = None
            before_ms, gap = back
            if ts_ms < before_ms:
                # The record after a step back stays behind too: the clock stepped.
                self.shift_ms += longest - gap
                if gap < -GAP_MS:
                    self.steps.append((offset, gap - longest))
                self.last_raw_ms = ts_ms
                return ts_ms + self.shift_ms
        if last is not None:
            gap = ts_ms - last
            if gap < 0:
                # A record stamped before its predecessor: a step back if the next one
                # stays behind as well; until then it takes its predecessor's time.
                self.back = (last, gap)
                return last + self.shift_ms
            if ticking and gap > max(GAP_MS, 4 * longest) and not took_over:
                self.shift_ms -= gap - longest
                self.steps.append((offset, gap - longest))
            elif not took_over:  # an election's silence is not the log's beat
                self.gaps.append(gap)
        self.last_raw_ms = ts_ms
        return ts_ms + self.shift_ms

    def _resume(self, ts_ms: int, offset: int | None, before_ms: int, resume: int) -> int:
        """The first record of a controller back in office, placed with the shift
        it left with, ``resume``, after its predecessor placed at ``before_ms``.
        A silence before it is the election's (its clock may have stepped forward
        meanwhile as well: ClockBook.taken_over allows that)."""
        self.back = None
        placed = ts_ms + resume
        if placed < before_ms:
            # The shift it left with was a guess ahead of the true gap there, or
            # its clock stepped back since: no further than the predecessor, or
            # the guesses would add up at every hand-over.
            placed = before_ms
        moved = self.shift_ms - (placed - ts_ms)
        if abs(moved) > GAP_MS:
            self.steps.append((offset, moved))
        self.shift_ms = placed - ts_ms
        self.last_raw_ms = ts_ms
        return placed
