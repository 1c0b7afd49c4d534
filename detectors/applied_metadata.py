"""How far each broker had applied the metadata log, by its own word.

A broker applies the metadata log asynchronously, and may trail the
controllers' log by much more than the grace window: Kafka 4.4.0 brokers
trailed it by up to 14 s after a clean shutdown or a pause past
``replica.lag.time.max.ms`` (``fencewatch kafka-lab --nemesis``). A rule that
blames a broker for acting on a state it should have known superseded is
right only if the broker had applied the record that superseded it.

Every BrokerHeartbeat tells how far: ``currentMetadataOffset`` is the
broker's ``MetadataLoader.lastAppliedOffset()`` when it sent the heartbeat
(BrokerLifecycleManager.sendBrokerHeartbeat, BrokerServer), which the loader
raises only after every publisher, the broker's ReplicaManager among them,
has taken the image up to it (MetadataLoader.maybePublishMetadata). The
active controller handles each heartbeat (QuorumController.processBrokerHeartbeat)
and its request log records it. So by the moment the heartbeat reached the
active controller, the broker had applied every record up to that offset.

That holds across a broker's restarts as well: a new incarnation serves no
request before the controller found it caught up with its own registration
record (BrokerServer starts request processing after
``BrokerLifecycleManager.initialCatchUpFuture``, which a heartbeat answered
``isCaughtUp`` completes: ReplicationControlManager.processBrokerHeartbeat,
``currentMetadataOffset >= registerBrokerRecordOffset``, the test by which
BrokerHeartbeatManager.calculateNextBrokerState unfences it too), a record
written after everything the old incarnation could have reported. So the highest
offset a broker reported by a moment bounds what it had applied then,
whichever incarnation served.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Callable
from dataclasses import dataclass

from detectors.alerts import Evidence
from detectors.history import History
from detectors.view import PartitionState


@dataclass(slots=True)
class _Reports:
    """One broker's reports, as a staircase: times rising and offsets rising,
    each report that raised the highest offset reported by its time."""

    times: list[int]
    offsets: list[int]
    evidence: list[Evidence]


class AppliedMetadata:
    """Per broker, the highest metadata offset it had applied by a moment of
    the metadata log's clock, as its heartbeats reported it."""

    __slots__ = ("_brokers", "retention_ms")

    def __init__(self, retention_ms: int):
        self.retention_ms = retention_ms
        self._brokers: dict[int, _Reports] = {}

    def heard(self, broker: int, placed_ms: int, offset: int, evidence: Evidence) -> None:
        """``broker`` had applied up to ``offset`` by ``placed_ms``. Reports of
        several controllers' logs may arrive out of time order: a report is
        kept only where it raises the highest offset reported by its time."""
        reports = self._brokers.get(broker)
        if reports is None:
            self._brokers[broker] = _Reports([placed_ms], [offset], [evidence])
            return
        times, offsets = reports.times, reports.offsets
        at = bisect_right(times, placed_ms)
        if at and offsets[at - 1] >= offset:
            return  # an earlier report said as much
        # Later reports of no higher offset say no more than this one.
        end = at
        while end < len(times) and offsets[end] <= offset:
            end += 1
        times[at:end] = [placed_ms]
        offsets[at:end] = [offset]
        reports.evidence[at:end] = [evidence]
        # What was superseded before the retention window is asked of no more.
        keep = bisect_right(times, placed_ms - self.retention_ms) - 1
        if keep > 0:
            del times[:keep], offsets[:keep], reports.evidence[:keep]

    def applied_by(self, broker: int | None, moment_ms: int) -> tuple[int, Evidence] | None:
        """The highest offset ``broker`` reported by ``moment_ms``, and the
        report; None if it reported none by then."""
        reports = self._brokers.get(broker) if broker is not None else None
        if reports is None:
            return None
        at = bisect_right(reports.times, moment_ms)
        return (reports.offsets[at - 1], reports.evidence[at - 1]) if at else None


@dataclass(frozen=True, slots=True)
class EpochAbove:
    """A state that supersedes leader epoch ``epoch``: a newer one."""

    epoch: int

    def __call__(self, state: PartitionState) -> bool:
        return state.leader_epoch > self.epoch


@dataclass(frozen=True, slots=True)
class LedByOther:
    """A state that supersedes ``broker``'s leadership: another leader (or none)."""

    broker: int | None

    def __call__(self, state: PartitionState) -> bool:
        return state.leader != self.broker


def superseding_offset(
    history: History[PartitionState], first: PartitionState, stale: Callable[[PartitionState], bool]
) -> int | None:
    """The metadata offset a broker must have applied to know that what it
    acted on was superseded: that of the earliest state of the run of states
    ending with ``first`` (a judged window's first state) for which ``stale``
    holds, all of them superseding what the broker acted on. None when that
    state has no log offset (a snapshot's record, a ZooKeeper-mode request),
    and when ``first`` is not in ``history``."""
    _, states = history.items()
    at = len(states) - 1
    # Equal, not only the same object: a store may give a partition's history
    # anew at each read (streaming.state), and an older state's offset would
    # ask less of the broker than the one it acted against.
    while at >= 0 and states[at] is not first and states[at] != first:
        at -= 1
    if at < 0:
        return None
    while at > 0 and stale(states[at - 1]):
        at -= 1
    return states[at].source.offset
