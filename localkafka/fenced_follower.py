"""KAFKA-13916's scenario on a real cluster: a broker fenced by the controller
while it keeps replicating, caught up, from the partitions' leaders.

Up to Kafka 3.2 nothing keeps such a broker out of the ISR: the leader adds a
caught-up follower back (``Partition.maybeExpandIsr`` asks only whether it is at
the high watermark) and the controller accepts the AlterPartition
(``ReplicationControlManager.validateAlterPartitionData`` checks epochs and
that the ISR is within the replicas, not whether its members are fenced).
Kafka 3.3 (KIP-841) checks both sides: the leader consults its metadata for
fenced and shutting-down brokers, and the controller answers
INELIGIBLE_REPLICA.

The cluster is one controller and three brokers. One broker, chosen by the
seed, reaches the controller through a :class:`ControllerLinkProxy`; with
records flowing into a topic replicated on every broker, the proxy drops that
broker's heartbeats for a while: the controller fences it (session timeout
6 s), removes it from every ISR and moves its leaderships, and the broker,
still reading the metadata log and fetching from the new leaders, is caught
up again within a fetch or two. Then heartbeats flow again and the broker is
unfenced. Kafka's own records of what happened stay in the nodes' files: the
controller's request log (its AlterPartition answers) and its
``__cluster_metadata-0`` (FenceBroker and PartitionChange records).
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from confluent_kafka import KafkaException, Producer
from confluent_kafka.admin import AdminClient, NewTopic

from localkafka.cluster import LocalKafkaCluster
from localkafka.controller_link import ControllerLinkProxy
from localkafka.fetch import KafkaJars, KafkaSetupError
from localkafka.layout import HOST
from localkafka.scenario import ScenarioRun

TOPIC = "fenced-follower"
PARTITIONS = 3
# How long the fenced broker is watched once the controller has fenced it
# (broker.session.timeout.ms 6 s, layout.CONTROLLER_DEFAULTS): a leader asks to
# add a caught-up follower back within a fetch or two (500 ms each at most).
_WATCH_FENCED_SECONDS = 10.0
_FENCE_TIMEOUT_SECONDS = 30.0


@dataclass
class FencedFollowerRun(ScenarioRun):
    """What one run did (its files: :class:`ScenarioRun`)."""

    seed: int
    cut_broker: int
    cut_started_ms: int = 0
    fenced_seen_ms: int = 0
    unfenced_seen_ms: int = 0
    heartbeats_dropped: int = 0
    records_produced: int = 0
    # Partition -> the first ISR holding the broker that Kafka's metadata
    # described while the broker was fenced: the bug, as a client sees it.
    isr_with_fenced: dict[int, list[int]] = field(default_factory=dict)
    # Kafka's own DumpLogSegments --cluster-metadata-decoder of the controller's
    # metadata log, printed after the cluster stopped.
    metadata_dump: str = ""


def run_fenced_follower(
    jars: KafkaJars,
    root: Path,
    *,
    seed: int,
    watch_seconds: float = _WATCH_FENCED_SECONDS,
    on_start: Callable[[LocalKafkaCluster], None] | None = None,
) -> FencedFollowerRun:
    """Run the scenario on Kafka ``jars`` under ``root`` and stop every node;
    the seed picks the broker cut off and how many records flow. ``on_start``
    is handed the cluster once it is up, before anything else happens (to
    watch it live). Raises :class:`KafkaSetupError` if the cluster does not
    come up or the controller never fences the broker."""
    rng = random.Random(seed)
    cut = rng.choice((1, 2, 3))
    with _ProxiedCluster(jars, root, cut) as (cluster, proxy):
        if on_start is not None:
            on_start(cluster)
        run = FencedFollowerRun(jars.version, cluster.controllers[0], cluster.brokers, seed, cut)
        admin = AdminClient({"bootstrap.servers": cluster.bootstrap_servers, "log_level": 0})
        admin.create_topics([NewTopic(TOPIC, PARTITIONS, 3)])[TOPIC].result(30)
        _wait_for_full_isr(admin, cut, timeout_seconds=30)
        producer = Producer(
            {
                "bootstrap.servers": cluster.bootstrap_servers,
                "acks": "all",
                "enable.idempotence": True,
                "linger.ms": 5,
                "log_level": 0,
            }
        )
        run.records_produced += _produce(producer, rng.randint(100, 1000))

        run.cut_started_ms = _now_ms()
        proxy.drop_heartbeats(True)
        deadline = time.monotonic() + _FENCE_TIMEOUT_SECONDS
        while not _fenced(cluster, cut):
            if time.monotonic() > deadline:
                raise KafkaSetupError(
                    f"broker {cut} was not fenced within {_FENCE_TIMEOUT_SECONDS:.0f} s of its heartbeats "
                    f"stopping ({proxy.counts.heartbeats_dropped} dropped) -- see {run.controller.server_log}"
                )
            run.records_produced += _produce(producer, 50)
            time.sleep(0.2)
        run.fenced_seen_ms = _now_ms()
        until = time.monotonic() + watch_seconds
        while time.monotonic() < until:
            run.records_produced += _produce(producer, 50)
            isrs = _isrs(admin)
            if _fenced(cluster, cut):
                for partition, isr in sorted(isrs.items()):
                    if cut in isr and partition not in run.isr_with_fenced:
                        run.isr_with_fenced[partition] = isr
            time.sleep(0.5)

        proxy.drop_heartbeats(False)
        run.heartbeats_dropped = proxy.counts.heartbeats_dropped
        cluster.wait_until_ready([cut], timeout_seconds=60)
        run.unfenced_seen_ms = _now_ms()
        run.records_produced += _produce(producer, 100)
        _wait_for_full_isr(admin, cut, timeout_seconds=60)
    run.metadata_dump = run.dump_metadata(cluster)
    return run


class _ProxiedCluster:
    """The cluster with broker ``cut`` behind a proxy to the controller; both
    closed on exit, the cluster's JVMs stopped."""

    def __init__(self, jars: KafkaJars, root: Path, cut: int) -> None:
        self.cluster = LocalKafkaCluster(
            jars, root, controllers=1, brokers=3, tiered_storage=False, heap="256m"
        )
        controller = self.cluster.controllers[0]
        self.proxy = ControllerLinkProxy(controller.port)
        voters = f"{controller.node_id}@{HOST}:{self.proxy.port}"
        self.cluster.override(cut, {"controller.quorum.voters": voters})

    def __enter__(self) -> tuple[LocalKafkaCluster, ControllerLinkProxy]:
        try:
            self.cluster.start()
        except BaseException:
            self.__exit__()
            raise
        return self.cluster, self.proxy

    def __exit__(self, *exc: object) -> None:
        try:
            # The brokers are killed first: SIGTERMed beside their controller,
            # which exits sooner, each kept calling it until stop()'s 15 s ran
            # out (seen here). Their request logs are written line by line, and
            # the metadata log read is the controller's, which stops cleanly.
            for broker in self.cluster.brokers:
                if self.cluster.is_running(broker.node_id):
                    self.cluster.kill(broker.node_id)
            self.cluster.stop()
        finally:
            self.proxy.close()


def _fenced(cluster: LocalKafkaCluster, broker: int) -> bool:
    """Whether the cluster's metadata lists ``broker`` as not alive now; a
    description that failed (no broker listed at all) says nothing."""
    live = cluster.live_brokers()
    return bool(live) and broker not in live


def _produce(producer: Producer, count: int) -> int:
    for i in range(count):
        producer.produce(TOPIC, key=str(i % 97).encode(), value=b"x" * 100)
    producer.flush(30)
    return count


def _isrs(admin: AdminClient) -> dict[int, list[int]]:
    """Partition -> ISR as the cluster's metadata describes them; empty when
    no broker answered in time (a loaded machine), which says nothing."""
    try:
        topic = admin.list_topics(TOPIC, timeout=5).topics[TOPIC]
    except KafkaException:
        return {}
    return {p.id: sorted(p.isrs) for p in topic.partitions.values()}


def _wait_for_full_isr(admin: AdminClient, broker: int, *, timeout_seconds: float) -> None:
    deadline = time.monotonic() + timeout_seconds
    while time.monotonic() < deadline:
        isrs = _isrs(admin)
        if len(isrs) == PARTITIONS and all(broker in isr for isr in isrs.values()):
            return
        time.sleep(0.25)
    raise KafkaSetupError(f"broker {broker} did not join every ISR of {TOPIC} within {timeout_seconds:.0f} s")


def _now_ms() -> int:
    return int(time.time() * 1000)
