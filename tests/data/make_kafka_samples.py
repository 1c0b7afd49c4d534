"""Regenerate ``tests/data/native/kafka-<version>-cluster/``: files a real Apache
Kafka KRaft cluster wrote, for the parsers' tests and the format checks of the
hand-made samples (tests/data/README.md says which file checks which).

    .venv/bin/python tests/data/make_kafka_samples.py            # Kafka 4.4.0
    .venv/bin/python tests/data/make_kafka_samples.py --kafka-version 4.5.0 --keep /tmp/k

It starts a :class:`localkafka.cluster.LocalKafkaCluster` (three controllers,
three brokers, tiered storage on), drives it as an application and an operator
would (:func:`drive`: idempotent and transactional producers, consumers in a
classic and a KIP-848 group, a share group, admin operations of every kind,
a reassignment and a preferred election, a tiered topic whose segments are
uploaded, expired and whose partition is deleted), stops it cleanly and copies
out, trimmed:

- ``request-logs/<node>.log``: each node's ``kafka-request.log``, keeping the
  first ``--per-api`` entries (default 1) of each (API, version) the node logged, in file
  order (entries are whole lines: the log4j pattern writes one per line);
- ``incremental-fetches.log``: a broker's incremental fetch (KIP-227) whose
  response leaves out a partition it asked for, one per broker where there is one;
- ``request-apis.json``: per node, every API's entry count in the untrimmed
  log, so a test can check that a trimmed file still names every API served;
- ``quorum-state-<id>``: each controller's ``__cluster_metadata-0/quorum-state``;
- ``metadata/``: controller 101's newest snapshot (``.checkpoint``) and its
  first segment, gzipped, with Kafka's own DumpLogSegments output of both (gzipped);
- ``remote-log-metadata.jsonl``: every record of ``__remote_log_metadata`` as
  the broker stored it (partition, offset, timestamp, key and value base64),
  and ``remote-log-metadata.txt``: the same topic through Kafka's
  ``RemoteLogMetadataSerde$RemoteLogMetadataFormatter`` and ConsoleConsumer.

Everything it starts is stopped at the end, also on failure.
"""

from __future__ import annotations

import argparse
import base64
import collections
import gzip
import json
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[2]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from confluent_kafka import Consumer, Producer, TopicPartition  # noqa: E402
from confluent_kafka.admin import (  # noqa: E402
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    NewPartitions,
    NewTopic,
)

from localkafka.cluster import LocalKafkaCluster  # noqa: E402
from localkafka.fetch import DEFAULT_VERSION, KafkaSetupError, fetch_kafka  # noqa: E402

FORMATTER = (
    "org.apache.kafka.server.log.remote.metadata.storage.serialization."
    "RemoteLogMetadataSerde$RemoteLogMetadataFormatter"
)
REMOTE_LOG_METADATA_TOPIC = "__remote_log_metadata"
# Kafka's smallest segment.bytes is 1 MiB (LogConfig); 1 KiB values fill one in
# about a thousand records, so a few MiB give the tiered topic several segments.
SEGMENT_BYTES = 1024 * 1024
TIERED_TOPIC = "tiered"


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


def tiered_topic_config() -> dict[str, str]:
    """A topic whose closed segments are uploaded at once and leave local disk
    within a second (RemoteLogManager's copy task runs every
    ``remote.log.manager.task.interval.ms``, 1 s in localkafka's layout)."""
    return {
        "remote.storage.enable": "true",
        "segment.bytes": str(SEGMENT_BYTES),
        "local.retention.ms": "1000",
        "retention.ms": "3600000",
    }


def wait_for(what: str, check: Callable[[], bool], timeout_seconds: float) -> bool:
    deadline = time.monotonic() + timeout_seconds
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(1)
    log(f"gave up waiting for {what} after {timeout_seconds:.0f} s")
    return False


class Driver:
    """Runs each step, logging and keeping going past a step Kafka refuses (the
    refusal is itself a logged request; the step's name is kept in ``failed``)."""

    def __init__(self, cluster: LocalKafkaCluster) -> None:
        self.cluster = cluster
        self.bootstrap = cluster.bootstrap_servers
        self.controllers = ",".join(f"127.0.0.1:{c.port}" for c in cluster.controllers)
        self.admin = AdminClient({"bootstrap.servers": self.bootstrap})
        self.failed: list[str] = []

    def step(self, name: str, action: Callable[[], Any]) -> Any:
        log(name)
        try:
            return action()
        except Exception as exc:  # a refused operation is still Kafka's answer, logged
            self.failed.append(
                f"{name}: {str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__}"
            )
            log(f"  refused: {self.failed[-1]}")
            return None

    def tool(self, main_class: str, *args: str) -> str:
        return self.cluster.run_tool(main_class, *args, timeout_seconds=180)

    def futures(self, fs: dict[Any, Any]) -> None:
        errors = []
        for key, future in fs.items():
            try:
                future.result(60)
            except Exception as exc:
                errors.append(f"{key}: {exc}")
        if errors:
            raise RuntimeError("; ".join(errors))


def produce(bootstrap: str, topic: str, count: int, size: int, **config: Any) -> None:
    producer = Producer(
        {"bootstrap.servers": bootstrap, "enable.idempotence": True, "acks": "all", "linger.ms": 20, **config}
    )
    value = b"v" * size
    for i in range(count):
        producer.produce(topic, key=f"k{i}".encode(), value=value)
        if i % 500 == 499:
            producer.poll(0)
    left = producer.flush(120)
    if left:
        raise RuntimeError(f"{left} records to {topic} undelivered")


def consume(bootstrap: str, topic: str, group: str, protocol: str, wanted: int) -> None:
    """A consumer in ``group`` (``classic`` or ``consumer``, KIP-848) reading
    ``wanted`` records, committing, then leaving the group."""
    config = {
        "bootstrap.servers": bootstrap,
        "group.id": group,
        "auto.offset.reset": "earliest",
        "enable.auto.commit": False,
        "group.protocol": protocol,
    }
    if protocol == "classic":
        config["session.timeout.ms"] = 10000
    consumer = Consumer(config)
    consumer.subscribe([topic])
    seen, deadline = 0, time.monotonic() + 90
    try:
        while seen < wanted and time.monotonic() < deadline:
            msg = consumer.poll(1)
            if msg is not None and msg.error() is None:
                seen += 1
                if seen % 100 == 0:
                    consumer.commit(asynchronous=False)
    finally:
        consumer.close()  # LeaveGroup (classic) or a heartbeat leaving the group (KIP-848)
    if seen < wanted:
        raise RuntimeError(f"group {group} read {seen} of {wanted} records")


def transactions(bootstrap: str, source_topic: str, topic: str) -> None:
    """Consume-transform-produce: one committed transaction with the consumer's
    offsets in it (AddOffsetsToTxn, TxnOffsetCommit), one aborted."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "txn-group",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
        }
    )
    consumer.subscribe([source_topic])
    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": "sample-txn"})
    producer.init_transactions(60)
    msgs = []
    deadline = time.monotonic() + 60
    while len(msgs) < 10 and time.monotonic() < deadline:
        msg = consumer.poll(1)
        if msg is not None and msg.error() is None:
            msgs.append(msg)
    producer.begin_transaction()
    for msg in msgs:
        producer.produce(topic, key=msg.key(), value=msg.value())
    producer.send_offsets_to_transaction(
        consumer.position(consumer.assignment()), consumer.consumer_group_metadata(), 60
    )
    producer.commit_transaction(60)
    producer.begin_transaction()
    producer.produce(topic, key=b"aborted", value=b"aborted")
    producer.flush(30)
    producer.abort_transaction(60)
    consumer.close()


def drive(cluster: LocalKafkaCluster) -> Driver:
    """The workload: every step is something an application or an operator does."""
    d = Driver(cluster)
    admin = d.admin
    topics = [
        NewTopic("orders", 3, 3),
        NewTopic("payments", 3, 3, config={"cleanup.policy": "compact"}),
        NewTopic("doomed", 1, 3),
        NewTopic(TIERED_TOPIC, 1, 3, config=tiered_topic_config()),
    ]
    d.step("create topics", lambda: d.futures(admin.create_topics(topics)))
    d.step(
        "client metrics subscription (PushTelemetry from Java clients)",
        lambda: d.tool(
            "org.apache.kafka.tools.ClientMetricsCommand",
            "--bootstrap-server",
            d.bootstrap,
            "--alter",
            "--name",
            "all-metrics",
            "--metrics",
            "*",
            "--interval",
            "1000",
        ),
    )
    d.step("produce orders (idempotent, acks=all)", lambda: produce(d.bootstrap, "orders", 3000, 100))
    d.step("produce payments", lambda: produce(d.bootstrap, "payments", 300, 50))
    d.step("produce tiered (5 MiB)", lambda: produce(d.bootstrap, TIERED_TOPIC, 5000, 1024))
    d.step("classic consumer group", lambda: consume(d.bootstrap, "orders", "classic-group", "classic", 1000))
    d.step("KIP-848 consumer group", lambda: consume(d.bootstrap, "orders", "kip848-group", "consumer", 1000))
    d.step("transactions", lambda: transactions(d.bootstrap, "orders", "payments"))
    d.step(
        "Java console consumer in a group",
        lambda: d.tool(
            "org.apache.kafka.tools.consumer.ConsoleConsumer",
            "--bootstrap-server",
            d.bootstrap,
            "--topic",
            "orders",
            "--group",
            "console-group",
            "--from-beginning",
            "--max-messages",
            "50",
            "--timeout-ms",
            "30000",
        ),
    )
    d.step(
        "Java producer",
        lambda: d.tool(
            "org.apache.kafka.tools.ProducerPerformance",
            "--topic",
            "orders",
            "--num-records",
            "200",
            "--record-size",
            "100",
            "--throughput",
            "-1",
            "--producer-props",
            f"bootstrap.servers={d.bootstrap}",
            "acks=all",
        ),
    )
    d.step(
        "share.version feature (UpdateFeatures)",
        lambda: d.tool(
            "org.apache.kafka.tools.FeatureCommand",
            "--bootstrap-server",
            d.bootstrap,
            "upgrade",
            "--feature",
            "share.version=1",
        ),
    )
    d.step(
        "share group",
        lambda: d.tool(
            "org.apache.kafka.tools.consumer.ConsoleShareConsumer",
            "--bootstrap-server",
            d.bootstrap,
            "--topic",
            "orders",
            "--group",
            "share-group",
            "--max-messages",
            "20",
            "--timeout-ms",
            "30000",
        ),
    )
    configs = ConfigResource("topic", "orders")
    d.step("describe configs", lambda: d.futures(admin.describe_configs([configs])))
    d.step(
        "incremental alter configs",
        lambda: d.futures(
            admin.incremental_alter_configs(
                [
                    ConfigResource(
                        "topic",
                        "orders",
                        incremental_configs=[
                            ConfigEntry(
                                "retention.ms", "7200000", incremental_operation=AlterConfigOpType.SET
                            )
                        ],
                    )
                ]
            )
        ),
    )
    d.step(
        "alter configs (legacy AlterConfigs)",
        lambda: d.futures(
            admin.alter_configs([ConfigResource("topic", "doomed", set_config={"retention.ms": "600000"})])
        ),
    )
    d.step("create partitions", lambda: d.futures(admin.create_partitions([NewPartitions("payments", 4)])))
    d.step("describe cluster", lambda: admin.describe_cluster().result(30))
    d.step("list groups", lambda: admin.list_consumer_groups().result(30))
    d.step(
        "describe groups",
        lambda: d.futures(admin.describe_consumer_groups(["classic-group", "kip848-group"])),
    )
    d.step("describe topics", lambda: admin.describe_topics(_topic_collection(["orders", "payments"])))
    d.step(
        "delete records",
        lambda: d.futures(admin.delete_records([TopicPartition("orders", 0, 5)])),
    )
    d.step("describe user SCRAM credentials", lambda: admin.describe_user_scram_credentials().result(30))
    d.step("describe ACLs (no authorizer: refused)", lambda: _describe_acls(admin))
    d.step(
        "consumer group offsets delete (OffsetDelete)",
        lambda: d.tool(
            "org.apache.kafka.tools.consumer.group.ConsumerGroupCommand",
            "--bootstrap-server",
            d.bootstrap,
            "--delete-offsets",
            "--group",
            "classic-group",
            "--topic",
            "orders",
        ),
    )
    d.step("delete group", lambda: d.futures(admin.delete_consumer_groups(["classic-group"])))
    d.step("reassign orders-0 (leader 3 preferred)", lambda: reassign(d))
    d.step(
        "preferred leader election",
        lambda: d.tool(
            "org.apache.kafka.tools.LeaderElectionCommand",
            "--bootstrap-server",
            d.bootstrap,
            "--election-type",
            "PREFERRED",
            "--all-topic-partitions",
        ),
    )
    # Offsets committed under orders-0's earlier leader epoch: a consumer that
    # resumes from them may validate its position first (KIP-320,
    # OffsetForLeaderEpoch); fencewatch's probe asks every leader with it at
    # the current, a future and the past epoch, as a stale client would.
    d.step(
        "fencewatch probe (Fetch, ListOffsets, OffsetForLeaderEpoch at three epochs)",
        lambda: subprocess.run(
            [sys.executable, "-m", "fencewatch", "probe", "--bootstrap-servers", d.bootstrap, "--once"],
            capture_output=True,
            check=True,
            timeout=300,
        ),
    )
    d.step(
        "KIP-848 group resumes after the election",
        lambda: consume(d.bootstrap, "orders", "kip848-group", "consumer", 100),
    )
    d.step(
        "Java console consumer's group resumes after the election",
        lambda: d.tool(
            "org.apache.kafka.tools.consumer.ConsoleConsumer",
            *("--bootstrap-server", d.bootstrap, "--topic", "orders", "--group", "console-group"),
            *("--max-messages", "20", "--timeout-ms", "20000"),
        ),
    )
    for name, main_class, args in (
        (
            "describe quorum (controllers)",
            "org.apache.kafka.tools.MetadataQuorumCommand",
            ("--bootstrap-controller", d.controllers, "describe", "--status"),
        ),
        (
            "describe features",
            "org.apache.kafka.tools.FeatureCommand",
            ("--bootstrap-server", d.bootstrap, "describe"),
        ),
        (
            "describe log dirs",
            "org.apache.kafka.tools.LogDirsCommand",
            ("--bootstrap-server", d.bootstrap, "--describe"),
        ),
        (
            "list transactions",
            "org.apache.kafka.tools.TransactionsCommand",
            ("--bootstrap-server", d.bootstrap, "list"),
        ),
        (
            "describe producers",
            "org.apache.kafka.tools.TransactionsCommand",
            (
                "--bootstrap-server",
                d.bootstrap,
                "describe-producers",
                "--topic",
                "orders",
                "--partition",
                "1",
            ),
        ),
        (
            "describe transaction",
            "org.apache.kafka.tools.TransactionsCommand",
            ("--bootstrap-server", d.bootstrap, "describe", "--transactional-id", "sample-txn"),
        ),
        (
            "list groups of every type",
            "org.apache.kafka.tools.GroupsCommand",
            ("--bootstrap-server", d.bootstrap, "--list"),
        ),
        (
            "describe share group",
            "org.apache.kafka.tools.consumer.group.ShareGroupCommand",
            ("--bootstrap-server", d.bootstrap, "--describe", "--group", "share-group"),
        ),
        (
            "describe KIP-848 group",
            "org.apache.kafka.tools.consumer.group.ConsumerGroupCommand",
            ("--bootstrap-server", d.bootstrap, "--describe", "--group", "kip848-group"),
        ),
        (
            "describe broker configs through a controller",
            "org.apache.kafka.tools.ConfigCommand",
            (
                "--bootstrap-controller",
                d.controllers,
                "--describe",
                "--entity-type",
                "brokers",
                "--entity-name",
                "1",
            ),
        ),
        (
            "client quotas",
            "org.apache.kafka.tools.ConfigCommand",
            (
                "--bootstrap-server",
                d.bootstrap,
                "--alter",
                "--add-config",
                "producer_byte_rate=10485760",
                "--entity-type",
                "clients",
                "--entity-name",
                "sample-client",
            ),
        ),
        (
            "describe client quotas",
            "org.apache.kafka.tools.ConfigCommand",
            ("--bootstrap-server", d.bootstrap, "--describe", "--entity-type", "clients"),
        ),
        (
            "broker API versions",
            "org.apache.kafka.tools.BrokerApiVersionsCommand",
            ("--bootstrap-server", d.bootstrap),
        ),
    ):
        d.step(name, lambda main_class=main_class, args=args: d.tool(main_class, *args))
    d.step(
        "tiered segments uploaded",
        lambda: wait_for("an uploaded segment", lambda: _remote_records(d.bootstrap) >= 2, 120),
    )
    d.step(
        "tiered retention shortened (remote segments deleted)",
        lambda: d.futures(
            admin.incremental_alter_configs(
                [
                    ConfigResource(
                        "topic",
                        TIERED_TOPIC,
                        incremental_configs=[
                            ConfigEntry("retention.ms", "1000", incremental_operation=AlterConfigOpType.SET)
                        ],
                    )
                ]
            )
        ),
    )
    d.step(
        "produce tiered again (rolls a segment past retention)",
        lambda: produce(d.bootstrap, TIERED_TOPIC, 1500, 1024),
    )
    d.step(
        "remote segments deleted",
        lambda: wait_for("a remote deletion", lambda: "DELETE_SEGMENT_FINISHED" in _states(d), 120),
    )
    d.step("delete topics", lambda: d.futures(admin.delete_topics(["doomed", TIERED_TOPIC])))
    # Deleting the topic stops its partitions; Kafka 4.4's RemoteLogManager
    # then deletes their remote segments ("Deleting the remote log segments
    # task for partition"), and this run saw no RemotePartitionDeleteMetadata.
    d.step("clean shutdown and restart of broker 3", lambda: _bounce(cluster, 3))
    d.step("produce after the restart", lambda: produce(d.bootstrap, "orders", 300, 100))
    return d


def _topic_collection(names: list[str]) -> Any:
    from confluent_kafka import TopicCollection

    return TopicCollection(names)


def _describe_acls(admin: AdminClient) -> None:
    from confluent_kafka.admin import (
        AclBindingFilter,
        AclOperation,
        AclPermissionType,
        ResourcePatternType,
        ResourceType,
    )

    acl_filter = AclBindingFilter(
        ResourceType.ANY, None, ResourcePatternType.ANY, None, None, AclOperation.ANY, AclPermissionType.ANY
    )
    admin.describe_acls(acl_filter).result(30)


def reassign(d: Driver) -> None:
    """Move orders-0's replica order so that its preferred leader is another
    broker than its leader now (the preferred election after it moves the
    leadership), as ``kafka-reassign-partitions.sh --execute`` then ``--verify`` does."""
    from confluent_kafka import TopicCollection

    described = d.admin.describe_topics(TopicCollection(["orders"]))["orders"].result(30)
    leader = described.partitions[0].leader.id
    replicas = sorted(b.node_id for b in d.cluster.brokers)
    order = [*(b for b in replicas if b != leader), leader]
    plan = {"version": 1, "partitions": [{"topic": "orders", "partition": 0, "replicas": order}]}
    path = Path(tempfile.mkdtemp(prefix="reassign-")) / "plan.json"
    path.write_text(json.dumps(plan))
    tool = "org.apache.kafka.tools.reassign.ReassignPartitionsCommand"
    d.tool(tool, "--bootstrap-server", d.bootstrap, "--reassignment-json-file", str(path), "--execute")
    d.tool(tool, "--bootstrap-server", d.bootstrap, "--list")
    wait_for(
        "the reassignment",
        lambda: (
            "is complete"
            in d.tool(
                tool, "--bootstrap-server", d.bootstrap, "--reassignment-json-file", str(path), "--verify"
            )
        ),
        60,
    )
    shutil.rmtree(path.parent, ignore_errors=True)


def _bounce(cluster: LocalKafkaCluster, broker: int) -> None:
    cluster.shutdown(broker)
    cluster.start_node(broker)


def read_remote_log_metadata(bootstrap: str) -> list[dict[str, Any]]:
    """Every record of ``__remote_log_metadata``, as stored, in (partition, offset) order."""
    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": "samples-unused", "enable.auto.commit": False}
    )
    try:
        metadata = consumer.list_topics(REMOTE_LOG_METADATA_TOPIC, timeout=30)
        partitions = sorted(metadata.topics[REMOTE_LOG_METADATA_TOPIC].partitions)
        records: list[dict[str, Any]] = []
        for partition in partitions:
            low, high = consumer.get_watermark_offsets(
                TopicPartition(REMOTE_LOG_METADATA_TOPIC, partition), 30
            )
            if high <= low:
                continue
            consumer.assign([TopicPartition(REMOTE_LOG_METADATA_TOPIC, partition, low)])
            offset = low
            while offset < high:
                msg = consumer.poll(10)
                if msg is None:
                    raise RuntimeError(f"{REMOTE_LOG_METADATA_TOPIC}-{partition} stalled at {offset}")
                if msg.error() is not None:
                    continue
                records.append(
                    {
                        "partition": partition,
                        "offset": msg.offset(),
                        "timestamp": msg.timestamp()[1],
                        "key": None if msg.key() is None else base64.b64encode(msg.key()).decode(),
                        "value": base64.b64encode(msg.value() or b"").decode(),
                    }
                )
                offset = msg.offset() + 1
        return records
    finally:
        consumer.close()


def _remote_records(bootstrap: str) -> int:
    try:
        return len(read_remote_log_metadata(bootstrap))
    except Exception:
        return 0


def _states(d: Driver) -> str:
    """The formatter's text of the topic now (to wait for a state to appear)."""
    try:
        return formatter_text(d.cluster, timeout_ms=8000)
    except KafkaSetupError:
        return ""


def formatter_text(cluster: LocalKafkaCluster, timeout_ms: int = 15000) -> str:
    """``__remote_log_metadata`` through Kafka's own formatter and ConsoleConsumer:
    the formatter's lines. (``run_tool`` leaves the tool's log4j without a
    configuration, so its status logger prints the consumer's exit at the
    timeout, ``main ERROR Error processing message ... TimeoutException``, on
    stdout; ``kafka-console-consumer.sh`` logs that to stderr.)"""
    text = cluster.run_tool(
        "org.apache.kafka.tools.consumer.ConsoleConsumer",
        "--bootstrap-server",
        cluster.bootstrap_servers,
        "--topic",
        REMOTE_LOG_METADATA_TOPIC,
        "--from-beginning",
        "--formatter",
        FORMATTER,
        "--timeout-ms",
        str(timeout_ms),
        timeout_seconds=180,
    )
    return "".join(line for line in text.splitlines(keepends=True) if line.startswith("partition: "))


def trim_request_log(text: str, per_api: int) -> tuple[str, dict[str, int]]:
    """The first ``per_api`` entries of each (API, version), and every API's
    count in the whole log (entries are one line each)."""
    kept: list[str] = []
    seen: collections.Counter[tuple[str, int]] = collections.Counter()
    counts: collections.Counter[str] = collections.Counter()
    for line in text.splitlines(keepends=True):
        start = line.find("Completed request:")
        try:
            header = json.loads(
                line[start + len("Completed request:") : line.rindex(" (kafka.request.logger)")]
            )["requestHeader"]
            key = (header["requestApiKeyName"], header["requestApiVersion"])
        except (ValueError, KeyError):
            kept.append(line)  # not an entry this script understands: kept for the parser to judge
            continue
        counts[key[0]] += 1
        seen[key] += 1
        if seen[key] <= per_api:
            kept.append(line)
    return "".join(kept), dict(sorted(counts.items()))


def incremental_fetches(text: str, limit: int) -> list[str]:
    """The first ``limit`` incremental fetch entries (``sessionEpoch`` above 0)
    whose response leaves out a partition of the request (KIP-227 fetch
    sessions: an unchanged partition without error is not answered again)."""
    kept = []
    for line in text.splitlines(keepends=True):
        if '"requestApiKeyName":"FETCH"' not in line:
            continue
        body = json.loads(
            line[line.index("Completed request:") + len("Completed request:") : line.rindex(" (")]
        )
        request, response = body["request"], body.get("response") or {}
        if request.get("sessionEpoch", -1) <= 0:
            continue
        asked = {(t.get("topicId"), p["partition"]) for t in request["topics"] for p in t["partitions"]}
        answered = {
            (t.get("topicId"), p["partitionIndex"])
            for t in response.get("responses", [])
            for p in t["partitions"]
        }
        if asked - answered:
            kept.append(line)
            if len(kept) == limit:
                break
    return kept


def collect(
    cluster: LocalKafkaCluster, out: Path, per_api: int, remote: list[dict[str, Any]], formatter: str
) -> None:
    shutil.rmtree(out, ignore_errors=True)  # the files of this run only
    out.mkdir(parents=True)
    logs = out / "request-logs"
    logs.mkdir(exist_ok=True)
    apis: dict[str, dict[str, int]] = {}
    fetches: list[str] = []
    for node in cluster.layout.nodes:
        name = f"{node.role}-{node.node_id}"
        trimmed, counts = trim_request_log(node.request_log.read_text(), per_api)
        (logs / f"{name}.log").write_text(trimmed)
        apis[name] = counts
        if not node.is_controller:
            fetches += incremental_fetches(node.request_log.read_text(), 1)
    (out / "incremental-fetches.log").write_text("".join(fetches))
    (out / "request-apis.json").write_text(json.dumps(apis, indent=1, sort_keys=True) + "\n")
    for node in cluster.controllers:
        shutil.copyfile(node.quorum_state, out / f"quorum-state-{node.node_id}")
    metadata = out / "metadata"
    metadata.mkdir(exist_ok=True)
    source = cluster.controllers[0].metadata_dir
    snapshots = sorted(
        p for p in source.glob("*.checkpoint") if not p.name.endswith("-0000000000.checkpoint")
    )
    snapshot = snapshots[-1] if snapshots else sorted(source.glob("*.checkpoint"))[-1]
    segment = sorted(source.glob("*.log"))[0]
    shutil.copyfile(snapshot, metadata / snapshot.name)
    # mtime 0: the same bytes gzip the same, so a regeneration changes only what Kafka wrote.
    with open(segment, "rb") as src, gzip.GzipFile(metadata / f"{segment.name}.gz", "wb", mtime=0) as dst:
        shutil.copyfileobj(src, dst)
    dump = cluster.jars.dump_tool_class
    for path in (snapshot, segment):
        text = cluster.run_tool(dump, "--cluster-metadata-decoder", "--files", str(path), timeout_seconds=300)
        with gzip.GzipFile(metadata / f"{path.name}.dump.gz", "wb", mtime=0) as fh:
            fh.write(text.encode())
    with open(out / "remote-log-metadata.jsonl", "w") as fh:
        for record in remote:
            fh.write(json.dumps(record, sort_keys=True) + "\n")
    (out / "remote-log-metadata.txt").write_text(formatter)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kafka-version", default=DEFAULT_VERSION)
    parser.add_argument("--out", type=Path, help="default: tests/data/native/kafka-<version>-cluster")
    parser.add_argument("--per-api", type=int, default=1, help="entries kept per (API, version) and node")
    parser.add_argument("--keep", type=Path, help="run the cluster under this directory and keep it after")
    args = parser.parse_args(argv)
    out = args.out or Path(__file__).parent / "native" / f"kafka-{args.kafka_version}-cluster"
    jars = fetch_kafka(args.kafka_version, progress=log)
    root = args.keep or Path(tempfile.mkdtemp(prefix="fencewatch-samples-"))
    log(f"Kafka {jars.version} under {root}")
    with LocalKafkaCluster(jars, root, heap="320m") as cluster:
        log(f"up: {cluster.bootstrap_servers}")
        driver = drive(cluster)
        remote = read_remote_log_metadata(cluster.bootstrap_servers)
        formatter = formatter_text(cluster)
        # Let a metadata snapshot be taken past the workload (one every 30 s).
        time.sleep(35)
    collect(cluster, out, args.per_api, remote, formatter)
    if args.keep is None:
        shutil.rmtree(root, ignore_errors=True)
    log(f"wrote {out}; steps Kafka refused: {driver.failed or 'none'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
