"""Envelopes in Kafka's native shapes (SPEC 1.2-1.4): request-log bodies as
``kafka.request.logger`` writes them, metadata payloads as
``kafka-dump-log.sh --cluster-metadata-decoder`` prints them. Used by the
simulator and by tests, so both speak exactly what real clusters write."""

from __future__ import annotations

from typing import Any

from detectors.requests import API_NAMES

Envelope = dict[str, Any]

# Every simulated request takes this long from arrival to response (the request
# log's totalTimeMs); its line is stamped at the end (ClusterModel.emit).
TOTAL_TIME_MS = 1.2


def envelope(
    cluster: str,
    kind: str,
    ts_ms: int,
    body: dict[str, Any],
    node: int | None = None,
    offset: int | None = None,
) -> Envelope:
    return {"cluster": cluster, "node": node, "ts_ms": ts_ms, "kind": kind, "offset": offset, "body": body}


def _record(record_type: str, version: int, data: dict[str, Any]) -> dict[str, Any]:
    return {"type": record_type, "version": version, "data": data}


# ---- metadata records ------------------------------------------------------------------


def no_op() -> dict[str, Any]:
    return _record("NO_OP_RECORD", 0, {})


def leader_change(epoch: int, leader: int, voters: list[int], granting: list[int]) -> dict[str, Any]:
    """The LeaderChange control record a new quorum leader writes first in its
    epoch, as detectors.parse_metadata_dump reads it from Kafka 4.1's dump."""
    return {
        "type": "LEADER_CHANGE",
        "partitionLeaderEpoch": epoch,
        "data": {
            "version": 0,
            "leaderId": leader,
            "voters": [{"voterId": v} for v in voters],
            "grantingVoters": [{"voterId": v} for v in granting],
        },
    }


def feature_level(level: int) -> dict[str, Any]:
    return _record("FEATURE_LEVEL_RECORD", 0, {"name": "metadata.version", "featureLevel": level})


def register_broker(
    broker_id: int, epoch: int, *, fenced: bool = True, incarnation: str = ""
) -> dict[str, Any]:
    return _record(
        "REGISTER_BROKER_RECORD",
        3,
        {
            "brokerId": broker_id,
            "isMigratingZkBroker": False,
            "incarnationId": incarnation or f"inc-{broker_id}-{epoch}",
            "brokerEpoch": epoch,
            "endPoints": [
                {"name": "PLAINTEXT", "host": f"broker-{broker_id}", "port": 9092, "securityProtocol": 0}
            ],
            "features": [{"name": "metadata.version", "minSupportedVersion": 1, "maxSupportedVersion": 21}],
            "rack": None,
            "fenced": fenced,
            "inControlledShutdown": False,
            "logDirs": [],
        },
    )


def broker_change(broker_id: int, epoch: int, *, fenced: int = 0, shutdown: bool = False) -> dict[str, Any]:
    """``fenced``: 1 fence, -1 unfence, 0 no change (a tagged field, so omitted when 0)."""
    data: dict[str, Any] = {"brokerId": broker_id, "brokerEpoch": epoch}
    if fenced:
        data["fenced"] = fenced
    if shutdown:
        data["inControlledShutdown"] = 1
    return _record("BROKER_REGISTRATION_CHANGE_RECORD", 2, data)


def unregister_broker(broker_id: int, epoch: int) -> dict[str, Any]:
    return _record("UNREGISTER_BROKER_RECORD", 0, {"brokerId": broker_id, "brokerEpoch": epoch})


def topic(name: str, topic_id: str) -> dict[str, Any]:
    return _record("TOPIC_RECORD", 0, {"name": name, "topicId": topic_id})


def remove_topic(topic_id: str) -> dict[str, Any]:
    return _record("REMOVE_TOPIC_RECORD", 0, {"topicId": topic_id})


def partition(
    topic_id: str,
    index: int,
    replicas: list[int],
    isr: list[int],
    leader: int,
    leader_epoch: int = 0,
    partition_epoch: int = 0,
) -> dict[str, Any]:
    return _record(
        "PARTITION_RECORD",
        2,
        {
            "partitionId": index,
            "topicId": topic_id,
            "replicas": replicas,
            "isr": isr,
            "removingReplicas": [],
            "addingReplicas": [],
            "leader": leader,
            "leaderRecoveryState": 0,
            "leaderEpoch": leader_epoch,
            "partitionEpoch": partition_epoch,
        },
    )


def partition_change(
    topic_id: str,
    index: int,
    *,
    leader: int | None = None,
    isr: list[int] | None = None,
    replicas: list[int] | None = None,
) -> dict[str, Any]:
    """Only what changed, as Kafka writes it: ``leader`` is a tagged field (-2 = no change)."""
    data: dict[str, Any] = {"partitionId": index, "topicId": topic_id}
    if leader is not None:
        data["leader"] = leader
    if isr is not None:
        data["isr"] = isr
    if replicas is not None:
        data["replicas"] = replicas
    return _record("PARTITION_CHANGE_RECORD", 0, data)


# ---- request-log bodies -----------------------------------------------------------------


def _completed(
    api_key: int,
    version: int,
    correlation_id: int,
    client_id: str,
    request: dict[str, Any],
    response: dict[str, Any] | None,
) -> dict[str, Any]:
    return {
        "isForwarded": False,
        "requestHeader": {
            "requestApiKey": api_key,
            "requestApiVersion": version,
            "correlationId": correlation_id,
            "clientId": client_id,
            "requestApiKeyName": API_NAMES.get(api_key, str(api_key)),
        },
        "request": request,
        "response": response,
        "connection": "127.0.0.1:9092-127.0.0.1:53422-0",
        "totalTimeMs": TOTAL_TIME_MS,
        "requestQueueTimeMs": 0.1,
        "localTimeMs": 0.8,
        "remoteTimeMs": 0.0,
        "throttleTimeMs": 0,
        "responseQueueTimeMs": 0.1,
        "sendTimeMs": 0.2,
        "securityProtocol": "PLAINTEXT",
        "principal": "User:ANONYMOUS",
        "listener": "PLAINTEXT",
        "clientInformation": {"softwareName": "apache-kafka-java", "softwareVersion": "3.9.0"},
    }


def produce(
    topic_name: str,
    index: int,
    error: int,
    *,
    epoch: int | None = None,
    acks: int = -1,
    correlation_id: int = 1,
    client_id: str = "producer-1",
) -> dict[str, Any]:
    part: dict[str, Any] = {"index": index, "recordsSizeInBytes": 512}
    if epoch is not None:
        part["currentLeaderEpoch"] = epoch  # KIP-359; stock Kafka clients never send it
    request = {
        "transactionalId": None,
        "acks": acks,
        "timeoutMs": 30000,
        "topicData": [{"name": topic_name, "partitionData": [part]}],
    }
    response = {
        "responses": [
            {
                "name": topic_name,
                "partitionResponses": [
                    {
                        "index": index,
                        "errorCode": error,
                        "baseOffset": -1 if error else 1000,
                        "logAppendTimeMs": -1,
                        "logStartOffset": 0,
                        "recordErrors": [],
                        "errorMessage": None,
                    }
                ],
            }
        ],
        "throttleTimeMs": 0,
    }
    return _completed(0, 9, correlation_id, client_id, request, response)


def fetch(
    topic_name: str,
    index: int,
    error: int,
    *,
    epoch: int = -1,
    replica_id: int = -1,
    correlation_id: int = 1,
    client_id: str = "consumer-1",
) -> dict[str, Any]:
    request = {
        "replicaId": replica_id,
        "maxWaitMs": 500,
        "minBytes": 1,
        "maxBytes": 52428800,
        "isolationLevel": 0,
        "sessionId": 0,
        "sessionEpoch": -1,
        "topics": [
            {
                "topic": topic_name,
                "partitions": [
                    {
                        "partition": index,
                        "currentLeaderEpoch": epoch,
                        "fetchOffset": 100,
                        "lastFetchedEpoch": -1,
                        "logStartOffset": -1,
                        "partitionMaxBytes": 1048576,
                    }
                ],
            }
        ],
        "forgottenTopicsData": [],
        "rackId": "",
    }
    response = {
        "throttleTimeMs": 0,
        "errorCode": 0,
        "sessionId": 0,
        "responses": [
            {
                "topic": topic_name,
                "partitions": [
                    {
                        "partitionIndex": index,
                        "errorCode": error,
                        "highWatermark": 120,
                        "lastStableOffset": 120,
                        "logStartOffset": 0,
                        "abortedTransactions": None,
                        "preferredReadReplica": -1,
                        "recordsSizeInBytes": 0,
                    }
                ],
            }
        ],
    }
    return _completed(1, 12, correlation_id, client_id, request, response)


def list_offsets(
    topic_name: str,
    index: int,
    error: int,
    *,
    epoch: int = -1,
    correlation_id: int = 1,
    client_id: str = "consumer-1",
) -> dict[str, Any]:
    request = {
        "replicaId": -1,
        "isolationLevel": 0,
        "topics": [
            {
                "name": topic_name,
                "partitions": [{"partitionIndex": index, "currentLeaderEpoch": epoch, "timestamp": -1}],
            }
        ],
    }
    response = {
        "throttleTimeMs": 0,
        "topics": [
            {
                "name": topic_name,
                "partitions": [
                    {
                        "partitionIndex": index,
                        "errorCode": error,
                        "timestamp": -1,
                        "offset": 120,
                        "leaderEpoch": epoch,
                    }
                ],
            }
        ],
    }
    return _completed(2, 7, correlation_id, client_id, request, response)


def stop_replica(
    topic_name: str,
    index: int,
    leader_epoch: int,
    error: int,
    *,
    controller_epoch: int = 1,
    controller_id: int = 3000,
    broker_epoch: int = 10,
    delete: bool = False,
    top_error: int = 0,
    correlation_id: int = 1,
) -> dict[str, Any]:
    request = {
        "controllerId": controller_id,
        "isKRaftController": False,
        "controllerEpoch": controller_epoch,
        "brokerEpoch": broker_epoch,
        "topicStates": [
            {
                "topicName": topic_name,
                "partitionStates": [
                    {"partitionIndex": index, "leaderEpoch": leader_epoch, "deletePartition": delete}
                ],
            }
        ],
    }
    response = {
        "errorCode": top_error,
        "partitionErrors": []
        if top_error
        else [{"topicName": topic_name, "partitionIndex": index, "errorCode": error}],
    }
    return _completed(5, 3, correlation_id, f"controller-{controller_id}", request, response)


def alter_partition(
    topic_name: str,
    topic_id: str,
    index: int,
    *,
    broker_id: int,
    broker_epoch: int,
    leader_epoch: int,
    partition_epoch: int,
    new_isr: list[int],
    error: int,
    isr_epochs: dict[int, int] | None = None,
    version: int = 3,
    result_leader: int = -1,
    result_leader_epoch: int = -1,
    result_partition_epoch: int = -1,
    top_error: int = 0,
    correlation_id: int = 1,
) -> dict[str, Any]:
    """An AlterPartition as the controller logs it: v0-1 name topics and send
    ``newIsr``; v2 names topics by id; v3+ sends ``newIsrWithEpochs`` (KIP-903)."""
    part: dict[str, Any] = {
        "partitionIndex": index,
        "leaderEpoch": leader_epoch,
        "leaderRecoveryState": 0,
        "partitionEpoch": partition_epoch,
    }
    if version >= 3:
        epochs = isr_epochs or {}
        part["newIsrWithEpochs"] = [{"brokerId": b, "brokerEpoch": epochs.get(b, -1)} for b in new_isr]
    else:
        part["newIsr"] = new_isr
    topic_ref = {"topicId": topic_id} if version >= 2 else {"topicName": topic_name}
    request = {
        "brokerId": broker_id,
        "brokerEpoch": broker_epoch,
        "topics": [{**topic_ref, "partitions": [part]}],
    }
    response = {
        "throttleTimeMs": 0,
        "errorCode": top_error,
        "topics": [
            {
                **topic_ref,
                "partitions": [
                    {
                        "partitionIndex": index,
                        "errorCode": error,
                        "leaderId": result_leader,
                        "leaderEpoch": result_leader_epoch,
                        "isr": new_isr if error == 0 else [],
                        "leaderRecoveryState": 0,
                        "partitionEpoch": result_partition_epoch,
                    }
                ],
            }
        ],
    }
    return _completed(56, version, correlation_id, f"broker-{broker_id}-alter-partition", request, response)


def broker_heartbeat(
    broker_id: int,
    broker_epoch: int,
    current_metadata_offset: int,
    *,
    want_fence: bool = False,
    want_shut_down: bool = False,
    error: int = 0,
    correlation_id: int = 1,
) -> dict[str, Any]:
    """A BrokerHeartbeat (key 63, v1) as the active controller logs it; the
    response fields as Kafka 4.4.0's controller wrote them."""
    request = {
        "brokerId": broker_id,
        "brokerEpoch": broker_epoch,
        "currentMetadataOffset": current_metadata_offset,
        "wantFence": want_fence,
        "wantShutDown": want_shut_down,
    }
    response = {
        "throttleTimeMs": 0,
        "errorCode": error,
        "isCaughtUp": not want_fence,
        "isFenced": want_fence,
        "shouldShutDown": False,
    }
    return _completed(63, 1, correlation_id, str(broker_id), request, response)


# ---- KRaft quorum -------------------------------------------------------------------------


def quorum_state(
    leader_id: int, leader_epoch: int, voted_id: int, voters: list[int], applied_offset: int = 0
) -> dict[str, Any]:
    """The QuorumStateMessage a voter persists (KIP-595)."""
    return {
        "clusterId": "",
        "leaderId": leader_id,
        "leaderEpoch": leader_epoch,
        "votedId": voted_id,
        "appliedOffset": applied_offset,
        "currentVoters": [{"voterId": v} for v in voters],
    }


def _quorum_partition(fields: dict[str, Any]) -> dict[str, Any]:
    return {"topics": [{"topicName": "__cluster_metadata", "partitions": [{"partitionIndex": 0, **fields}]}]}


def vote(
    candidate: int,
    epoch: int,
    granted: bool,
    *,
    pre_vote: bool = False,
    voter: int = -1,
    correlation_id: int = 1,
) -> dict[str, Any]:
    request = {
        "clusterId": "fw",
        "voterId": voter,
        **_quorum_partition(
            {
                "replicaEpoch": epoch,
                "replicaId": candidate,
                "lastOffsetEpoch": epoch - 1,
                "lastOffset": 100,
                "preVote": pre_vote,
            }
        ),
    }
    response = {
        "errorCode": 0,
        **_quorum_partition({"errorCode": 0, "leaderId": -1, "leaderEpoch": epoch, "voteGranted": granted}),
    }
    return _completed(52, 2, correlation_id, f"raft-client-{candidate}", request, response)


def begin_quorum_epoch(leader: int, epoch: int, *, correlation_id: int = 1) -> dict[str, Any]:
    request = {"clusterId": "fw", **_quorum_partition({"leaderId": leader, "leaderEpoch": epoch})}
    response = {
        "errorCode": 0,
        **_quorum_partition({"errorCode": 0, "leaderId": leader, "leaderEpoch": epoch}),
    }
    return _completed(53, 0, correlation_id, f"raft-client-{leader}", request, response)


def end_quorum_epoch(leader: int, epoch: int, *, correlation_id: int = 1) -> dict[str, Any]:
    request = {
        "clusterId": "fw",
        **_quorum_partition({"leaderId": leader, "leaderEpoch": epoch, "preferredSuccessors": []}),
    }
    response = {
        "errorCode": 0,
        **_quorum_partition({"errorCode": 0, "leaderId": leader, "leaderEpoch": epoch}),
    }
    return _completed(54, 0, correlation_id, f"raft-client-{leader}", request, response)


def quorum_fetch(leader: int, epoch: int, replica_id: int, *, correlation_id: int = 1) -> dict[str, Any]:
    """A metadata-log FETCH served by ``leader`` (logged on the leader)."""
    request = {
        "replicaState": {"replicaId": replica_id, "replicaEpoch": -1},
        "maxWaitMs": 500,
        "minBytes": 0,
        "maxBytes": 8388608,
        "isolationLevel": 0,
        "sessionId": 0,
        "sessionEpoch": -1,
        "topics": [
            {
                "topicId": "AAAAAAAAAAAAAAAAAAAAAQ",
                "partitions": [
                    {
                        "partition": 0,
                        "currentLeaderEpoch": epoch,
                        "fetchOffset": 100,
                        "lastFetchedEpoch": epoch,
                        "logStartOffset": -1,
                        "partitionMaxBytes": 0,
                    }
                ],
            }
        ],
    }
    response = {
        "throttleTimeMs": 0,
        "errorCode": 0,
        "sessionId": 0,
        "responses": [
            {
                "topicId": "AAAAAAAAAAAAAAAAAAAAAQ",
                "partitions": [
                    {
                        "partitionIndex": 0,
                        "errorCode": 0,
                        "highWatermark": 100,
                        "lastStableOffset": 100,
                        "logStartOffset": 0,
                        "currentLeader": {"leaderId": leader, "leaderEpoch": epoch},
                        "recordsSizeInBytes": 0,
                    }
                ],
            }
        ],
    }
    return _completed(1, 17, correlation_id, f"raft-client-{replica_id}", request, response)


# ---- tiered storage ------------------------------------------------------------------------


def remote_segment(
    topic_id: str,
    index: int,
    segment_id: str,
    *,
    broker_id: int,
    start: int,
    end: int,
    leader_epochs: dict[int, int],
    cleaner: dict[int, int],
    state: str = "COPY_SEGMENT_STARTED",
    topic_name: str = "",
) -> dict[str, Any]:
    """A RemoteLogSegmentMetadataRecord with the proposal's cleaner-offset map (``cleanerOffsets``)."""
    return {
        "type": "RemoteLogSegmentMetadataRecord",
        "version": 0,
        "data": {
            "remoteLogSegmentId": {
                "topicIdPartition": {"name": topic_name, "id": topic_id, "partition": index},
                "id": segment_id,
            },
            "startOffset": start,
            "endOffset": end,
            "brokerId": broker_id,
            "maxTimestampMs": 0,
            "eventTimestampMs": 0,
            "segmentLeaderEpochs": [
                {"leaderEpoch": e, "offset": o} for e, o in sorted(leader_epochs.items())
            ],
            "segmentSizeInBytes": 1048576,
            "txnIndexEmpty": True,
            "remoteLogSegmentState": state,
            "cleanerOffsets": [{"leaderEpoch": e, "offset": o} for e, o in sorted(cleaner.items())],
        },
    }


def remote_partition_delete(topic_id: str, index: int, *, broker_id: int, state: int) -> dict[str, Any]:
    """A RemotePartitionDeleteMetadataRecord; ``state``: 0 DELETE_PARTITION_MARKED,
    1 _STARTED, 2 _FINISHED (RemotePartitionDeleteState)."""
    return {
        "type": "RemotePartitionDeleteMetadataRecord",
        "version": 0,
        "data": {
            "topicIdPartition": {"name": "", "id": topic_id, "partition": index},
            "brokerId": broker_id,
            "eventTimestampMs": 0,
            "remotePartitionDeleteState": state,
        },
    }


def remote_update(
    topic_id: str, index: int, segment_id: str, *, broker_id: int, state: str
) -> dict[str, Any]:
    return {
        "type": "RemoteLogSegmentMetadataUpdateRecord",
        "version": 0,
        "data": {
            "remoteLogSegmentId": {
                "topicIdPartition": {"name": "", "id": topic_id, "partition": index},
                "id": segment_id,
            },
            "brokerId": broker_id,
            "eventTimestampMs": 0,
            "remoteLogSegmentState": state,
        },
    }
