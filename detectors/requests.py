"""Kafka request-log bodies (SPEC 1.2) turned into the typed outcomes the
rules judge: one entry per partition with the request's epoch and the error
the broker answered. Field names are Kafka's JSON schema names."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from detectors.envelope import BadRecord, DeadLetterClass
from detectors.fast_init import fast_init
from detectors.fields import (
    INT16,
    INT32,
    INT64,
    get_bool,
    get_int,
    get_list,
    get_obj,
    get_str,
    int_list,
    objects,
)
from detectors.pickling import fast_pickle

_T = TypeVar("_T")

PRODUCE, FETCH, LIST_OFFSETS, LEADER_AND_ISR, STOP_REPLICA, UPDATE_METADATA = 0, 1, 2, 4, 5, 6
OFFSET_FOR_LEADER_EPOCH, VOTE, BEGIN_QUORUM_EPOCH, END_QUORUM_EPOCH, ALTER_PARTITION = 23, 52, 53, 54, 56
BROKER_HEARTBEAT = 63
API_NAMES = {
    PRODUCE: "PRODUCE",
    FETCH: "FETCH",
    LIST_OFFSETS: "LIST_OFFSETS",
    LEADER_AND_ISR: "LEADER_AND_ISR",
    STOP_REPLICA: "STOP_REPLICA",
    UPDATE_METADATA: "UPDATE_METADATA",
    OFFSET_FOR_LEADER_EPOCH: "OFFSET_FOR_LEADER_EPOCH",
    VOTE: "VOTE",
    BEGIN_QUORUM_EPOCH: "BEGIN_QUORUM_EPOCH",
    END_QUORUM_EPOCH: "END_QUORUM_EPOCH",
    ALTER_PARTITION: "ALTER_PARTITION",
    BROKER_HEARTBEAT: "BROKER_HEARTBEAT",
}
# Kafka's API keys stop well below this; a larger key is not a Kafka request.
MAX_KAFKA_API_KEY = 200

METADATA_TOPIC = "__cluster_metadata"
METADATA_TOPIC_ID = "AAAAAAAAAAAAAAAAAAAAAQ"


@fast_pickle
@fast_init
@dataclass(frozen=True, slots=True)
class Header:
    api_key: int
    api_version: int
    correlation_id: int
    client_id: str | None

    @property
    def request_ref(self) -> str:
        """Identifies the request among the node's requests (for alert ids)."""
        return f"{self.api_key}/{self.correlation_id}/{self.client_id}"


def header(body: dict[str, Any]) -> Header:
    h = body.get("requestHeader")
    if type(h) is dict:
        # The everyday header, checked as _checked_header checks it without a call per field.
        api_key = h.get("requestApiKey")
        version = h.get("requestApiVersion")
        correlation_id = h.get("correlationId")
        client_id = h.get("clientId")
        if (
            type(api_key) is int
            and 0 <= api_key <= MAX_KAFKA_API_KEY
            and type(version) is int
            and INT16[0] <= version <= INT16[1]
            and type(correlation_id) is int
            and INT32[0] <= correlation_id <= INT32[1]
            and (client_id is None or type(client_id) is str)
        ):
            return Header(api_key, version, correlation_id, client_id)
    return _checked_header(body)


def _checked_header(body: dict[str, Any]) -> Header:
    """The header of any body, raising BadRecord naming the first bad field."""
    h = get_obj(body, "requestHeader", "body")
    return Header(
        api_key=get_int(h, "requestApiKey", "body.requestHeader", bounds=(0, MAX_KAFKA_API_KEY)),
        api_version=get_int(h, "requestApiVersion", "body.requestHeader", bounds=INT16),
        correlation_id=get_int(h, "correlationId", "body.requestHeader"),
        client_id=get_str(h, "clientId", "body.requestHeader", default=None),
    )


@fast_pickle
@fast_init
@dataclass(frozen=True, slots=True)
class PartitionOutcome:
    """One partition of a data-plane request and how the broker answered it.
    ``epoch`` is the request's ``currentLeaderEpoch`` (-1: none sent);
    ``error`` is None when the response has no entry for the partition (an
    incremental fetch's response leaves one out only without error: NONE)."""

    topic: str | None
    topic_id: str | None
    partition: int
    epoch: int
    error: int | None


@fast_pickle
@dataclass(frozen=True, slots=True)
class _Shape:
    """Where an API keeps its per-partition fields (they differ by API)."""

    req_topics: str
    req_parts: str
    req_index: str
    resp_topics: str
    resp_parts: str
    resp_index: str


_SHAPES = {
    PRODUCE: _Shape("topicData", "partitionData", "index", "responses", "partitionResponses", "index"),
    FETCH: _Shape("topics", "partitions", "partition", "responses", "partitions", "partitionIndex"),
    LIST_OFFSETS: _Shape("topics", "partitions", "partitionIndex", "topics", "partitions", "partitionIndex"),
    OFFSET_FOR_LEADER_EPOCH: _Shape("topics", "partitions", "partition", "topics", "partitions", "partition"),
}


_TOPIC_NAME_KEYS = ("name", "topic", "topicName")


def _topic_ref(topic: dict[str, Any], path: str) -> tuple[str | None, str | None]:
    name = None
    for key in _TOPIC_NAME_KEYS:
        if key in topic:
            name = get_str(topic, key, path)
            break
    topic_id = get_str(topic, "topicId", path, default=None)
    if name is None and topic_id is None:
        raise BadRecord(f"{path} has neither a topic name nor a topicId", DeadLetterClass.MISSING_FIELD)
    return name, topic_id


def partition_outcomes(api_key: int, body: dict[str, Any]) -> list[PartitionOutcome]:
    """Per-partition outcomes of a PRODUCE, FETCH, LIST_OFFSETS or OFFSET_FOR_LEADER_EPOCH.
    A partition without a response entry has no error (``None``: its outcome
    is unknown), but in an incremental fetch (:func:`_omitted_error`)."""
    shape = _SHAPES[api_key]
    omitted = _omitted_error(body) if api_key == FETCH else None
    try:
        return _plain_outcomes(shape, body, omitted)
    except _NotPlain:
        return _checked_outcomes(shape, body, omitted)


def _omitted_error(body: dict[str, Any]) -> int | None:
    """The error of a partition an incremental fetch's response leaves out: NONE.

    In a fetch session (KIP-227) a request of ``sessionEpoch`` above 0 is
    incremental, and its response leaves out every partition that has no new
    data, no new high watermark or log start offset, no preferred replica, no
    diverging epoch and no error: "Partitions with errors are always included
    in the response" (``FetchSession.CachedPartition.maybeUpdateResponseData``,
    server/src/main/java/org/apache/kafka/server/FetchSession.java). So a
    partition of the request missing from such a response was read without
    error, at the request's epoch. Not so when the response failed as a whole
    (a top-level ``errorCode``: it lists no partitions) or was throttled (a
    throttled response is sent empty, ``FetchManager``'s throttled response,
    and nothing was read): then None, unknown."""
    request, response = body.get("request"), body.get("response")
    if type(request) is not dict or type(response) is not dict:
        return None
    epoch = request.get("sessionEpoch")
    if type(epoch) is not int or epoch <= 0:  # 0: a new session, -1: no session (full fetches)
        return None
    if response.get("errorCode", 0) != 0 or response.get("throttleTimeMs", 0) != 0:
        return None
    return 0  # NONE


class _NotPlain(Exception):
    """A value the plain readers do not accept: the checked reader says what is wrong."""


_INT16_LO, _INT16_HI = INT16
_INT32_LO, _INT32_HI = INT32


def _plain_topics(
    obj: Any, topics_key: str, parts_key: str, *, required: bool
) -> list[tuple[str | None, str | None, list[Any]]]:
    """(topic name, topic id, partition entries) of every topic under
    ``obj[topics_key]``, accepting exactly what the field helpers and
    _topic_ref accept (an absent or null topic list only if not ``required``);
    the entries themselves are the caller's to check."""
    if type(obj) is not dict:
        raise _NotPlain
    topics = obj.get(topics_key)
    if topics is None and not required:
        return []
    if type(topics) is not list:
        raise _NotPlain
    out = []
    for topic in topics:
        if type(topic) is not dict:
            raise _NotPlain
        name = None
        for key in _TOPIC_NAME_KEYS:
            if key in topic:
                name = topic[key]
                if type(name) is not str:
                    raise _NotPlain
                break
        topic_id = topic.get("topicId")
        if (topic_id is not None and type(topic_id) is not str) or (name is None and topic_id is None):
            raise _NotPlain
        parts = topic.get(parts_key)
        if type(parts) is not list:
            raise _NotPlain
        out.append((name, topic_id, parts))
    return out


def _plain_entries(
    parts: list[Any], index_key: str, key: str, default: int, bounds: tuple[int, int]
) -> list[tuple[int, int]]:
    """(partition index, ``key``'s value or ``default``) of each partition entry
    of one topic, checked as get_int checks them, in one loop (no call per
    entry). Raises _NotPlain at the first value it does not accept."""
    lo, hi = bounds
    out = []
    for part in parts:
        if type(part) is not dict:
            raise _NotPlain
        index = part.get(index_key)
        value = part.get(key, default)
        if (
            type(index) is not int
            or not _INT32_LO <= index <= _INT32_HI
            or type(value) is not int
            or not lo <= value <= hi
        ):
            raise _NotPlain
        out.append((index, value))
    return out


def _plain_outcomes(shape: _Shape, body: dict[str, Any], omitted: int | None) -> list[PartitionOutcome]:
    """The outcomes of a well-formed body, checked like _checked_outcomes checks
    them but without building a field path per entry (millions of requests, almost
    none malformed), a topic's partitions checked in one loop. Raises
    _NotPlain at the first value it does not accept."""
    response = body.get("response")
    answered: dict[tuple[str | None, int], int] = {}
    if response is not None:
        if type(response) is not dict:
            raise _NotPlain
        top_error = response.get("errorCode", 0)
        if type(top_error) is not int or not _INT16_LO <= top_error <= _INT16_HI:
            raise _NotPlain
        for name, topic_id, parts in _plain_topics(
            response, shape.resp_topics, shape.resp_parts, required=False
        ):
            ref = topic_id or name
            for index, error in _plain_entries(parts, shape.resp_index, "errorCode", top_error, INT16):
                answered[(ref, index)] = error
    outcomes = []
    for name, topic_id, parts in _plain_topics(
        body.get("request"), shape.req_topics, shape.req_parts, required=True
    ):
        ref = topic_id or name
        for index, epoch in _plain_entries(parts, shape.req_index, "currentLeaderEpoch", -1, INT32):
            outcomes.append(
                PartitionOutcome(name, topic_id, index, epoch, answered.get((ref, index), omitted))
            )
    return outcomes


def _checked_outcomes(shape: _Shape, body: dict[str, Any], omitted: int | None) -> list[PartitionOutcome]:
    """The outcomes of any body, raising BadRecord with the path of the first bad field."""
    request = get_obj(body, "request", "body")
    response = get_obj(body, "response", "body", default=None)
    answered: dict[tuple[str | None, int], int] = {}
    if response is not None:
        top_error = get_int(response, "errorCode", "body.response", bounds=INT16, default=0)
        rpath = f"body.response.{shape.resp_topics}"
        for tpath, topic in objects(
            get_list(response, shape.resp_topics, "body.response", default=[]), rpath
        ):
            name, topic_id = _topic_ref(topic, tpath)
            ppath = f"{tpath}.{shape.resp_parts}"
            for path, part in objects(get_list(topic, shape.resp_parts, tpath), ppath):
                index = get_int(part, shape.resp_index, path)
                error = get_int(part, "errorCode", path, bounds=INT16, default=top_error)
                answered[(topic_id or name, index)] = error
    outcomes = []
    qpath = f"body.request.{shape.req_topics}"
    for tpath, topic in objects(get_list(request, shape.req_topics, "body.request"), qpath):
        name, topic_id = _topic_ref(topic, tpath)
        ppath = f"{tpath}.{shape.req_parts}"
        for path, part in objects(get_list(topic, shape.req_parts, tpath), ppath):
            index = get_int(part, shape.req_index, path)
            epoch = get_int(part, "currentLeaderEpoch", path, default=-1)
            outcomes.append(
                PartitionOutcome(
                    name, topic_id, index, epoch, answered.get((topic_id or name, index), omitted)
                )
            )
    return outcomes


def is_quorum_fetch(body: dict[str, Any]) -> bool:
    """A FETCH of the KRaft metadata log (KIP-595), served by a quorum leader."""
    request = body.get("request")
    if not isinstance(request, dict):
        return False
    topics = request.get("topics")
    if not isinstance(topics, list) or len(topics) != 1 or not isinstance(topics[0], dict):
        return False
    topic = topics[0]
    return topic.get("topic") == METADATA_TOPIC or topic.get("topicId") == METADATA_TOPIC_ID


def fetch_replica_id(request: dict[str, Any]) -> int:
    """The fetching replica (-1 for consumers): ``replicaId`` before v15,
    ``replicaState.replicaId`` from v15 (KIP-903)."""
    state = request.get("replicaState")
    if isinstance(state, dict):
        return get_int(state, "replicaId", "body.request.replicaState", default=-1)
    return get_int(request, "replicaId", "body.request", default=-1)


def _answered(body: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any], int]:
    """(request, response, the response's top-level ``errorCode``) of a
    controller-to-broker or AlterPartition line, which always has a response."""
    request = get_obj(body, "request", "body")
    response = get_obj(body, "response", "body")
    return request, response, get_int(response, "errorCode", "body.response", bounds=INT16, default=0)


@fast_pickle
@dataclass(frozen=True, slots=True)
class StopReplicaPartition:
    topic: str
    partition: int
    leader_epoch: int  # -1: none sent (v<3); -2: topic deletion sentinel (KIP-570)
    delete: bool
    error: int | None


@fast_pickle
@dataclass(frozen=True, slots=True)
class StopReplica:
    controller_id: int
    controller_epoch: int
    broker_epoch: int
    error: int
    partitions: tuple[StopReplicaPartition, ...]


def stop_replica(api_version: int, body: dict[str, Any]) -> StopReplica:
    request, response, error = _answered(body)
    errors: dict[tuple[str, int], int] = {}
    epath = "body.response.partitionErrors"
    for path, item in objects(get_list(response, "partitionErrors", "body.response", default=[]), epath):
        topic_name = get_str(item, "topicName", path)
        assert topic_name is not None
        errors[(topic_name, get_int(item, "partitionIndex", path))] = get_int(
            item, "errorCode", path, bounds=INT16
        )
    partitions: list[StopReplicaPartition] = []
    if api_version >= 3:
        spath = "body.request.topicStates"
        for tpath, topic in objects(get_list(request, "topicStates", "body.request"), spath):
            name = get_str(topic, "topicName", tpath)
            assert name is not None
            ppath = f"{tpath}.partitionStates"
            for path, part in objects(get_list(topic, "partitionStates", tpath), ppath):
                index = get_int(part, "partitionIndex", path)
                partitions.append(
                    StopReplicaPartition(
                        name,
                        index,
                        get_int(part, "leaderEpoch", path, default=-1),
                        get_bool(part, "deletePartition", path, default=False),
                        errors.get((name, index), error if error else None),
                    )
                )
    return StopReplica(
        controller_id=get_int(request, "controllerId", "body.request"),
        controller_epoch=get_int(request, "controllerEpoch", "body.request"),
        broker_epoch=get_int(request, "brokerEpoch", "body.request", bounds=INT64, default=-1),
        error=error,
        partitions=tuple(partitions),
    )


@fast_pickle
@dataclass(frozen=True, slots=True)
class LeaderAndIsrPartition:
    topic: str
    topic_id: str | None
    partition: int
    leader: int
    leader_epoch: int
    partition_epoch: int
    isr: tuple[int, ...]
    replicas: tuple[int, ...]
    error: int


def leader_and_isr(body: dict[str, Any]) -> tuple[int, int, list[LeaderAndIsrPartition]]:
    """(controller epoch, top-level error, partitions) of a ZooKeeper-mode LeaderAndIsr."""
    request, response, error = _answered(body)
    errors: dict[tuple[str, int], int] = {}
    for tpath, topic in objects(
        get_list(response, "topics", "body.response", default=[]), "body.response.topics"
    ):
        key = get_str(topic, "topicId", tpath)
        for path, item in objects(get_list(topic, "partitionErrors", tpath), f"{tpath}.partitionErrors"):
            errors[(key or "", get_int(item, "partitionIndex", path))] = get_int(item, "errorCode", path)
    epath = "body.response.partitionErrors"
    for path, item in objects(get_list(response, "partitionErrors", "body.response", default=[]), epath):
        key = get_str(item, "topicName", path)
        errors[(key or "", get_int(item, "partitionIndex", path))] = get_int(item, "errorCode", path)
    states: list[tuple[str, str | None, str, dict[str, Any]]] = []
    for tpath, topic in objects(
        get_list(request, "topicStates", "body.request", default=[]), "body.request.topicStates"
    ):
        name = get_str(topic, "topicName", tpath)
        topic_id = get_str(topic, "topicId", tpath, default=None)
        assert name is not None
        for path, part in objects(get_list(topic, "partitionStates", tpath), f"{tpath}.partitionStates"):
            states.append((name, topic_id, path, part))
    upath = "body.request.ungroupedPartitionStates"
    for path, part in objects(
        get_list(request, "ungroupedPartitionStates", "body.request", default=[]), upath
    ):
        name = get_str(part, "topicName", path)
        assert name is not None
        states.append((name, None, path, part))
    partitions = []
    for name, topic_id, path, part in states:
        index = get_int(part, "partitionIndex", path)
        epoch_key = "partitionEpoch" if "partitionEpoch" in part else "zkVersion"
        partitions.append(
            LeaderAndIsrPartition(
                topic=name,
                topic_id=topic_id,
                partition=index,
                leader=get_int(part, "leader", path),
                leader_epoch=get_int(part, "leaderEpoch", path),
                partition_epoch=get_int(part, epoch_key, path, default=-1),
                isr=int_list(get_list(part, "isr", path), f"{path}.isr"),
                replicas=int_list(get_list(part, "replicas", path, default=[]), f"{path}.replicas"),
                error=errors.get((topic_id or name, index), error),
            )
        )
    return get_int(request, "controllerEpoch", "body.request"), error, partitions


def update_metadata(body: dict[str, Any]) -> tuple[int, int]:
    """(controller epoch, error) of a ZooKeeper-mode UpdateMetadata. Kafka's
    UpdateMetadataRequest.json has ``controllerEpoch`` at the top of the request
    in every version; the response carries only ``errorCode``."""
    request, _, error = _answered(body)
    return get_int(request, "controllerEpoch", "body.request"), error


@fast_pickle
@dataclass(frozen=True, slots=True)
class AlterPartitionEntry:
    topic: str | None
    topic_id: str | None
    partition: int
    leader_epoch: int
    partition_epoch: int
    new_isr: tuple[int, ...]
    isr_epochs: dict[int, int]  # broker id -> broker epoch from newIsrWithEpochs (KIP-903)
    error: int | None
    result_partition_epoch: int  # the response's partitionEpoch, -1 if absent


@fast_pickle
@dataclass(frozen=True, slots=True)
class AlterPartition:
    broker_id: int
    broker_epoch: int
    error: int
    partitions: tuple[AlterPartitionEntry, ...]


def alter_partition(body: dict[str, Any]) -> AlterPartition:
    request, response, error = _answered(body)
    answered: dict[tuple[str | None, int], tuple[int, int]] = {}
    for tpath, topic in objects(
        get_list(response, "topics", "body.response", default=[]), "body.response.topics"
    ):
        name, topic_id = _topic_ref(topic, tpath)
        for path, part in objects(get_list(topic, "partitions", tpath), f"{tpath}.partitions"):
            answered[(topic_id or name, get_int(part, "partitionIndex", path))] = (
                get_int(part, "errorCode", path, bounds=INT16),
                get_int(part, "partitionEpoch", path, default=-1),
            )
    entries = []
    for tpath, topic in objects(get_list(request, "topics", "body.request"), "body.request.topics"):
        name, topic_id = _topic_ref(topic, tpath)
        for path, part in objects(get_list(topic, "partitions", tpath), f"{tpath}.partitions"):
            index = get_int(part, "partitionIndex", path)
            isr_epochs: dict[int, int] = {}
            if "newIsrWithEpochs" in part:
                wpath = f"{path}.newIsrWithEpochs"
                for mpath, member in objects(get_list(part, "newIsrWithEpochs", path), wpath):
                    isr_epochs[get_int(member, "brokerId", mpath)] = get_int(
                        member, "brokerEpoch", mpath, bounds=INT64, default=-1
                    )
                new_isr = tuple(isr_epochs)
            else:
                new_isr = int_list(get_list(part, "newIsr", path), f"{path}.newIsr")
            result = answered.get((topic_id or name, index))
            entries.append(
                AlterPartitionEntry(
                    topic=name,
                    topic_id=topic_id,
                    partition=index,
                    leader_epoch=get_int(part, "leaderEpoch", path),
                    partition_epoch=get_int(part, "partitionEpoch", path),
                    new_isr=new_isr,
                    isr_epochs=isr_epochs,
                    error=result[0] if result else (error if error else None),
                    result_partition_epoch=result[1] if result else -1,
                )
            )
    return AlterPartition(
        broker_id=get_int(request, "brokerId", "body.request"),
        broker_epoch=get_int(request, "brokerEpoch", "body.request", bounds=INT64, default=-1),
        error=error,
        partitions=tuple(entries),
    )


@fast_pickle
@dataclass(frozen=True, slots=True)
class BrokerHeartbeat:
    """What a broker said of itself in a BrokerHeartbeat (KIP-631), and the
    controller's answer (BrokerHeartbeatRequest.json / BrokerHeartbeatResponse.json)."""

    broker_id: int
    broker_epoch: int
    # MetadataLoader.lastAppliedOffset when the broker sent it
    # (BrokerLifecycleManager.sendBrokerHeartbeat): every record up to it was published.
    current_metadata_offset: int
    want_fence: bool
    want_shut_down: bool
    error: int


def broker_heartbeat(body: dict[str, Any]) -> BrokerHeartbeat:
    request, _, error = _answered(body)
    return BrokerHeartbeat(
        broker_id=get_int(request, "brokerId", "body.request"),
        broker_epoch=get_int(request, "brokerEpoch", "body.request", bounds=INT64, default=-1),
        current_metadata_offset=get_int(request, "currentMetadataOffset", "body.request", bounds=INT64),
        want_fence=get_bool(request, "wantFence", "body.request", default=False),
        want_shut_down=get_bool(request, "wantShutDown", "body.request", default=False),
        error=error,
    )


def quorum_partitions(body: dict[str, Any], side: str) -> list[tuple[str, dict[str, Any]]]:
    """The partition entries of a VOTE / BEGIN_QUORUM_EPOCH / END_QUORUM_EPOCH
    request or response (``side`` is "request" or "response")."""
    obj = get_obj(body, side, "body", default={} if side == "response" else ...)
    out: list[tuple[str, dict[str, Any]]] = []
    for tpath, topic in objects(get_list(obj, "topics", f"body.{side}", default=[]), f"body.{side}.topics"):
        out.extend(objects(get_list(topic, "partitions", tpath), f"{tpath}.partitions"))
    return out


# Each fanned-out body as decoded already: body id -> (the body, its decoder, what it gave).
_DECODED: dict[int, tuple[dict[str, Any], Callable[..., Any], Any]] = {}


def decoded_once(decode: Callable[..., _T], body: dict[str, Any], *args: Any) -> _T:
    """``decode(*args, body)``, once for all the buckets of a process.

    Every bucket receives a copy of each StopReplica, LeaderAndIsr and
    UpdateMetadata (detectors.buckets), and the buckets of one Spark task are
    handed the same envelope (streaming.processor), so a cluster split in 64
    buckets decoded each body 64 times: its StopReplica copies were 11% of the
    detection's time over a simulated history (docs/performance.md, "Copies of
    cluster-wide records"). Decoding is a function of the body alone; an entry
    holds its body, so the body's id names no other object while it is kept."""
    known = _DECODED.get(id(body))
    if known is not None and known[0] is body and known[1] is decode:
        return known[2]  # type: ignore[no-any-return]
    decoded = decode(*args, body)
    if len(_DECODED) >= 1024:
        _DECODED.clear()
    _DECODED[id(body)] = (body, decode, decoded)
    return decoded
