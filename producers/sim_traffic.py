"""Legitimate cluster traffic: everything a healthy KRaft cluster does,
including the look-alikes of violations that the detector must NOT flag
(rejections, brokers acting on slightly stale metadata, fenced last ISR
members, pre-votes, retention deletes...)."""

from __future__ import annotations

from typing import Any

from producers import shapes
from producers.sim_model import ClusterModel, Partition

# Actions that need the active controller: they write metadata records, or the
# controller logs or sends their request (AlterPartition, StopReplica, the
# quorum's Fetch and elections). During an election's silence they wait
# (producers.simulator); the brokers' requests keep flowing.
CONTROLLER_ACTIONS = frozenset(
    {
        "isr_shrink",
        "isr_expand",
        "stale_alter_partition_rejected",
        "elect_leader",
        "fence",
        "unfence",
        "controlled_restart",
        "reassign",
        "create_topic",
        "delete_topic",
        "quorum_fetch",
        "raft_election",
    }
)

NONE, UNKNOWN_TOPIC_OR_PARTITION, NOT_LEADER_OR_FOLLOWER = 0, 3, 6
OPERATION_NOT_ATTEMPTED, FENCED_LEADER_EPOCH, INELIGIBLE_REPLICA = 55, 74, 107


class Traffic:
    """Legitimate actions. ``lag_ms`` bounds how late a broker may act on the
    previous view (kept well inside the detector's grace window)."""

    def __init__(self, model: ClusterModel, grace_ms: int, leader_changes: bool = True):
        self.m = model
        self.rng = model.rng
        self.lag_ms = grace_ms // 3
        self.leader_changes = leader_changes  # SimConfig.leader_change_records

    # ---- helpers ---------------------------------------------------------------------------

    def led_partition(self) -> Partition | None:
        p = self.rng.choice(list(self.m.partitions.values())) if self.m.partitions else None
        return p if p is not None and p.leader >= 0 else None

    def alter_partition(
        self,
        p: Partition,
        t: int,
        sender: int,
        new_isr: list[int],
        error: int,
        *,
        version: int = 3,
        leader_epoch: int | None = None,
        partition_epoch: int | None = None,
        broker_epoch: int | None = None,
        isr_epochs: dict[int, int] | None = None,
    ) -> int:
        """The controller's log line for an AlterPartition from ``sender``; when
        ``error`` is NONE the caller has already written the change record."""
        m = self.m
        epochs = isr_epochs if isr_epochs is not None else {b: m.brokers[b].epoch for b in new_isr}
        body = shapes.alter_partition(
            p.topic,
            p.topic_id,
            p.index,
            broker_id=sender,
            broker_epoch=m.brokers[sender].epoch if broker_epoch is None else broker_epoch,
            leader_epoch=p.leader_epoch if leader_epoch is None else leader_epoch,
            partition_epoch=p.partition_epoch if partition_epoch is None else partition_epoch,
            new_isr=new_isr,
            error=error,
            isr_epochs=epochs,
            version=version,
            result_leader=p.leader if error == NONE else -1,
            result_leader_epoch=p.leader_epoch if error == NONE else -1,
            result_partition_epoch=p.partition_epoch if error == NONE else -1,
            correlation_id=m.next_correlation(),
        )
        return m.emit("request", t, body, node=m.raft.leader)

    def accepted_isr_change(
        self, p: Partition, t: int, sender: int, new_isr: list[int], **request: Any
    ) -> int:
        """The controller accepts an AlterPartition: it writes the change record,
        then logs the request, which carried the epochs of the state it replaced
        unless ``request`` overrides them. Returns the log line's ``ts_ms``."""
        request.setdefault("leader_epoch", p.leader_epoch)
        request.setdefault("partition_epoch", p.partition_epoch)
        self.m.change_partition(p, t, isr=new_isr)
        return self.alter_partition(p, t, sender, new_isr, NONE, **request)

    def stop_replica(
        self,
        p: Partition,
        t: int,
        broker: int,
        leader_epoch: int,
        error: int,
        *,
        controller_epoch: int | None = None,
        delete: bool = False,
    ) -> int:
        m = self.m
        epoch = m.raft.epoch if controller_epoch is None else controller_epoch
        body = shapes.stop_replica(
            p.topic,
            p.index,
            leader_epoch,
            error,
            controller_epoch=epoch,
            controller_id=m.raft.leader,
            broker_epoch=m.brokers[broker].epoch,
            delete=delete,
            correlation_id=m.next_correlation(),
        )
        if error == NONE:
            m.accepted_controller_epoch[broker] = max(m.accepted_controller_epoch.get(broker, 0), epoch)
        return m.emit("request", t, body, node=broker)

    # ---- data plane ---------------------------------------------------------------------------

    def produce(self, t: int) -> None:
        p = self.led_partition()
        if p is None:
            return
        m, rng = self.m, self.rng
        acks = rng.choice((-1, -1, -1, 1))
        roll = rng.random()
        prev = p.previous_leader
        if roll < 0.08 and prev >= 0 and prev != p.leader and prev in m.brokers:
            # A client with stale metadata writes to the former leader, which accepts
            # only while it has not applied the election yet.
            lagging = t - p.leader_changed_ms < self.lag_ms
            body = shapes.produce(
                p.topic,
                p.index,
                NONE if lagging else NOT_LEADER_OR_FOLLOWER,
                epoch=p.leader_epoch - 1,
                acks=acks,
                correlation_id=m.next_correlation(),
            )
            m.emit("request", t, body, node=prev)
        elif roll < 0.12 and p.leader_epoch > 0:
            body = shapes.produce(
                p.topic,
                p.index,
                FENCED_LEADER_EPOCH,
                epoch=p.leader_epoch - 1,
                acks=acks,
                correlation_id=m.next_correlation(),
            )
            m.emit("request", t, body, node=p.leader)
        else:
            epoch = p.leader_epoch if rng.random() < 0.5 else None  # stock clients send no epoch
            body = shapes.produce(
                p.topic, p.index, NONE, epoch=epoch, acks=acks, correlation_id=m.next_correlation()
            )
            m.emit("request", t, body, node=p.leader)

    def produce_unknown_topic(self, t: int) -> None:
        broker = self.rng.choice(sorted(self.m.brokers))
        body = shapes.produce(
            "not-created-yet", 0, UNKNOWN_TOPIC_OR_PARTITION, acks=1, correlation_id=self.m.next_correlation()
        )
        self.m.emit("request", t, body, node=broker)

    def consumer_fetch(self, t: int) -> None:
        p = self.led_partition()
        if p is None:
            return
        stale = p.leader_epoch > 0 and self.rng.random() < 0.1
        epoch = p.leader_epoch - 1 if stale else (p.leader_epoch if self.rng.random() < 0.7 else -1)
        body = shapes.fetch(
            p.topic,
            p.index,
            FENCED_LEADER_EPOCH if stale else NONE,
            epoch=epoch,
            correlation_id=self.m.next_correlation(),
        )
        self.m.emit("request", t, body, node=p.leader)

    def follower_fetch(self, t: int) -> None:
        p = self.led_partition()
        if p is None or len(p.isr) < 2:
            return
        follower = self.rng.choice([r for r in p.isr if r != p.leader] or [p.leader])
        body = shapes.fetch(
            p.topic,
            p.index,
            NONE,
            epoch=p.leader_epoch,
            replica_id=follower,
            correlation_id=self.m.next_correlation(),
            client_id=f"replica-fetcher-{follower}",
        )
        self.m.emit("request", t, body, node=p.leader)

    def list_offsets(self, t: int) -> None:
        p = self.led_partition()
        if p is None:
            return
        body = shapes.list_offsets(
            p.topic, p.index, NONE, epoch=p.leader_epoch, correlation_id=self.m.next_correlation()
        )
        self.m.emit("request", t, body, node=p.leader)

    # ---- ISR and leadership ---------------------------------------------------------------------

    def isr_shrink(self, t: int) -> None:
        p = self.led_partition()
        m = self.m
        if p is None or len(p.isr) < 2 or not m.movable(p, t) or not m.brokers[p.leader].eligible:
            return
        new_isr = [r for r in p.isr if r != self.rng.choice([r for r in p.isr if r != p.leader])]
        if p.leader not in new_isr:
            return
        self.accepted_isr_change(p, t, p.leader, new_isr)

    def isr_expand(self, t: int) -> None:
        p = self.led_partition()
        m = self.m
        if p is None or not m.movable(p, t) or not m.brokers[p.leader].eligible:
            return
        outside = [r for r in p.replicas if r not in p.isr and m.brokers[r].registered]
        if not outside:
            return
        joiner = self.rng.choice(outside)
        new_isr = [*p.isr, joiner]
        if m.brokers[joiner].eligible:
            self.accepted_isr_change(p, t, p.leader, new_isr)
        else:
            # KIP-841: INELIGIBLE_REPLICA from v2, OPERATION_NOT_ATTEMPTED before.
            version = self.rng.choice((1, 3))
            self.alter_partition(
                p,
                t,
                p.leader,
                new_isr,
                INELIGIBLE_REPLICA if version >= 2 else OPERATION_NOT_ATTEMPTED,
                version=version,
            )

    def stale_alter_partition_rejected(self, t: int) -> None:
        p = self.led_partition()
        if (
            p is None
            or p.previous_leader < 0
            or p.previous_leader not in self.m.brokers
            or p.leader_epoch < 1
        ):
            return
        if not self.m.brokers[p.previous_leader].registered:
            return
        self.alter_partition(
            p, t, p.previous_leader, list(p.isr), FENCED_LEADER_EPOCH, leader_epoch=p.leader_epoch - 1
        )

    def elect_leader(self, t: int) -> None:
        p = self.led_partition()
        m = self.m
        if p is None or not m.movable(p, t):
            return
        candidates = [r for r in p.isr if r != p.leader and m.brokers[r].eligible]
        if not candidates:
            return
        old = p.leader
        m.change_partition(p, t, leader=self.rng.choice(candidates))
        if self.rng.random() < 0.5:
            # The old leader has not applied the election yet and still accepts a write.
            late = t + self.rng.randint(1, self.lag_ms)
            body = shapes.produce(
                p.topic, p.index, NONE, epoch=p.leader_epoch - 1, correlation_id=m.next_correlation()
            )
            m.emit("request", late, body, node=old)

    def _hosted(self, broker: int) -> list[Partition]:
        return [p for p in self.m.partitions.values() if broker in p.isr or p.leader == broker]

    def _evacuable_broker(self, t: int) -> int | None:
        """An active broker whose partitions may all move now, keeping three active."""
        m = self.m
        active = [b for b, s in m.brokers.items() if s.eligible]
        if len(active) <= 3:
            return None
        broker = self.rng.choice(active)
        return broker if all(m.movable(p, t) for p in self._hosted(broker)) else None

    def _evacuate(self, broker: int, t: int) -> None:
        """Move leadership and ISR membership off ``broker`` (fencing or shutdown).
        A broker that is the last ISR member stays in the ISR with no leader."""
        m = self.m
        hosted = self._hosted(broker)
        for p in hosted:
            rest = [r for r in p.isr if r != broker]
            eligible = [r for r in rest if m.brokers[r].eligible]
            if p.leader == broker:
                if eligible:
                    m.change_partition(p, t, leader=eligible[0], isr=rest)
                else:
                    m.change_partition(p, t, leader=-1)
            elif rest:
                m.change_partition(p, t, isr=rest)

    def fence(self, t: int) -> None:
        m = self.m
        broker = self._evacuable_broker(t)
        if broker is None:
            return
        m.set_fenced(broker, True, t)
        self._evacuate(broker, t)

    def unfence(self, t: int) -> None:
        m = self.m
        fenced = [b for b, s in m.brokers.items() if s.registered and s.fenced and not s.shutting_down]
        if not fenced:
            return
        broker = self.rng.choice(fenced)
        m.set_fenced(broker, False, t)
        for p in m.partitions.values():
            if p.leader == -1 and broker in p.isr and m.movable(p, t):
                m.change_partition(p, t, leader=broker)

    def controlled_restart(self, t: int) -> None:
        """Controlled shutdown (KIP-841 persists it), then a new incarnation."""
        m = self.m
        broker = self._evacuable_broker(t)
        if broker is None:
            return
        m.begin_shutdown(broker, t)
        self._evacuate(broker, t)
        m.set_fenced(broker, True, t)
        m.register(broker, t)
        m.set_fenced(broker, False, t)

    def reassign(self, t: int) -> None:
        """Replace one follower replica; the removed replica is stopped (KIP-570 v3)."""
        p = self.led_partition()
        m = self.m
        if p is None or not m.movable(p, t) or not m.brokers[p.leader].eligible:
            return
        spare = [b for b, s in m.brokers.items() if s.eligible and b not in p.replicas]
        leaving = [r for r in p.replicas if r != p.leader]
        if not spare or not leaving:
            return
        joiner, leaver = self.rng.choice(spare), self.rng.choice(leaving)
        m.change_partition(p, t, replicas=[*p.replicas, joiner])
        self.accepted_isr_change(p, t, p.leader, [*p.isr, joiner])
        m.change_partition(
            p, t, replicas=[r for r in p.replicas if r != leaver], isr=[r for r in p.isr if r != leaver]
        )
        # An equal epoch is accepted (KIP-570); some controllers still send no epoch (-1).
        epoch = p.leader_epoch if self.rng.random() < 0.8 else -1
        self.stop_replica(p, t, leaver, epoch, NONE)

    def create_topic(self, t: int) -> None:
        # Fresh names: a name reused within a grace window is ambiguous to a
        # name-addressed request from a lagging broker (docs/rules.md).
        self.m.create_topic(f"topic-{self.m.topics_created}", self.rng.randint(2, 6), 3, t)

    def delete_topic(self, t: int, reject_sentinel_at: int | None = None) -> list[tuple[int, str, int, int]]:
        """Delete a topic; every replica is stopped with the -2 sentinel. Returns
        ``(ts_ms, topic, partition, broker)`` of sentinel answers that were
        FENCED_LEADER_EPOCH (only when a fault asks for one)."""
        m = self.m
        if len(m.topics) <= 2:
            return []
        name = self.rng.choice(sorted(m.topics))
        parts = [p for p in m.partitions.values() if p.topic == name]
        if any(not m.movable(p, t) for p in parts):
            return []
        m.emit("metadata", t, shapes.remove_topic(m.topics.pop(name)))
        rejected: list[tuple[int, str, int, int]] = []
        for p in parts:
            del m.partitions[(name, p.index)]
            for broker in p.replicas:
                if not m.brokers[broker].registered:
                    continue
                reject = reject_sentinel_at is not None and not rejected
                ts = self.stop_replica(p, t, broker, -2, FENCED_LEADER_EPOCH if reject else NONE, delete=True)
                if reject:
                    rejected.append((ts, name, p.index, broker))
        return rejected

    # ---- the metadata quorum (KIP-595) -----------------------------------------------------------

    def quorum_fetch(self, t: int) -> None:
        m = self.m
        fetchers = [v for v in m.raft.voters if v != m.raft.leader] + sorted(m.brokers)[:2]
        replica = self.rng.choice(fetchers)
        body = shapes.quorum_fetch(m.raft.leader, m.raft.epoch, replica, correlation_id=m.next_correlation())
        m.emit("request", t, body, node=m.raft.leader)

    def raft_election(
        self,
        t: int,
        *,
        old_leader_partitioned: bool = False,
        candidate: int | None = None,
        old_leader_lost: bool = False,
    ) -> dict[str, int]:
        """Elect a new quorum leader: pre-votes, votes, persisted states,
        BeginQuorumEpoch. With ``old_leader_partitioned`` the old leader is cut off
        away and hears nothing of it. ``candidate`` wins (a forced failover's
        ``--failover-to``; the leader itself is re-elected in a new epoch), else
        a voter other than the leader, picked by the seed. ``old_leader_lost``:
        the election ends an election's silence (the old leader crashed), so the
        deposed leader serves no late fetch. Returns the nodes a fault needs."""
        m = self.m
        raft = m.raft
        old, epoch = raft.leader, raft.epoch + 1
        if candidate is None:
            candidate = self.rng.choice([v for v in raft.voters if v != old])
        reachable = [v for v in raft.voters if v != candidate and (not old_leader_partitioned or v != old)]
        out: dict[str, int] = {"old": old, "candidate": candidate, "epoch": epoch}
        for voter in reachable:  # pre-votes do not bind (KIP-996)
            m.emit(
                "request",
                t,
                shapes.vote(
                    candidate, epoch, True, pre_vote=True, voter=voter, correlation_id=m.next_correlation()
                ),
                node=voter,
            )
        m.emit(
            "quorum_state", t, shapes.quorum_state(-1, epoch, candidate, list(raft.voters)), node=candidate
        )
        for voter in reachable:
            m.emit(
                "request",
                t,
                shapes.vote(candidate, epoch, True, voter=voter, correlation_id=m.next_correlation()),
                node=voter,
            )
            m.emit(
                "quorum_state", t, shapes.quorum_state(-1, epoch, candidate, list(raft.voters)), node=voter
            )
        m.emit(
            "quorum_state",
            t,
            shapes.quorum_state(candidate, epoch, candidate, list(raft.voters)),
            node=candidate,
        )
        for voter in reachable:
            m.emit(
                "request",
                t,
                shapes.begin_quorum_epoch(candidate, epoch, correlation_id=m.next_correlation()),
                node=voter,
            )
            m.emit(
                "quorum_state",
                t,
                shapes.quorum_state(candidate, epoch, candidate, list(raft.voters)),
                node=voter,
            )
        if (
            not old_leader_partitioned
            and not old_leader_lost
            and old != candidate
            and self.rng.random() < 0.5
        ):
            # The deposed leader may serve one more fetch before it learns of the election.
            late = t + self.rng.randint(1, self.lag_ms)
            m.emit(
                "request",
                late,
                shapes.quorum_fetch(
                    old, epoch - 1, sorted(m.brokers)[0], correlation_id=m.next_correlation()
                ),
                node=old,
            )
        raft.elected(candidate, epoch, t)
        if self.leader_changes:
            # The new leader's first record, by its own clock (KafkaRaftClient.onBecomeLeader).
            granting = [candidate, *(v for v in reachable if v in raft.voters)]
            m.emit("metadata", t, shapes.leader_change(epoch, candidate, list(raft.voters), granting))
        return out

    # ---- tiered storage ------------------------------------------------------------------------

    def _new_segment_id(self) -> str:
        self.m.segment_seq += 1
        return f"seg-{self.m.segment_seq:08d}"

    def upload(self, t: int, p: Partition | None = None) -> str | None:
        """The leader copies a compacted segment; its cleaner-offset map carries
        the ended epochs' frozen ends and the current epoch's progress."""
        p = p or self.led_partition()
        m = self.m
        if p is None or not m.brokers[p.leader].registered:
            return None
        start = p.next_offset
        p.next_offset += self.rng.randint(100, 1000)
        previous = max((o for e, o in p.cleaner.items() if e < p.leader_epoch), default=0)
        p.cleaner[p.leader_epoch] = max(p.cleaner.get(p.leader_epoch, previous), start) + self.rng.randint(
            1, 50
        )
        segment = self._new_segment_id()
        for state in ("COPY_SEGMENT_STARTED", "COPY_SEGMENT_FINISHED"):
            body = (
                shapes.remote_segment(
                    p.topic_id,
                    p.index,
                    segment,
                    broker_id=p.leader,
                    start=start,
                    end=p.next_offset - 1,
                    leader_epochs={p.leader_epoch: start},
                    cleaner=p.cleaner,
                    topic_name=p.topic,
                )
                if state == "COPY_SEGMENT_STARTED"
                else shapes.remote_update(p.topic_id, p.index, segment, broker_id=p.leader, state=state)
            )
            m.emit("remote_log_metadata", t, body, node=p.leader)
        p.segments.append(segment)
        return segment

    def delete_segment(
        self, t: int, p: Partition, segment: str, broker: int, *, skip_start: bool = False
    ) -> int:
        ts = 0
        states = (
            ("DELETE_SEGMENT_FINISHED",)
            if skip_start
            else ("DELETE_SEGMENT_STARTED", "DELETE_SEGMENT_FINISHED")
        )
        for state in states:
            ts = self.m.emit(
                "remote_log_metadata",
                t,
                shapes.remote_update(p.topic_id, p.index, segment, broker_id=broker, state=state),
                node=broker,
            )
        if segment in p.segments:
            p.segments.remove(segment)
        return ts

    def retention(self, t: int) -> None:
        p = self.led_partition()
        if p is None or not p.segments or not self.m.brokers[p.leader].registered or not self.m.movable(p, t):
            return
        self.delete_segment(t, p, p.segments[0], p.leader)

    def failed_upload(self, t: int) -> None:
        """An upload that fails is cleaned up: COPY_STARTED -> DELETE_STARTED is allowed."""
        p = self.led_partition()
        if p is None or not self.m.brokers[p.leader].registered:
            return
        segment = self._new_segment_id()
        body = shapes.remote_segment(
            p.topic_id,
            p.index,
            segment,
            broker_id=p.leader,
            start=p.next_offset,
            end=p.next_offset + 10,
            leader_epochs={p.leader_epoch: p.next_offset},
            cleaner=p.cleaner,
            topic_name=p.topic,
        )
        self.m.emit("remote_log_metadata", t, body, node=p.leader)
        p.segments.append(segment)
        self.delete_segment(t, p, segment, p.leader)
