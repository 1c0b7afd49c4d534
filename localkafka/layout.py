"""What each node of a local KRaft cluster is: its id, role, ports, files and
configuration, written as Kafka reads them.

The quorum is static (``controller.quorum.voters``), as in most deployments
seen in the wild and the only form Kafka 3.x knows. Every node, controllers
too, logs ``kafka.request.logger`` at DEBUG to its own ``kafka-request.log``
with Kafka's own layout (``[%d] %p %m (%c)%n``, config/log4j2.yaml): brokers
log the Produce, Fetch and partition requests they serve; controllers log the
AlterPartition, BrokerHeartbeat and Raft requests they handle.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from localkafka.secure import LISTENER as SECURE_LISTENER
from localkafka.secure import SecureListener

HOST = "127.0.0.1"
CONTROLLER_LISTENER = "CONTROLLER"
CLIENT_LISTENER = "PLAINTEXT"
# Controllers' ids sit apart from brokers' (1..n) so that an id says the role.
FIRST_CONTROLLER_ID = 101

# Brokers' settings for a cluster that is broken on purpose: a follower stopped
# for 10 s leaves the ISR (replica.lag.time.max.ms, default 30 s), a broker
# whose heartbeats stop for 6 s is fenced (broker.session.timeout.ms, default
# 9 s), and leaders move only when the nemesis asks (auto leader rebalance off).
BROKER_DEFAULTS = {
    "num.partitions": "3",
    "default.replication.factor": "3",
    "min.insync.replicas": "2",
    "offsets.topic.replication.factor": "3",
    "transaction.state.log.replication.factor": "3",
    "transaction.state.log.min.isr": "2",
    "replica.lag.time.max.ms": "10000",
    "broker.heartbeat.interval.ms": "1000",
    "group.initial.rebalance.delay.ms": "0",
    "auto.leader.rebalance.enable": "false",
    "log.retention.check.interval.ms": "5000",
    "num.network.threads": "2",
    "num.io.threads": "2",
    "num.replica.fetchers": "1",
    "log.flush.interval.messages": "9223372036854775807",
}
CONTROLLER_DEFAULTS = {
    "broker.session.timeout.ms": "6000",
    # A snapshot at least every 30 s, so that a metadata log directory is read
    # from a snapshot as a long-running cluster's is (default: one an hour).
    "metadata.log.max.snapshot.interval.ms": "30000",
    "num.network.threads": "1",
    "num.io.threads": "2",
}
# LocalTieredStorage (kafka-storage's test jar): segments "uploaded" to a
# directory, with Kafka's own topic-based remote log metadata manager.
TIERED_STORAGE = {
    "remote.log.storage.system.enable": "true",
    "remote.log.storage.manager.class.name": "org.apache.kafka.server.log.remote.storage.LocalTieredStorage",
    "remote.log.metadata.manager.listener.name": CLIENT_LISTENER,
    "remote.log.manager.task.interval.ms": "1000",
    "rlmm.config.remote.log.metadata.topic.replication.factor": "3",
    "rlmm.config.remote.log.metadata.topic.num.partitions": "5",
    "rlmm.config.remote.log.metadata.initialization.retry.interval.ms": "1000",
}


@dataclass(frozen=True)
class NodeLayout:
    """One JVM of the cluster."""

    node_id: int
    role: str  # "broker" or "controller"
    port: int
    directory: Path
    overrides: dict[str, str] = field(default_factory=dict)
    secure_port: int | None = None  # a broker's SASL_SSL listener (localkafka.secure)

    @property
    def is_controller(self) -> bool:
        return self.role == "controller"

    @property
    def data_dir(self) -> Path:
        return self.directory / "data"

    @property
    def metadata_dir(self) -> Path:
        """``__cluster_metadata-0``: its segments, snapshots and ``quorum-state``."""
        return self.data_dir / "__cluster_metadata-0"

    @property
    def quorum_state(self) -> Path:
        return self.metadata_dir / "quorum-state"

    @property
    def request_log(self) -> Path:
        return self.directory / "logs" / "kafka-request.log"

    @property
    def server_log(self) -> Path:
        return self.directory / "logs" / "server.log"

    @property
    def console_log(self) -> Path:
        """The JVM's own stdout and stderr (a crash before logging starts lands here)."""
        return self.directory / "logs" / "console.log"

    @property
    def properties_file(self) -> Path:
        return self.directory / "server.properties"


@dataclass(frozen=True)
class ClusterLayout:
    """All nodes of a cluster and what they share."""

    root: Path
    kafka_major: int
    controllers: tuple[NodeLayout, ...]
    brokers: tuple[NodeLayout, ...]
    tiered_storage: bool
    secure: SecureListener | None = None

    @property
    def nodes(self) -> tuple[NodeLayout, ...]:
        return self.controllers + self.brokers

    @property
    def voters(self) -> str:
        return ",".join(f"{c.node_id}@{HOST}:{c.port}" for c in self.controllers)

    @property
    def bootstrap_servers(self) -> str:
        return ",".join(f"{HOST}:{b.port}" for b in self.brokers)

    @property
    def secure_bootstrap_servers(self) -> str:
        """The brokers' SASL_SSL listeners; empty without one."""
        return ",".join(f"{HOST}:{b.secure_port}" for b in self.brokers if b.secure_port is not None)

    @property
    def remote_storage_dir(self) -> Path:
        return self.root / "remote-storage"

    def node(self, node_id: int) -> NodeLayout:
        for node in self.nodes:
            if node.node_id == node_id:
                return node
        raise KeyError(f"no node {node_id} in this cluster")


def plan(
    root: Path,
    kafka_major: int,
    ports: list[int],
    *,
    controllers: int = 3,
    brokers: int = 3,
    tiered_storage: bool = True,
    broker_overrides: dict[str, str] | None = None,
    secure: SecureListener | None = None,
) -> ClusterLayout:
    """Lay out ``controllers`` + ``brokers`` nodes under ``root`` on ``ports``
    (one each, controllers first; with ``secure``, then one more per broker
    for its SASL_SSL listener)."""
    needed = controllers + brokers * (2 if secure else 1)
    if len(ports) < needed:
        raise ValueError(f"{needed} ports needed, {len(ports)} given")
    c_nodes = tuple(
        NodeLayout(
            FIRST_CONTROLLER_ID + i, "controller", ports[i], root / f"controller-{FIRST_CONTROLLER_ID + i}"
        )
        for i in range(controllers)
    )
    b_nodes = tuple(
        NodeLayout(
            i + 1,
            "broker",
            ports[controllers + i],
            root / f"broker-{i + 1}",
            dict(broker_overrides or {}),
            ports[controllers + brokers + i] if secure else None,
        )
        for i in range(brokers)
    )
    return ClusterLayout(root, kafka_major, c_nodes, b_nodes, tiered_storage, secure)


def server_properties(layout: ClusterLayout, node: NodeLayout) -> str:
    """The node's ``server.properties``."""
    props: dict[str, str] = {
        "process.roles": node.role,
        "node.id": str(node.node_id),
        "controller.quorum.voters": layout.voters,
        "controller.listener.names": CONTROLLER_LISTENER,
        "log.dirs": str(node.data_dir),
    }
    if node.is_controller:
        props["listeners"] = f"{CONTROLLER_LISTENER}://{HOST}:{node.port}"
        props["listener.security.protocol.map"] = f"{CONTROLLER_LISTENER}:PLAINTEXT"
        props.update(CONTROLLER_DEFAULTS)
        if layout.tiered_storage:
            # The controller validates a topic's remote.storage.enable against its own
            # setting (LogConfig.validate from ControllerConfigurationValidator):
            # without it, CreateTopics of a tiered topic is refused with INVALID_CONFIG.
            props["remote.log.storage.system.enable"] = "true"
    else:
        props["listeners"] = f"{CLIENT_LISTENER}://{HOST}:{node.port}"
        props["advertised.listeners"] = f"{CLIENT_LISTENER}://{HOST}:{node.port}"
        props["inter.broker.listener.name"] = CLIENT_LISTENER
        props["listener.security.protocol.map"] = (
            f"{CLIENT_LISTENER}:PLAINTEXT,{CONTROLLER_LISTENER}:PLAINTEXT"
        )
        props.update(BROKER_DEFAULTS)
        if layout.secure is not None and node.secure_port is not None:
            secure = f"{SECURE_LISTENER}://{HOST}:{node.secure_port}"
            props["listeners"] += f",{secure}"
            props["advertised.listeners"] += f",{secure}"
            props["listener.security.protocol.map"] += f",{SECURE_LISTENER}:SASL_SSL"
            props.update(layout.secure.broker_properties())
        if layout.tiered_storage:
            props.update(TIERED_STORAGE)
            props["rsm.config.dir"] = str(layout.remote_storage_dir)
    props.update(node.overrides)
    return "".join(f"{key}={value}\n" for key, value in props.items())


def logging_config(layout: ClusterLayout, node: NodeLayout) -> tuple[str, str]:
    """(file name, text) of the node's logging configuration: log4j2 XML for
    Kafka 4.x (log4j-core alone reads XML; Kafka's own YAML needs Jackson),
    log4j 1 properties (reload4j) for 3.x."""
    logs = node.request_log.parent
    if layout.kafka_major >= 4:
        text = f"""<Configuration status="warn">
  <Appenders>
    <File name="server" fileName="{logs / "server.log"}">
      <PatternLayout pattern="[%d] %p %m (%c)%n"/>
    </File>
    <File name="requests" fileName="{node.request_log}">
      <PatternLayout pattern="[%d] %p %m (%c)%n"/>
    </File>
  </Appenders>
  <Loggers>
    <Root level="info"><AppenderRef ref="server"/></Root>
    <Logger name="kafka.request.logger" level="debug" additivity="false">
      <AppenderRef ref="requests"/>
    </Logger>
  </Loggers>
</Configuration>
"""
        return "log4j2.xml", text
    text = f"""log4j.rootLogger=INFO, server
log4j.appender.server=org.apache.log4j.FileAppender
log4j.appender.server.File={logs / "server.log"}
log4j.appender.server.layout=org.apache.log4j.PatternLayout
log4j.appender.server.layout.ConversionPattern=[%d] %p %m (%c)%n
log4j.appender.requests=org.apache.log4j.FileAppender
log4j.appender.requests.File={node.request_log}
log4j.appender.requests.layout=org.apache.log4j.PatternLayout
log4j.appender.requests.layout.ConversionPattern=[%d] %p %m (%c)%n
log4j.logger.kafka.request.logger=DEBUG, requests
log4j.additivity.kafka.request.logger=false
"""
    return "log4j.properties", text
