"""Kafka protocol error codes the rules reason about (SPEC section 2)."""

from enum import IntEnum


class KafkaError(IntEnum):
    NONE = 0
    OFFSET_OUT_OF_RANGE = 1
    UNKNOWN_TOPIC_OR_PARTITION = 3
    NOT_LEADER_OR_FOLLOWER = 6
    STALE_CONTROLLER_EPOCH = 11
    NOT_CONTROLLER = 41
    INVALID_REQUEST = 42
    OPERATION_NOT_ATTEMPTED = 55
    KAFKA_STORAGE_ERROR = 56
    FENCED_LEADER_EPOCH = 74
    UNKNOWN_LEADER_EPOCH = 75
    STALE_BROKER_EPOCH = 77
    INVALID_UPDATE_VERSION = 95
    UNKNOWN_TOPIC_ID = 100
    INELIGIBLE_REPLICA = 107
    NEW_LEADER_ELECTED = 108


def error_name(code: int) -> str:
    """Kafka's name for an error code, or the number itself when unknown."""
    try:
        return KafkaError(code).name
    except ValueError:
        return str(code)
