"""Fault injection: one injector per rule. Each writes the violating outcome in
Kafka's native shape and records what it injected (the ground truth), with the
fields an alert is matched on (``detectors.truth.MATCH_FIELDS``).

An injector returns False when the cluster is not in a state that allows the
fault now (e.g. no former leader to play the zombie); the simulator tries again
later. Injected partitions are frozen for the grace window so later traffic
cannot turn the violation into a legitimate history."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from producers import shapes
from producers.sim_model import ClusterModel, Partition
from producers.sim_traffic import (
    FENCED_LEADER_EPOCH,
    INELIGIBLE_REPLICA,
    NONE,
    OPERATION_NOT_ATTEMPTED,
    Traffic,
)

UNKNOWN_LEADER_EPOCH = 75

# Faults whose violating outcome the active controller writes, logs or sends
# (metadata records, AlterPartition and StopReplica lines, elections): none is
# injected during an election's silence, when no controller serves
# (producers.sim_clocks.Failover.silence_ms). The brokers' own violations
# (produce, fetch, remote log metadata) may still happen then.
CONTROLLER_RULES = frozenset(
    {
        "STOP_REPLICA_STALE_EPOCH_APPLIED",
        "STOP_REPLICA_DELETE_SENTINEL_REJECTED",
        "STOP_REPLICA_CURRENT_EPOCH_REJECTED",
        "STOP_REPLICA_STALE_CONTROLLER_ACCEPTED",
        "ISR_INELIGIBLE_REPLICA_ADMITTED",
        "LEADER_INELIGIBLE_ELECTED",
        "ALTER_PARTITION_STALE_EPOCH_ACCEPTED",
        "ALTER_PARTITION_STALE_BROKER_EPOCH_ACCEPTED",
        "ALTER_PARTITION_ERROR_VERSION_MISMATCH",
        "QUORUM_TWO_LEADERS_IN_EPOCH",
        "QUORUM_EPOCH_REGRESSION",
        "QUORUM_DOUBLE_VOTE",
        "QUORUM_ZOMBIE_LEADER",
    }
)


class Faults:
    def __init__(
        self, model: ClusterModel, traffic: Traffic, grace_ms: int, skew_ms: int, clock_slack_ms: int
    ):
        self.m = model
        self.traffic = traffic
        self.rng = model.rng
        # Far enough from any change that no grace window reaches it, widened by the
        # clock skew and by the slack the detector allows a broker's measured clock
        # (detectors.clocks: it judges every moment the clock's interval allows).
        self.margin_ms = grace_ms + 2 * skew_ms + clock_slack_ms + 200
        # How long a quorum fault holds the quorum, at most (zombie_quorum_leader's).
        self.quorum_span_ms = 2 * self.margin_ms + 600
        self.truth: list[dict[str, Any]] = []
        self.usurped: set[tuple[int, int]] = set()
        self.injectors: dict[str, Callable[[int], bool]] = {
            "PRODUCE_STALE_EPOCH_ACCEPTED": self.produce_stale_epoch,
            "PRODUCE_ACCEPTED_BY_NON_LEADER": self.produce_by_zombie,
            "PRODUCE_EPOCH_ERROR_MISMATCH": self.produce_error_mismatch,
            "FETCH_STALE_EPOCH_SERVED": self.fetch_stale_epoch,
            "STOP_REPLICA_STALE_EPOCH_APPLIED": self.stop_replica_stale_epoch,
            "STOP_REPLICA_DELETE_SENTINEL_REJECTED": self.stop_replica_sentinel_rejected,
            "STOP_REPLICA_CURRENT_EPOCH_REJECTED": self.stop_replica_current_rejected,
            "STOP_REPLICA_STALE_CONTROLLER_ACCEPTED": self.stop_replica_stale_controller,
            "ISR_INELIGIBLE_REPLICA_ADMITTED": self.ineligible_isr,
            "LEADER_INELIGIBLE_ELECTED": self.ineligible_leader,
            "ALTER_PARTITION_STALE_EPOCH_ACCEPTED": self.alter_partition_stale_epoch,
            "ALTER_PARTITION_STALE_BROKER_EPOCH_ACCEPTED": self.alter_partition_stale_broker_epoch,
            "ALTER_PARTITION_ERROR_VERSION_MISMATCH": self.alter_partition_wrong_error,
            "QUORUM_TWO_LEADERS_IN_EPOCH": self.two_leaders,
            "QUORUM_EPOCH_REGRESSION": self.epoch_regression,
            "QUORUM_DOUBLE_VOTE": self.double_vote,
            "QUORUM_ZOMBIE_LEADER": self.zombie_quorum_leader,
            "REMOTE_SEGMENT_ZOMBIE_UPLOAD_ACCEPTED": self.zombie_upload,
            "REMOTE_SEGMENT_ZOMBIE_DELETE": self.zombie_delete,
            "REMOTE_SEGMENT_INVALID_TRANSITION": self.invalid_transition,
        }

    # ---- bookkeeping ---------------------------------------------------------------------------

    def record(
        self,
        rule: str,
        ts_ms: int,
        node: int | None,
        p: Partition | None = None,
        status: str = "firing",
        *,
        true_ms: int,
    ) -> None:
        """One ground-truth record: ``ts_ms`` as the violating event's writer
        logged it (by its own clock; alerts are matched on it), ``true_ms``
        the simulated true time it happened."""
        self.truth.append(
            {
                "rule": rule,
                "status": status,
                "cluster": self.m.cluster,
                "node": node,
                "ts_ms": ts_ms,
                "true_ms": true_ms,
                "topic": p.topic if p else None,
                "partition": p.index if p else None,
            }
        )

    def freeze(self, p: Partition, t: int) -> None:
        p.frozen_until_ms = max(p.frozen_until_ms, t + self.margin_ms)

    def pick(self, want: Callable[[Partition], bool]) -> Partition | None:
        """A random partition satisfying ``want`` (a bounded number of tries)."""
        parts = list(self.m.partitions.values())
        for _ in range(20):
            if not parts:
                return None
            p = self.rng.choice(parts)
            if want(p):
                return p
        return None

    def settled(self, t: int) -> Callable[[Partition], bool]:
        """Led by a registered broker, epoch unchanged for the margin, not frozen."""
        m = self.m
        return lambda p: (
            p.leader >= 0
            and m.brokers[p.leader].registered
            and m.stable(p, t, self.margin_ms)
            and m.movable(p, t)
        )

    def deposed(self, t: int) -> Callable[[Partition], bool]:
        """Has a registered former leader that lost leadership more than the margin ago."""
        m = self.m
        return lambda p: (
            p.previous_leader >= 0
            and p.previous_leader != p.leader
            and p.leader >= 0
            and p.previous_leader in m.brokers
            and m.brokers[p.previous_leader].registered
            and t - p.leader_changed_ms > self.margin_ms
            and m.movable(p, t)
        )

    # ---- data plane (KIP-359, KIP-320) ----------------------------------------------------------

    def produce_stale_epoch(self, t: int) -> bool:
        p = self.pick(lambda q: self.settled(t)(q) and q.leader_epoch >= 1)
        if p is None:
            return False
        body = shapes.produce(
            p.topic, p.index, NONE, epoch=p.leader_epoch - 1, correlation_id=self.m.next_correlation()
        )
        self.record(
            "PRODUCE_STALE_EPOCH_ACCEPTED",
            self.m.emit("request", t, body, node=p.leader),
            p.leader,
            p,
            true_ms=t,
        )
        self.freeze(p, t)
        return True

    def produce_by_zombie(self, t: int) -> bool:
        p = self.pick(self.deposed(t))
        if p is None:
            return False
        body = shapes.produce(
            p.topic,
            p.index,
            NONE,
            epoch=self.rng.choice((None, p.leader_epoch - 1)),
            acks=self.rng.choice((-1, 1)),
            correlation_id=self.m.next_correlation(),
        )
        ts = self.m.emit("request", t, body, node=p.previous_leader)
        self.record("PRODUCE_ACCEPTED_BY_NON_LEADER", ts, p.previous_leader, p, true_ms=t)
        self.freeze(p, t)
        return True

    def produce_error_mismatch(self, t: int) -> bool:
        p = self.pick(self.settled(t))
        if p is None:
            return False
        # FENCED for the current epoch, or UNKNOWN for one that is not newer.
        error = self.rng.choice((FENCED_LEADER_EPOCH, UNKNOWN_LEADER_EPOCH))
        body = shapes.produce(
            p.topic, p.index, error, epoch=p.leader_epoch, correlation_id=self.m.next_correlation()
        )
        self.record(
            "PRODUCE_EPOCH_ERROR_MISMATCH",
            self.m.emit("request", t, body, node=p.leader),
            p.leader,
            p,
            true_ms=t,
        )
        self.freeze(p, t)
        return True

    def fetch_stale_epoch(self, t: int) -> bool:
        p = self.pick(lambda q: self.settled(t)(q) and q.leader_epoch >= 1)
        if p is None:
            return False
        body = shapes.fetch(
            p.topic, p.index, NONE, epoch=p.leader_epoch - 1, correlation_id=self.m.next_correlation()
        )
        self.record(
            "FETCH_STALE_EPOCH_SERVED", self.m.emit("request", t, body, node=p.leader), p.leader, p, true_ms=t
        )
        self.freeze(p, t)
        return True

    # ---- StopReplica (KIP-570) ----------------------------------------------------------------------

    def _follower(self, p: Partition) -> int | None:
        followers = [r for r in p.replicas if r != p.leader and self.m.brokers[r].registered]
        return self.rng.choice(followers) if followers else None

    def stop_replica_stale_epoch(self, t: int) -> bool:
        p = self.pick(lambda q: self.settled(t)(q) and q.leader_epoch >= 1)
        broker = self._follower(p) if p else None
        if p is None or broker is None:
            return False
        ts = self.traffic.stop_replica(p, t, broker, p.leader_epoch - 1, NONE)
        self.record("STOP_REPLICA_STALE_EPOCH_APPLIED", ts, broker, p, true_ms=t)
        self.freeze(p, t)
        return True

    def stop_replica_current_rejected(self, t: int) -> bool:
        p = self.pick(self.settled(t))
        broker = self._follower(p) if p else None
        if p is None or broker is None:
            return False
        ts = self.traffic.stop_replica(p, t, broker, p.leader_epoch, FENCED_LEADER_EPOCH)
        self.record("STOP_REPLICA_CURRENT_EPOCH_REJECTED", ts, broker, p, true_ms=t)
        self.freeze(p, t)
        return True

    def stop_replica_sentinel_rejected(self, t: int) -> bool:
        rejected = self.traffic.delete_topic(t, reject_sentinel_at=t)
        for ts, topic, index, broker in rejected:
            self.truth.append(
                {
                    "rule": "STOP_REPLICA_DELETE_SENTINEL_REJECTED",
                    "status": "firing",
                    "cluster": self.m.cluster,
                    "node": broker,
                    "ts_ms": ts,
                    "true_ms": t,  # delete_topic stops every replica at t
                    "topic": topic,
                    "partition": index,
                }
            )
        if rejected:
            self.traffic.create_topic(t)  # keep the cluster's size steady
        return bool(rejected)

    def stop_replica_stale_controller(self, t: int) -> bool:
        m = self.m
        p = self.pick(self.settled(t))
        broker = self._follower(p) if p else None
        if p is None or broker is None or m.raft.epoch < 2:
            return False
        # The broker first hears from the current controller, then accepts an older one.
        self.traffic.stop_replica(p, t, broker, p.leader_epoch, NONE)
        ts = self.traffic.stop_replica(
            p, t + 5, broker, p.leader_epoch, NONE, controller_epoch=m.raft.epoch - 1
        )
        self.record("STOP_REPLICA_STALE_CONTROLLER_ACCEPTED", ts, broker, true_ms=t + 5)
        self.freeze(p, t)
        return True

    # ---- ISR eligibility (KIP-841, KIP-903) ---------------------------------------------------------

    def _ineligible_replica(self, p: Partition, exclude: list[int]) -> int | None:
        m = self.m
        options = [
            r
            for r in p.replicas
            if r not in exclude and m.brokers[r].registered and not m.brokers[r].eligible
        ]
        return self.rng.choice(options) if options else None

    def ineligible_isr(self, t: int) -> bool:
        m = self.m
        p = self.pick(lambda q: m.movable(q, t) and self._ineligible_replica(q, q.isr) is not None)
        if p is not None:
            replica = self._ineligible_replica(p, p.isr)
            assert replica is not None
            ts = m.change_partition(p, t, isr=[*p.isr, replica])
            self.record("ISR_INELIGIBLE_REPLICA_ADMITTED", ts, replica, p, true_ms=t)
            self.freeze(p, t)
            return True
        # KIP-903 form: an eligible replica, but the leader sent a stale broker epoch for it.
        p = self.pick(
            lambda q: (
                self.settled(t)(q)
                and m.brokers[q.leader].eligible
                and any(r not in q.isr and m.brokers[r].eligible for r in q.replicas)
            )
        )
        if p is None:
            return False
        joiner = self.rng.choice([r for r in p.replicas if r not in p.isr and m.brokers[r].eligible])
        new_isr = [*p.isr, joiner]
        isr_epochs = {b: m.brokers[b].epoch for b in new_isr}
        isr_epochs[joiner] -= 7
        ts = self.traffic.accepted_isr_change(p, t, p.leader, new_isr, isr_epochs=isr_epochs)
        self.record("ISR_INELIGIBLE_REPLICA_ADMITTED", ts, joiner, p, true_ms=t)
        self.freeze(p, t)
        return True

    def ineligible_leader(self, t: int) -> bool:
        m = self.m
        p = self.pick(lambda q: m.movable(q, t) and self._ineligible_replica(q, [q.leader]) is not None)
        if p is None:
            return False
        replica = self._ineligible_replica(p, [p.leader])
        assert replica is not None
        ts = m.change_partition(p, t, leader=replica)
        self.record("LEADER_INELIGIBLE_ELECTED", ts, replica, p, true_ms=t)
        self.freeze(p, t)
        return True

    def _without_a_follower(self, p: Partition) -> list[int]:
        follower = self.rng.choice([x for x in p.isr if x != p.leader])
        return [r for r in p.isr if r != follower]

    def _shrinkable(self, t: int) -> Callable[[Partition], bool]:
        m = self.m
        return lambda q: (
            self.settled(t)(q) and m.brokers[q.leader].eligible and len(q.isr) >= 2 and q.leader in q.isr
        )

    def alter_partition_stale_epoch(self, t: int) -> bool:
        """A deposed leader's ISR change with its old epochs, accepted."""
        m = self.m
        p = self.pick(lambda q: self.deposed(t)(q) and len(q.isr) >= 2 and q.leader in q.isr)
        if p is None:
            return False
        zombie = p.previous_leader
        new_isr = self._without_a_follower(p)
        ts = self.traffic.accepted_isr_change(
            p, t, zombie, new_isr, leader_epoch=p.leader_epoch - 1, partition_epoch=p.partition_epoch - 1
        )
        self.record("ALTER_PARTITION_STALE_EPOCH_ACCEPTED", ts, m.raft.leader, p, true_ms=t)
        self.freeze(p, t)
        return True

    def alter_partition_stale_broker_epoch(self, t: int) -> bool:
        m = self.m
        p = self.pick(self._shrinkable(t))
        if p is None:
            return False
        new_isr = self._without_a_follower(p)
        ts = self.traffic.accepted_isr_change(
            p, t, p.leader, new_isr, broker_epoch=m.brokers[p.leader].epoch - 3
        )
        self.record("ALTER_PARTITION_STALE_BROKER_EPOCH_ACCEPTED", ts, m.raft.leader, true_ms=t)
        self.freeze(p, t)
        return True

    def alter_partition_wrong_error(self, t: int) -> bool:
        m = self.m
        p = self.pick(lambda q: q.leader >= 0 and m.brokers[q.leader].registered)
        if p is None:
            return False
        ineligible = self._ineligible_replica(p, p.isr)
        if ineligible is not None and self.rng.random() < 0.5:
            ts = self.traffic.alter_partition(
                p, t, p.leader, [*p.isr, ineligible], OPERATION_NOT_ATTEMPTED, version=3
            )
        else:
            ts = self.traffic.alter_partition(p, t, p.leader, list(p.isr), INELIGIBLE_REPLICA, version=1)
        self.record("ALTER_PARTITION_ERROR_VERSION_MISMATCH", ts, m.raft.leader, p, true_ms=t)
        return True

    # ---- the metadata quorum (KIP-595) ------------------------------------------------------------

    def _raft_settled(self, t: int) -> bool:
        """No election for the margin, no election's silence ended within the
        margin (or still on), no quorum fault playing out, and no forced
        failover (``--failover-at``) due while one injected now would be."""
        raft = self.m.raft
        return (
            t - raft.elected_ms > self.margin_ms
            and t >= raft.frozen_until_ms
            and t - raft.silence_ended_ms(t) > self.margin_ms
            and not any(t <= forced <= t + self.quorum_span_ms for forced in raft.forced_ms)
        )

    def _freeze_raft(self, until_ms: int) -> None:
        self.m.raft.frozen_until_ms = max(self.m.raft.frozen_until_ms, until_ms)

    def _back_to_follower(self, node: int, t: int) -> None:
        """``node`` persists the true quorum state again, ending a quorum fault."""
        raft = self.m.raft
        state = shapes.quorum_state(raft.leader, raft.epoch, raft.leader, list(raft.voters))
        self.m.emit("quorum_state", t, state, node=node)

    def two_leaders(self, t: int) -> bool:
        m = self.m
        if not self._raft_settled(t):
            return False
        raft = m.raft
        usurper = self.rng.choice([v for v in raft.voters if v != raft.leader])
        if (raft.epoch, usurper) in self.usurped:
            return False  # the detector reports one usurpation per node and epoch
        self.usurped.add((raft.epoch, usurper))
        ts = m.emit(
            "quorum_state",
            t,
            shapes.quorum_state(usurper, raft.epoch, raft.leader, list(raft.voters)),
            node=usurper,
        )
        self._back_to_follower(usurper, t + 5)
        self.record("QUORUM_TWO_LEADERS_IN_EPOCH", ts, usurper, true_ms=t)
        self._freeze_raft(t + self.margin_ms)
        return True

    def epoch_regression(self, t: int) -> bool:
        m = self.m
        if not self._raft_settled(t):
            return False
        raft = m.raft
        follower = self.rng.choice([v for v in raft.voters if v != raft.leader])
        ts = m.emit(
            "quorum_state", t, shapes.quorum_state(-1, raft.epoch - 1, -1, list(raft.voters)), node=follower
        )
        self._back_to_follower(follower, t + 5)
        self.record("QUORUM_EPOCH_REGRESSION", ts, follower, true_ms=t)
        self._freeze_raft(t + self.margin_ms)
        return True

    def double_vote(self, t: int) -> bool:
        m = self.m
        if not self._raft_settled(t) or len(m.raft.voters) < 3:
            return False
        old = m.raft.leader
        # The double voter is the voter that is neither the old leader nor the candidate.
        out = self.traffic.raft_election(t)
        voter = next(v for v in m.raft.voters if v not in (out["candidate"], old))
        ts = m.emit(
            "request",
            t + 5,
            shapes.vote(old, out["epoch"], True, voter=voter, correlation_id=m.next_correlation()),
            node=voter,
        )
        self.record("QUORUM_DOUBLE_VOTE", ts, voter, true_ms=t + 5)
        self._freeze_raft(t + self.margin_ms)
        return True

    def zombie_quorum_leader(self, t: int) -> bool:
        m = self.m
        if not self._raft_settled(t):
            return False
        out = self.traffic.raft_election(t, old_leader_partitioned=True)
        old, epoch = out["old"], out["epoch"]
        late = t + self.margin_ms + 100
        fetcher = sorted(m.brokers)[0]
        ts = m.emit(
            "request",
            late,
            shapes.quorum_fetch(old, epoch - 1, fetcher, correlation_id=m.next_correlation()),
            node=old,
        )
        self.record("QUORUM_ZOMBIE_LEADER", ts, old, true_ms=late)
        step_down = m.emit(
            "quorum_state",
            late + 500,
            shapes.quorum_state(m.raft.leader, epoch, -1, list(m.raft.voters)),
            node=old,
        )
        self.record("QUORUM_ZOMBIE_LEADER", step_down, old, status="resolved", true_ms=late + 500)
        self._freeze_raft(late + 500 + self.margin_ms)
        return True

    # ---- tiered storage (KIP-1272) ----------------------------------------------------------------

    def zombie_upload(self, t: int) -> bool:
        """The deposed leader uploads a compaction claiming its ended epoch went
        further than the new leader's accepted segment established."""
        m = self.m
        p = self.pick(lambda q: self.deposed(t)(q) and any(e < q.leader_epoch for e in q.cleaner))
        if p is None:
            return False
        ended = max(e for e in p.cleaner if e < p.leader_epoch)
        claim = {e: o for e, o in p.cleaner.items() if e < ended}
        claim[ended] = p.cleaner[ended] + self.rng.randint(1, 50)
        zombie_first = self.rng.random() < 0.5
        if not zombie_first:
            self.traffic.upload(t, p)  # the new leader's segment establishes the end first
        self.m.segment_seq += 1
        segment = f"seg-{m.segment_seq:08d}"
        start = p.next_offset
        m.emit(
            "remote_log_metadata",
            t,
            shapes.remote_segment(
                p.topic_id,
                p.index,
                segment,
                broker_id=p.previous_leader,
                start=start,
                end=start + 99,
                leader_epochs={ended: start},
                cleaner=claim,
                topic_name=p.topic,
            ),
            node=p.previous_leader,
        )
        ts = m.emit(
            "remote_log_metadata",
            t,
            shapes.remote_update(
                p.topic_id, p.index, segment, broker_id=p.previous_leader, state="COPY_SEGMENT_FINISHED"
            ),
            node=p.previous_leader,
        )
        if zombie_first:
            self.traffic.upload(t, p)
        self.record("REMOTE_SEGMENT_ZOMBIE_UPLOAD_ACCEPTED", ts, p.previous_leader, p, true_ms=t)
        p.zombie_segments.add(segment)
        p.segments.append(segment)
        self.freeze(p, t)
        return True

    def zombie_delete(self, t: int) -> bool:
        deposed = self.deposed(t)
        p = self.pick(
            lambda q: (
                any(s not in q.zombie_segments for s in q.segments)
                and (deposed(q) or (self.settled(t)(q) and q.leader >= 0))
            )
        )
        if p is None:
            return False
        segment = next(s for s in p.segments if s not in p.zombie_segments)
        if deposed(p) and self.rng.random() < 0.7:
            ts = self.traffic.delete_segment(t, p, segment, p.previous_leader)
            self.record("REMOTE_SEGMENT_ZOMBIE_DELETE", ts, p.previous_leader, p, true_ms=t)
        else:
            ts = self.traffic.delete_segment(t, p, segment, p.leader, skip_start=True)
            self.record("REMOTE_SEGMENT_ZOMBIE_DELETE", ts, p.leader, p, true_ms=t)
        self.freeze(p, t)
        return True

    def invalid_transition(self, t: int) -> bool:
        """A finished segment moves back to COPY_SEGMENT_STARTED; the leader then cleans it up."""
        m = self.m
        p = self.pick(lambda q: self.settled(t)(q) and any(s not in q.zombie_segments for s in q.segments))
        if p is None:
            return False
        segment = next(s for s in p.segments if s not in p.zombie_segments)
        ts = m.emit(
            "remote_log_metadata",
            t,
            shapes.remote_update(
                p.topic_id, p.index, segment, broker_id=p.leader, state="COPY_SEGMENT_STARTED"
            ),
            node=p.leader,
        )
        self.record("REMOTE_SEGMENT_INVALID_TRANSITION", ts, p.leader, p, true_ms=t)
        self.traffic.delete_segment(t, p, segment, p.leader)
        self.freeze(p, t)
        return True
