"""The failures production meets, inflicted on a local cluster on purpose:
bounded in time and repeatable by seed.

:func:`plan` turns a seed into a schedule: which faults, in which order, on
which broker, after which pause. The same seed, duration and cluster give the
same schedule. :class:`Nemesis` runs it fault after fault (each waits for the
cluster to be whole again before the next starts, so faults never pile up into
a cluster that cannot recover), and writes each fault with its wall-clock start
and end to a JSON-lines schedule file, for the operator to put beside
fencewatch's alerts. The active controller is found when its fault comes (the
quorum decides who it is, not the seed).

A skewed clock is always the last fault, held to the end of the run: a node's
clock offset is fixed for its JVM's life (:mod:`localkafka.cluster`), and the
clock measured at the end of the run is then the skewed one.
"""

from __future__ import annotations

import json
import random
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from confluent_kafka import ElectionType, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient

from localkafka.cluster import LocalKafkaCluster
from localkafka.layout import HOST
from localkafka.traffic import REASSIGN_TOPIC, RECREATED_TOPIC, UNCLEAN_TOPIC, TopicSpec, create_topics

KILL_BROKER = "kill-broker"
PAUSE_BROKER = "pause-broker"
SHUTDOWN_BROKER = "shutdown-broker"
KILL_CONTROLLER = "kill-active-controller"
REASSIGN = "reassign-partitions"
PREFERRED_ELECTION = "preferred-election"
UNCLEAN_ELECTION = "unclean-election"
RECREATE_TOPIC = "recreate-topic"
WIPE_BROKER = "wipe-broker"
SKEW_CLOCK = "skew-clock"
FAULTS = (
    KILL_BROKER,
    PAUSE_BROKER,
    SHUTDOWN_BROKER,
    KILL_CONTROLLER,
    REASSIGN,
    PREFERRED_ELECTION,
    UNCLEAN_ELECTION,
    RECREATE_TOPIC,
    WIPE_BROKER,
    SKEW_CLOCK,
)
# About how long each fault takes on two busy cores (restarts dominate), for
# fitting a schedule into a duration; a fault that runs longer delays the next.
_COST_SECONDS = {
    KILL_BROKER: 25,
    PAUSE_BROKER: 30,
    SHUTDOWN_BROKER: 30,
    KILL_CONTROLLER: 15,
    REASSIGN: 25,
    PREFERRED_ELECTION: 5,
    UNCLEAN_ELECTION: 60,
    RECREATE_TOPIC: 10,
    WIPE_BROKER: 40,
    SKEW_CLOCK: 45,
}
# A paused broker stays stopped this much past replica.lag.time.max.ms, so its
# leaders drop it from their ISRs (ReplicaManager.maybeShrinkIsr runs every half of it).
_PAUSE_PAST_LAG_SECONDS = 4.0
_HEAL_TIMEOUT_SECONDS = 120.0
# How long a skewed clock is held at least before a run ends.
SKEW_HOLD_SECONDS = 30.0


@dataclass(frozen=True)
class PlannedFault:
    kind: str
    # The broker it strikes; None where the cluster decides (the active controller)
    # or no single broker is struck (elections, reassignments, topics).
    broker: int | None
    pause_before_seconds: float


@dataclass
class FaultRecord:
    kind: str
    target: int | None
    started: str
    ended: str = ""
    detail: dict[str, object] = field(default_factory=dict)


def plan(
    seed: int,
    duration_seconds: float,
    brokers: list[int],
    kinds: tuple[str, ...] = FAULTS,
    *,
    repeat: bool = True,
    skew_hold_seconds: float = SKEW_HOLD_SECONDS,
) -> list[PlannedFault]:
    """The faults a run of ``duration_seconds`` inflicts: every kind in
    ``kinds`` once in an order the seed picks (a skewed clock last), then, with
    ``repeat``, more of the short ones while the duration allows; the same
    arguments give the same list. Faults that do not fit are left out, the skew
    last of all."""
    rng = random.Random(seed)
    order = [k for k in kinds if k != SKEW_CLOCK]
    rng.shuffle(order)
    skew = SKEW_CLOCK in kinds
    reserved = _COST_SECONDS[SKEW_CLOCK] + skew_hold_seconds if skew else 0.0
    budget = duration_seconds - reserved
    faults: list[PlannedFault] = []
    spent = 0.0
    repeatable = (
        [k for k in order if k not in (UNCLEAN_ELECTION, WIPE_BROKER, RECREATE_TOPIC)] if repeat else []
    )
    queue = list(order)
    while True:
        kind = queue.pop(0) if queue else (rng.choice(repeatable) if repeatable else None)
        if kind is None:
            break
        pause = round(rng.uniform(2.0, 6.0), 1)
        cost = pause + _COST_SECONDS[kind]
        if spent + cost > budget:
            if queue:
                continue  # a cheaper one later in the order may still fit
            break
        spent += cost
        faults.append(PlannedFault(kind, _broker_for(kind, rng, brokers), pause))
    if skew and reserved <= duration_seconds:
        faults.append(PlannedFault(SKEW_CLOCK, rng.choice(brokers), round(rng.uniform(2.0, 6.0), 1)))
    return faults


def _broker_for(kind: str, rng: random.Random, brokers: list[int]) -> int | None:
    if kind in (KILL_BROKER, PAUSE_BROKER, SHUTDOWN_BROKER, WIPE_BROKER):
        return rng.choice(brokers)
    return None


class Nemesis:
    """Runs a :func:`plan` on ``cluster``; see the module docstring."""

    def __init__(
        self,
        cluster: LocalKafkaCluster,
        faults: list[PlannedFault],
        schedule_file: Path,
        *,
        topics: list[TopicSpec],
        skew_seconds: float = 3.5,
        say: Callable[[str], None] = lambda _: None,
    ) -> None:
        self.cluster = cluster
        self.faults = faults
        self.schedule_file = Path(schedule_file)
        self.topics = {t.name: t for t in topics}
        self.skew_seconds = skew_seconds
        self.say = say
        self.records: list[FaultRecord] = []
        self.admin = AdminClient({"bootstrap.servers": cluster.bootstrap_servers, "log_level": 0})
        self._lag_seconds = (
            float(
                cluster.brokers[0].overrides.get("replica.lag.time.max.ms", "10000")  # layout.BROKER_DEFAULTS
            )
            / 1000
        )

    @property
    def skewed(self) -> dict[int, float]:
        """The nodes whose clock runs off true time now, and by how much."""
        return {node: offset for node, offset in self.cluster.clock_offsets.items() if offset}

    def run(self, stop_at: float | None = None) -> list[FaultRecord]:
        """Inflict every planned fault in turn; after the monotonic time
        ``stop_at``, only the kinds not inflicted yet (a slow machine makes the
        run longer, not poorer in kinds)."""
        self.schedule_file.parent.mkdir(parents=True, exist_ok=True)
        with open(self.schedule_file, "a") as out:
            for fault in self.faults:
                late = stop_at is not None and time.monotonic() >= stop_at
                if late and any(r.kind == fault.kind for r in self.records):
                    # Past the duration only repeats are left out: every kind is
                    # inflicted once (the skew last, which the clocks' measure needs).
                    continue
                time.sleep(fault.pause_before_seconds)
                record = FaultRecord(fault.kind, fault.broker, _now())
                self.say(f"fault: {fault.kind}" + (f" on broker {fault.broker}" if fault.broker else ""))
                getattr(self, "_" + fault.kind.replace("-", "_"))(fault, record)
                record.ended = _now()
                self.records.append(record)
                out.write(json.dumps(asdict(record)) + "\n")
                out.flush()
        return self.records

    def heal(self) -> None:
        """Every node running on a true clock again, every broker registered."""
        for node in self.cluster.layout.nodes:
            if self.cluster.clock_offsets.get(node.node_id):
                self.cluster.shutdown(node.node_id)
            if not self.cluster.is_running(node.node_id):
                self.cluster.start_node(node.node_id, wait=False)
        self.cluster.wait_until_ready(timeout_seconds=_HEAL_TIMEOUT_SECONDS)

    # -- the faults ------------------------------------------------------------

    def _kill_broker(self, fault: PlannedFault, record: FaultRecord) -> None:
        assert fault.broker is not None
        self.cluster.kill(fault.broker)
        self._restart(fault.broker)

    def _pause_broker(self, fault: PlannedFault, record: FaultRecord) -> None:
        """SIGSTOP past replica.lag.time.max.ms: its leaders shrink their ISRs
        (and the controller fences it once its heartbeats stop); SIGCONT, and the
        ISRs expand again as it catches up."""
        assert fault.broker is not None
        self.cluster.pause(fault.broker)
        time.sleep(self._lag_seconds + _PAUSE_PAST_LAG_SECONDS)
        record.detail["isr_without_it"] = self._partitions_missing(fault.broker)
        self.cluster.resume(fault.broker)
        self._wait_whole()

    def _shutdown_broker(self, fault: PlannedFault, record: FaultRecord) -> None:
        assert fault.broker is not None
        self.cluster.shutdown(fault.broker)
        self._restart(fault.broker)

    def _kill_active_controller(self, fault: PlannedFault, record: FaultRecord) -> None:
        active = self.cluster.active_controller()
        if active is None:
            record.detail["skipped"] = "no active controller named in any quorum-state file"
            return
        record.target = active
        self.cluster.kill(active)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and self.cluster.active_controller() in (active, None):
            time.sleep(0.5)
        record.detail["new_active_controller"] = self.cluster.active_controller()
        self.cluster.start_node(active, wait=False)
        self._wait_whole()

    def _reassign_partitions(self, fault: PlannedFault, record: FaultRecord) -> None:
        """Move every replica of the reassigned topic one broker on, with Kafka's
        own kafka-reassign-partitions tool, and wait for it to complete."""
        brokers = sorted(b.node_id for b in self.cluster.brokers)
        listed = self.admin.list_topics(REASSIGN_TOPIC, timeout=10).topics[REASSIGN_TOPIC]
        moves = []
        for partition, meta in sorted(listed.partitions.items()):
            target = [brokers[(brokers.index(r) + 1) % len(brokers)] for r in meta.replicas]
            moves.append({"topic": REASSIGN_TOPIC, "partition": partition, "replicas": target})
        plan_file = self.schedule_file.parent / f"reassignment-{len(self.records)}.json"
        plan_file.write_text(json.dumps({"version": 1, "partitions": moves}))
        tool = "org.apache.kafka.tools.reassign.ReassignPartitionsCommand"
        args = ["--bootstrap-server", self._bootstrap(), "--reassignment-json-file", str(plan_file)]
        self.cluster.run_tool(tool, *args, "--execute")
        record.detail["moves"] = moves
        deadline = time.monotonic() + _HEAL_TIMEOUT_SECONDS
        while time.monotonic() < deadline:
            if "is still in progress" not in self.cluster.run_tool(tool, *args, "--verify"):
                break
            time.sleep(2)

    def _preferred_election(self, fault: PlannedFault, record: FaultRecord) -> None:
        results = self.admin.elect_leaders(ElectionType.PREFERRED, None).result(60)
        record.detail["elected"] = sum(1 for err in results.values() if err is None)

    def _unclean_election(self, fault: PlannedFault, record: FaultRecord) -> None:
        """The unclean topic's one partition lives on two brokers. The follower
        is shut down (out of the ISR), the leader killed (the ISR is it alone,
        and it is gone), the follower started again: only an unclean election
        gives the partition a leader. The controller makes it on its own where
        the topic allows it (ReplicationControlManager, when the broker is
        unfenced); otherwise Admin's electLeaders(UNCLEAN) asks for it."""
        partition = self.admin.list_topics(UNCLEAN_TOPIC, timeout=10).topics[UNCLEAN_TOPIC].partitions[0]
        leader = partition.leader
        follower = next(r for r in partition.replicas if r != leader)
        record.target = leader
        record.detail.update(leader=leader, follower=follower)
        self.cluster.shutdown(follower)
        self._wait_until(lambda: self._isr(UNCLEAN_TOPIC, 0) == [leader], 30)
        self.cluster.kill(leader)
        self._wait_until(lambda: self._leader(UNCLEAN_TOPIC, 0) in (-1, None), 30)
        self._wait_until(lambda: leader not in self.cluster.live_brokers(), 30)
        self.cluster.start_node(follower)
        if not self._wait_until(lambda: self._leader(UNCLEAN_TOPIC, 0) == follower, 10):
            results = self.admin.elect_leaders(ElectionType.UNCLEAN, [TopicPartition(UNCLEAN_TOPIC, 0)])
            error = results.result(60).get(TopicPartition(UNCLEAN_TOPIC, 0))
            record.detail["asked"] = str(error) if error else "elected"
        record.detail["new_leader"] = self._leader(UNCLEAN_TOPIC, 0)
        self.cluster.start_node(leader)
        self._wait_whole()

    def _recreate_topic(self, fault: PlannedFault, record: FaultRecord) -> None:
        self.admin.delete_topics([RECREATED_TOPIC], request_timeout=30)[RECREATED_TOPIC].result(60)
        self._wait_until(lambda: RECREATED_TOPIC not in self.admin.list_topics(timeout=10).topics, 60)
        create_topics(self.admin, [self.topics[RECREATED_TOPIC]])

    def _wipe_broker(self, fault: PlannedFault, record: FaultRecord) -> None:
        assert fault.broker is not None
        self.cluster.shutdown(fault.broker)
        self.cluster.wipe(fault.broker)
        self._restart(fault.broker)

    def _skew_clock(self, fault: PlannedFault, record: FaultRecord) -> None:
        assert fault.broker is not None
        self.cluster.shutdown(fault.broker)
        self._restart(fault.broker, self.skew_seconds)
        record.detail["offset_seconds"] = self.skew_seconds

    # -- helpers ---------------------------------------------------------------

    def _restart(self, broker: int, clock_offset_seconds: float = 0.0) -> None:
        """Start a stopped broker again once the controller no longer lists it
        (fenced after broker.session.timeout.ms when killed, at once when shut
        down): listed before, it would pass for up before it had started."""
        self._wait_until(lambda: broker not in self.cluster.live_brokers(), 30)
        self.cluster.start_node(broker, clock_offset_seconds=clock_offset_seconds)
        self._wait_whole()

    def _wait_whole(self) -> None:
        """Until every broker is registered and every partition's ISR is full
        again (bounded: a cluster that does not heal is the next fault's problem)."""
        self.cluster.wait_until_ready(timeout_seconds=_HEAL_TIMEOUT_SECONDS)
        self._wait_until(lambda: not self._under_replicated(), _HEAL_TIMEOUT_SECONDS)

    def _under_replicated(self) -> list[str]:
        try:
            topics = self.admin.list_topics(timeout=10).topics
        except KafkaException:
            return ["?"]
        return [
            f"{name}-{p}"
            for name, meta in topics.items()
            for p, part in meta.partitions.items()
            if len(part.isrs) < len(part.replicas)
        ]

    def _partitions_missing(self, broker: int) -> int:
        """How many partitions replicated on ``broker`` have it out of their ISR."""
        try:
            topics = self.admin.list_topics(timeout=10).topics
        except KafkaException:
            return -1
        return sum(
            1
            for meta in topics.values()
            for part in meta.partitions.values()
            if broker in part.replicas and broker not in part.isrs
        )

    def _isr(self, topic: str, partition: int) -> list[int] | None:
        try:
            return sorted(self.admin.list_topics(topic, timeout=5).topics[topic].partitions[partition].isrs)
        except (KafkaException, KeyError):
            return None

    def _leader(self, topic: str, partition: int) -> int | None:
        try:
            return int(self.admin.list_topics(topic, timeout=5).topics[topic].partitions[partition].leader)
        except (KafkaException, KeyError):
            return None

    def _bootstrap(self) -> str:
        running = [b for b in self.cluster.brokers if self.cluster.is_running(b.node_id)]
        return ",".join(f"{HOST}:{b.port}" for b in running)

    @staticmethod
    def _wait_until(condition: Callable[[], bool], timeout_seconds: float) -> bool:
        deadline = time.monotonic() + timeout_seconds
        while time.monotonic() < deadline:
            if condition():
                return True
            time.sleep(0.5)
        return False


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds")
