"""Envelopes rendered back into the forms Kafka itself writes, and read again
with fencewatch's own parsers, so that simulated quorum and tiered-storage
traffic takes the path a real cluster's does (``fencewatch ship`` / ``convert``):

* a ``quorum_state`` envelope -> the bytes of the controller's ``quorum-state``
  file as ``FileQuorumStateStore`` writes it with ``data_version`` 0 (one line
  of ``QuorumStateData`` JSON, no newline), read back by
  :func:`detectors.parse_quorum_state.parse_quorum_state`;
* a ``remote_log_metadata`` envelope -> the line ``kafka-console-consumer.sh
  --formatter ...RemoteLogMetadataFormatter`` prints for the record
  (``partition: P, offset: O, value: <toString()>``), read back by
  :func:`detectors.parse_remote_log_metadata.iter_remote_log_metadata`.

What the native forms cannot carry, and so does not survive the round trip:

* KIP-1272's ``cleanerOffsets``: no released Kafka writes or prints it, so the
  segment line has no place for it; REMOTE_SEGMENT_ZOMBIE_UPLOAD_ACCEPTED is
  judged there from ``segmentLeaderEpochs`` and ``endOffset``, which it has;
* the envelope's ``offset`` (a simulated one has none): the parser gives the line's, numbered per
  ``__remote_log_metadata`` partition in the order the records are sent, with
  the partition in ``body["partition"]``, so the detector applies them in each
  partition's offset order (``detectors.redelivery.PartitionedOffsetOrder``);
* the envelope's ``node``: the line names the broker in ``brokerId`` only,
  which is what the rules read.

``eventTimestampMs`` carries the envelope's ``ts_ms`` (the parser turns it back
into ``ts_ms``); the quorum-state file has neither a time nor a node, so the
reader passes the envelope's, as ``fencewatch ship quorum-state`` passes its own.
"""

from __future__ import annotations

import base64
import os
import re
import zlib
from collections.abc import Mapping
from hashlib import blake2b
from typing import Any

import orjson

from detectors.envelope import DeadLetter, Envelope
from detectors.parse_quorum_state import FILE_NAME as QUORUM_STATE_FILE_NAME
from detectors.parse_quorum_state import QuorumStateStats, parse_quorum_state
from detectors.parse_remote_log_metadata import (
    PARTITION_DELETE_STATES,
    RemoteLogMetadataStats,
    iter_remote_log_metadata,
)
from detectors.remote import STATE_NAMES

METADATA_TOPIC_PARTITIONS = 50  # remote.log.metadata.topic.num.partitions' default
REMOTE_LOG_METADATA_FILE = "remote-log-metadata.txt"
NATIVE_KINDS = ("quorum_state", "remote_log_metadata")
_UUID = re.compile(r"[A-Za-z0-9_-]{22}")
# What FileQuorumStateStore writes for data_version 0, in QuorumStateData.json's order.
_QUORUM_STATE_V0 = ("clusterId", "leaderId", "leaderEpoch", "votedId", "appliedOffset", "currentVoters")


def quorum_state_file(body: Mapping[str, Any]) -> bytes:
    """The ``quorum-state`` file holding ``body`` (a QuorumStateData object) as
    ``data_version`` 0: one compact JSON line, ``data_version`` last."""
    data = {key: body[key] for key in _QUORUM_STATE_V0}
    data["data_version"] = 0
    return orjson.dumps(data)


def kafka_uuid(text: str) -> str:
    """``text`` if it is a Kafka Uuid (22 base64url characters), else the Uuid
    of its hash: the simulator names segments ``seg-00000001`` for
    readability, and every record of one segment must print the same Uuid."""
    if _UUID.fullmatch(text):
        return text
    digest = blake2b(text.encode(), digest_size=16).digest()
    return base64.urlsafe_b64encode(digest).decode().rstrip("=")


def metadata_partition(topic_id: str, partition: int, partitions: int = METADATA_TOPIC_PARTITIONS) -> int:
    """The ``__remote_log_metadata`` partition of a topic partition's records.
    Kafka hashes the topic partition (murmur2); any stable hash keeps what the
    parser relies on: all records of one segment share one partition, in order."""
    return zlib.crc32(f"{topic_id}:{partition}".encode()) % partitions


def _topic_id_partition(tip: Mapping[str, Any], names: Mapping[str, str]) -> str:
    """``TopicIdPartition.toString``: ``<topicId>:<topic>-<partition>``. An
    empty name is looked up in ``names`` (topic id -> name)."""
    name = tip.get("name") or names.get(tip["id"])
    if not name:
        raise ValueError(f"no name for topic {tip['id']}: Kafka prints the topic name in every record")
    return f"{tip['id']}:{name}-{tip['partition']}"


def _segment_id(data: Mapping[str, Any], names: Mapping[str, str]) -> str:
    ident = data["remoteLogSegmentId"]
    return (
        f"RemoteLogSegmentId{{topicIdPartition={_topic_id_partition(ident['topicIdPartition'], names)}, "
        f"id={kafka_uuid(ident['id'])}}}"
    )


def _state(value: str | int, names: tuple[str, ...]) -> str:
    # The simulator writes state names, the parser state ids: print the enum name.
    return value if isinstance(value, str) else names[value]


def record_string(body: Mapping[str, Any], ts_ms: int, topic_names: Mapping[str, str] | None = None) -> str:
    """The record's ``toString()``, as ``RemoteLogSegmentMetadata``,
    ``RemoteLogSegmentMetadataUpdate`` or ``RemotePartitionDeleteMetadata``
    print it; ``eventTimestampMs`` is ``ts_ms``. ``topic_names`` (topic id ->
    name) names a topic the body leaves unnamed (``producers.shapes`` writes
    updates without the name, which the rules do not read). Raises ValueError
    for a body Kafka could not have printed."""
    data, record_type = body["data"], body["type"]
    names = topic_names or {}
    if record_type == "RemoteLogSegmentMetadataRecord":
        epochs = ", ".join(f"{e['leaderEpoch']}={e['offset']}" for e in data["segmentLeaderEpochs"])
        txn = "true" if data.get("txnIndexEmpty", True) else "false"
        return (
            f"RemoteLogSegmentMetadata{{remoteLogSegmentId={_segment_id(data, names)}, "
            f"startOffset={data['startOffset']}, endOffset={data['endOffset']}, "
            f"brokerId={data['brokerId']}, maxTimestampMs={data['maxTimestampMs']}, "
            f"eventTimestampMs={ts_ms}, segmentLeaderEpochs={{{epochs}}}, "
            f"segmentSizeInBytes={data['segmentSizeInBytes']}, customMetadata=Optional.empty, "
            f"state={_state(data['remoteLogSegmentState'], STATE_NAMES)}, txnIdxEmpty={txn}}}"
        )
    if record_type == "RemoteLogSegmentMetadataUpdateRecord":
        return (
            f"RemoteLogSegmentMetadataUpdate{{remoteLogSegmentId={_segment_id(data, names)}, "
            f"customMetadata=Optional.empty, state={_state(data['remoteLogSegmentState'], STATE_NAMES)}, "
            f"eventTimestampMs={ts_ms}, brokerId={data['brokerId']}}}"
        )
    if record_type == "RemotePartitionDeleteMetadataRecord":
        state = _state(data["remotePartitionDeleteState"], PARTITION_DELETE_STATES)
        topic_partition = _topic_id_partition(data["topicIdPartition"], names)
        return (
            f"RemotePartitionDeleteMetadata{{topicPartition={topic_partition}, "
            f"state={state}, eventTimestampMs={ts_ms}, brokerId={data['brokerId']}}}"
        )
    raise ValueError(f"{record_type!r} is not a remote log metadata record")


def _topic_partition(body: Mapping[str, Any]) -> Mapping[str, Any]:
    data = body["data"]
    ident = data.get("remoteLogSegmentId")
    tip: Mapping[str, Any] = data["topicIdPartition"] if ident is None else ident["topicIdPartition"]
    return tip


class NativeRoute:
    """Sends envelopes through their native form and back: renders one, reads
    the rendering with the parser ``fencewatch ship`` uses, and returns what the
    parser made of it. Each ``__remote_log_metadata`` partition numbers its
    lines from offset 0, in the order they are sent.

    ``directory``, if given, keeps the native files as a cluster would have
    them: ``controller-<node>/quorum-state``, replaced with each new state the
    way FileQuorumStateStore replaces it (written beside, then renamed), so
    ``fencewatch ship quorum-state`` can watch it, and every state also kept as
    ``controller-<node>/quorum-state.<n>`` (n from 1, in order); and
    ``remote-log-metadata.txt``, the formatter's output.
    """

    def __init__(self, cluster: str, directory: str | None = None):
        self.cluster = cluster
        self.directory = directory
        self.quorum_stats = QuorumStateStats()
        self.remote_stats = RemoteLogMetadataStats()
        self._offsets: dict[int, int] = {}  # metadata partition -> next offset
        self._states: dict[int, int] = {}  # controller -> states written
        self._topic_names: dict[str, str] = {}  # topic id -> name, from the records that name it

    def envelope(self, env: Mapping[str, Any]) -> dict[str, Any]:
        """The envelope ``env`` becomes on the native path. Raises ValueError if
        the parser refuses the rendering (a bug: Kafka's forms are pinned)."""
        if env["kind"] == "quorum_state":
            item = self._quorum_state(env)
        elif env["kind"] == "remote_log_metadata":
            item = self._remote_log_metadata(env)
        else:
            raise ValueError(f"{env['kind']} has no native form here (only {', '.join(NATIVE_KINDS)})")
        if isinstance(item, DeadLetter):
            raise ValueError(
                f"the parser refused the native form of {env['kind']}: {item.reason}: {item.raw}"
            )
        return item.to_dict()

    def _quorum_state(self, env: Mapping[str, Any]) -> Envelope | DeadLetter:
        node = env["node"]
        data = quorum_state_file(env["body"])
        source = f"controller-{node}/{QUORUM_STATE_FILE_NAME}"
        if self.directory is not None:
            self._states[node] = self._states.get(node, 0) + 1
            path = os.path.join(self.directory, source)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(f"{path}.{self._states[node]}", "wb") as f:
                f.write(data)
            with open(f"{path}.tmp", "wb") as f:
                f.write(data)
            os.replace(f"{path}.tmp", path)
        return parse_quorum_state(
            data, source=source, cluster=self.cluster, node=node, ts_ms=env["ts_ms"], stats=self.quorum_stats
        )

    def _remote_log_metadata(self, env: Mapping[str, Any]) -> Envelope | DeadLetter:
        body = env["body"]
        tip = _topic_partition(body)
        if tip.get("name"):
            self._topic_names[tip["id"]] = tip["name"]
        partition = metadata_partition(tip["id"], tip["partition"])
        offset = self._offsets.get(partition, 0)
        self._offsets[partition] = offset + 1
        value = record_string(body, env["ts_ms"], self._topic_names)
        line = f"partition: {partition}, offset: {offset}, value: {value}\n"
        if self.directory is not None:
            os.makedirs(self.directory, exist_ok=True)
            with open(os.path.join(self.directory, REMOTE_LOG_METADATA_FILE), "a", encoding="utf-8") as f:
                f.write(line)
        (item,) = iter_remote_log_metadata(
            [line.encode()], source=REMOTE_LOG_METADATA_FILE, cluster=self.cluster, stats=self.remote_stats
        )
        return item
