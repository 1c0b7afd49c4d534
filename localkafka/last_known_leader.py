"""KAFKA-19522's scenario on a real cluster: with eligible leader replicas
(KIP-966) on, a leaderless partition whose ISR and ELR are both empty gets
its last known leader back as leader while that broker is still fenced.

``PartitionChangeBuilder.canElectLastKnownLeader`` (Kafka 4.0) tests whether
the last known leader is an acceptable leader, logs that it is not alive when
it *is*, and returns true either way; 4.1.0 returns false for a broker that is
not acceptable (fenced or shutting down), so the election waits for its
unfencing.

One controller, three brokers, a topic of one partition on all three with
``min.insync.replicas`` 2, ELR on. The brokers are killed one after the other,
each fenced before the next (the leader last): the ISR empties into the ELR
and the last leader is remembered (``lastKnownElr``). Restarting a killed
broker is an unclean shutdown's return, which takes it out of the ELR
(``ReplicationControlManager.handleBrokerUncleanShutdown``): the ELR member
that was not the leader comes back first, then the last leader. Its
registration empties the ELR, and the buggy controller elects it in the same
breath, while its registration is still fenced.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field
from pathlib import Path

from confluent_kafka.admin import AdminClient, NewTopic

from localkafka.cluster import LocalKafkaCluster
from localkafka.fetch import KafkaJars, KafkaSetupError
from localkafka.scenario import ScenarioRun

TOPIC = "last-known-leader"
_FENCE_TIMEOUT_SECONDS = 30.0


@dataclass
class LastKnownLeaderRun(ScenarioRun):
    """What one run did (its files: :class:`ScenarioRun`)."""

    # The brokers in the order they were killed (the partition's leader last).
    killed: list[int] = field(default_factory=list)
    metadata_dump: str = ""

    @property
    def last_leader(self) -> int:
        return self.killed[-1]


def run_last_known_leader(jars: KafkaJars, root: Path) -> LastKnownLeaderRun:
    """Run the scenario on Kafka ``jars`` under ``root`` and stop every node."""
    cluster = LocalKafkaCluster(jars, root, controllers=1, brokers=3, tiered_storage=False, heap="256m")
    with cluster:
        run = LastKnownLeaderRun(jars.version, cluster.controllers[0], cluster.brokers)
        broker = cluster.brokers[0]
        cluster.run_tool(
            "org.apache.kafka.tools.FeatureCommand",
            "--bootstrap-server",
            f"127.0.0.1:{broker.port}",
            "upgrade",
            "--feature",
            "eligible.leader.replicas.version=1",
        )
        admin = AdminClient({"bootstrap.servers": cluster.bootstrap_servers, "log_level": 0})
        topic = NewTopic(TOPIC, 1, 3, config={"min.insync.replicas": "2"})
        admin.create_topics([topic])[TOPIC].result(30)
        leader = _leader(admin, timeout_seconds=30)
        cluster.wait_until_ready()  # every broker unfenced (a loaded machine fences some while they start)
        run.killed = [b.node_id for b in cluster.brokers if b.node_id != leader] + [leader]
        for node_id in run.killed:
            logged = cluster.controllers[0].server_log.stat().st_size
            cluster.kill(node_id)
            _wait_fenced(cluster, node_id, logged)
        first, last = run.killed[1], run.killed[2]
        # The ELR member that was not the leader returns, then the last leader.
        cluster.start_node(first)
        cluster.start_node(last)
        _leader(admin, timeout_seconds=60)
        for node in cluster.brokers:  # stopped beside the controller, they would wait out stop()'s 15 s
            if cluster.is_running(node.node_id):
                cluster.kill(node.node_id)
    run.metadata_dump = run.dump_metadata(cluster)
    return run


def _leader(admin: AdminClient, *, timeout_seconds: float) -> int:
    deadline = time.monotonic() + timeout_seconds
    while time.monotonic() < deadline:
        try:
            partitions = admin.list_topics(TOPIC, timeout=5).topics[TOPIC].partitions
        except Exception:
            partitions = {}
        if 0 in partitions and partitions[0].leader >= 0:
            return int(partitions[0].leader)
        time.sleep(0.25)
    raise KafkaSetupError(f"{TOPIC}-0 had no leader within {timeout_seconds:.0f} s")


def _wait_fenced(cluster: LocalKafkaCluster, broker: int, logged: int) -> None:
    """Until the controller has fenced ``broker`` (its session timed out), as
    its own log says past byte ``logged`` (``ReplicationControlManager``; no
    broker may be left to ask; on a loaded machine brokers are fenced during
    start-up too): the metadata log then holds the fencing before the next one
    dies."""
    # "Fencing broker 2 because ..." up to 4.0, "Fencing broker 2 at epoch 33 because ..." later.
    line = re.compile(rf"Fencing broker {broker} (at epoch \d+ )?because its session has timed out")
    log = cluster.controllers[0].server_log
    deadline = time.monotonic() + _FENCE_TIMEOUT_SECONDS
    while time.monotonic() < deadline:
        with open(log, "rb") as text:
            text.seek(logged)
            if line.search(text.read().decode(errors="replace")):
                return
        time.sleep(0.25)
    raise KafkaSetupError(
        f"broker {broker} was not fenced within {_FENCE_TIMEOUT_SECONDS:.0f} s -- see {log}"
    )
