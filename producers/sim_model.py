"""The simulated KRaft cluster's state and the controller that changes it.

Every change is written as the metadata record Kafka's controller would write
and applied to this model with Kafka's epoch arithmetic, kept independently of
the detector so that a disagreement between the two shows up as a test failure.
"""

from __future__ import annotations

import base64
import bisect
import math
import random
from dataclasses import dataclass, field
from typing import Any

from producers import shapes
from producers.sim_clocks import Clocks

MV_3_6_IV0 = 12
CONTROLLER_IDS = (3000, 3001, 3002)


@dataclass
class Broker:
    epoch: int
    fenced: bool = True
    shutting_down: bool = False
    registered: bool = True

    @property
    def eligible(self) -> bool:
        return self.registered and not self.fenced and not self.shutting_down


@dataclass
class Partition:
    topic: str
    topic_id: str
    index: int
    replicas: list[int]
    isr: list[int]
    leader: int
    leader_epoch: int = 0
    partition_epoch: int = 0
    epoch_changed_ms: int = 0  # true time of the last leader-epoch change
    leader_changed_ms: int = 0
    previous_leader: int = -1
    # KIP-1272 cleaner offsets: leader epoch -> how far that epoch's cleaner got (frozen once it ends)
    cleaner: dict[int, int] = field(default_factory=dict)
    segments: list[str] = field(default_factory=list)  # finished, not deleted, oldest first
    zombie_segments: set[str] = field(default_factory=set)  # injected invalid uploads
    next_offset: int = 0
    # After an injected fault the partition keeps its epochs until the fault's grace
    # window has passed, so the fault's verdict cannot be changed by later traffic.
    frozen_until_ms: int = 0


@dataclass
class Raft:
    voters: tuple[int, ...] = CONTROLLER_IDS
    leader: int = CONTROLLER_IDS[0]
    epoch: int = 1
    elected_ms: int = 0
    previous_leader: int = -1
    frozen_until_ms: int = 0  # no election until then (an injected quorum fault is playing out)
    # (true time, leader) from the first leader on, one entry per election: whose
    # clock stamps the metadata log when (ClusterModel.metadata_clock_node)
    history: list[tuple[int, int]] = field(default_factory=list)
    # true times of forced elections still to come (SimConfig.failovers): quorum
    # faults keep clear of them
    forced_ms: list[int] = field(default_factory=list)
    # [start, end) true-time windows in which the metadata log writes nothing: a
    # forced election's silence (producers.sim_clocks.Failover.silence_ms)
    silences: list[tuple[int, int]] = field(default_factory=list)

    def silent(self, true_ms: int) -> bool:
        """Is the metadata log silent at ``true_ms`` (no leader serving yet)?"""
        return any(start <= true_ms < end for start, end in self.silences)

    def silence_ended_ms(self, true_ms: int) -> int:
        """When the last silence begun by ``true_ms`` ends (may be later); 0 if none began."""
        return max((end for start, end in self.silences if start <= true_ms), default=0)

    def elected(self, leader: int, epoch: int, true_ms: int) -> None:
        """``leader`` won ``epoch`` at ``true_ms``."""
        self.previous_leader, self.leader, self.epoch, self.elected_ms = self.leader, leader, epoch, true_ms
        self.history.append((true_ms, leader))


# How long a simulated request takes from arrival to response: its
# ``totalTimeMs``, rounded up as the detector rounds it.
HANDLING_MS = math.ceil(shapes.TOTAL_TIME_MS)


def stamped_at(true_ms: int, kind: str, handling_ms: int = HANDLING_MS) -> int:
    """The true time at which an envelope emitted at ``true_ms`` is stamped. A
    request arrives at ``true_ms`` and is handled on the state of then; Kafka's
    request log stamps its line when the response completes (RequestChannel),
    ``totalTimeMs`` later. Stamped at arrival, it would show knowledge of records
    written while it was handled, before it arrived by its own time."""
    return true_ms + handling_ms if kind == "request" else true_ms


class ClusterModel:
    """State plus the emitter: ``emit`` records an envelope at true time
    ``true_ms``, stamped by the clock of the node that wrote it: true time plus
    the node's base skew plus its clock faults (``clocks``)."""

    def __init__(
        self,
        cluster: str,
        rng: random.Random,
        *,
        skew_ms: int,
        metadata_version: int,
        clocks: Clocks | None = None,
        handling_ms: int = HANDLING_MS,
    ):
        self.cluster = cluster
        self.rng = rng
        self.metadata_version = metadata_version
        self.brokers: dict[int, Broker] = {}
        self.partitions: dict[tuple[str, int], Partition] = {}
        self.topics: dict[str, str] = {}  # name -> topic id
        self.raft = Raft()
        self.accepted_controller_epoch: dict[int, int] = {}
        self.clock_skew: dict[int, int] = {}
        self.skew_ms = skew_ms
        self.clocks = clocks if clocks is not None else Clocks((), 0)
        self.handling_ms = handling_ms
        self.metadata_offset = 0
        self.correlation = 0
        self.segment_seq = 0
        self.topics_created = 0
        # (true time, envelope): the simulator releases them in true-time order
        self.out: list[tuple[int, dict[str, Any]]] = []

    # ---- emitting ---------------------------------------------------------------------------

    def node_ts(self, node: int, true_ms: int) -> int:
        """What ``node``'s clock says at ``true_ms``: a fixed base skew, drawn
        when the node first writes, plus its clock faults."""
        skew = self.clock_skew.get(node)
        if skew is None:
            skew = self.clock_skew[node] = self.rng.randint(-self.skew_ms, self.skew_ms)
        return true_ms + skew + self.clocks.offset_ms(node, true_ms)

    def clock_ms(self, node: int, true_ms: int) -> int:
        """What ``node``'s clock says (said, will say) at ``true_ms``, without
        drawing anything: ValueError for a node that has not written yet, whose
        base skew is not drawn."""
        skew = self.clock_skew.get(node)
        if skew is None:
            raise ValueError(f"node {node} has written nothing yet: its clock's base skew is not drawn")
        return true_ms + skew + self.clocks.offset_ms(node, true_ms)

    def metadata_clock_node(self, true_ms: int) -> int:
        """The active controller at ``true_ms``, whose clock stamps the metadata
        log (its CreateTime). An election takes effect from its true time on;
        a record written in the same millisecond just before it is the one
        exception (random elections only; a forced one comes first)."""
        history = self.raft.history
        if not history:
            return self.raft.leader
        i = bisect.bisect_right(history, true_ms, key=lambda entry: entry[0]) - 1
        return history[max(i, 0)][1]

    def emit(self, kind: str, true_ms: int, body: dict[str, Any], node: int | None = None) -> int:
        """Record one envelope; returns its ``ts_ms``, stamped by the clock of
        the node that wrote it.
        Metadata offsets follow emission order, so a composite change must be
        emitted in its true-time order."""
        offset = None
        if kind == "metadata":
            if self.raft.silent(true_ms):
                raise RuntimeError(
                    f"a metadata record at true time {true_ms} inside an election's silence "
                    f"{self.raft.silences}: whatever writes metadata must wait for its end"
                )
            # CreateTime is the active controller's clock, the same clock as its request log.
            self.metadata_offset += 1
            offset, ts_ms = self.metadata_offset, self.node_ts(self.raft.leader, true_ms)
        else:
            assert node is not None
            ts_ms = self.node_ts(node, stamped_at(true_ms, kind, self.handling_ms))
        self.out.append((true_ms, shapes.envelope(self.cluster, kind, ts_ms, body, node=node, offset=offset)))
        return ts_ms

    def next_correlation(self) -> int:
        self.correlation += 1
        return self.correlation

    # ---- the controller's decisions, as metadata records --------------------------------------

    def register(self, broker_id: int, true_ms: int) -> None:
        old = self.brokers.get(broker_id)
        epoch = (old.epoch if old else 0) + 100 + self.rng.randint(1, 50)
        self.brokers[broker_id] = Broker(epoch)
        self.emit("metadata", true_ms, shapes.register_broker(broker_id, epoch))

    def set_fenced(self, broker_id: int, fenced: bool, true_ms: int) -> None:
        broker = self.brokers[broker_id]
        broker.fenced = fenced
        self.emit(
            "metadata", true_ms, shapes.broker_change(broker_id, broker.epoch, fenced=1 if fenced else -1)
        )

    def begin_shutdown(self, broker_id: int, true_ms: int) -> None:
        broker = self.brokers[broker_id]
        broker.shutting_down = True
        self.emit("metadata", true_ms, shapes.broker_change(broker_id, broker.epoch, shutdown=True))

    def create_topic(self, name: str, partitions: int, replication: int, true_ms: int) -> None:
        topic_id = base64.urlsafe_b64encode(self.rng.randbytes(16)).decode().rstrip("=")
        self.topics[name] = topic_id
        self.topics_created += 1
        self.emit("metadata", true_ms, shapes.topic(name, topic_id))
        active = sorted(b for b, s in self.brokers.items() if s.eligible)
        for index in range(partitions):
            replicas = self.rng.sample(sorted(self.brokers), replication)
            isr = [r for r in replicas if r in active]  # KIP-841: only active replicas join at creation
            leader = isr[0] if isr else -1
            p = Partition(
                name,
                topic_id,
                index,
                replicas,
                isr,
                leader,
                epoch_changed_ms=true_ms,
                leader_changed_ms=true_ms,
            )
            self.partitions[(name, index)] = p
            self.emit("metadata", true_ms, shapes.partition(topic_id, index, replicas, isr, leader))

    def change_partition(
        self,
        p: Partition,
        true_ms: int,
        *,
        leader: int | None = None,
        isr: list[int] | None = None,
        replicas: list[int] | None = None,
    ) -> int:
        """Write a PARTITION_CHANGE_RECORD and apply Kafka's epoch arithmetic to
        the model. Returns the record's ``ts_ms``."""
        bump = leader is not None
        if isr is not None and not set(isr) >= set(p.isr) and self.metadata_version < MV_3_6_IV0:
            bump = True
        if replicas is not None and not set(replicas) >= set(p.replicas):
            bump = True
        ts_ms = self.emit(
            "metadata",
            true_ms,
            shapes.partition_change(p.topic_id, p.index, leader=leader, isr=isr, replicas=replicas),
        )
        p.partition_epoch += 1
        if leader is not None and leader != p.leader:
            p.previous_leader = p.leader
            p.leader = leader
            p.leader_changed_ms = true_ms
        if bump:
            p.leader_epoch += 1
            p.epoch_changed_ms = true_ms
        if isr is not None:
            p.isr = list(isr)
        if replicas is not None:
            p.replicas = list(replicas)
        return ts_ms

    def stable(self, p: Partition, true_ms: int, margin_ms: int) -> bool:
        """No leader-epoch change within ``margin_ms`` before ``true_ms``."""
        return true_ms - p.epoch_changed_ms > margin_ms

    def movable(self, p: Partition, true_ms: int) -> bool:
        """May legitimate traffic change this partition now?"""
        return true_ms >= p.frozen_until_ms
