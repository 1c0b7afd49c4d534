"""The fencing rules, one module per protocol area. Importing this package
registers every rule in :data:`detectors.rules.base.RULES`.

:data:`READ_APIS` is what the detector reads of a request log: the API keys
whose entries a rule judges or takes evidence from. ``fencewatch convert
request-log`` and ``fencewatch ship request-log`` keep only these (unless
``--all-apis``); the engine counts an entry of any other API as
``request:unchecked`` and reads nothing else of it. A rule that reads another
API adds it here (tests/unit/test_read_apis.py holds the engine to this list).
"""

from detectors.requests import (
    ALTER_PARTITION,
    BEGIN_QUORUM_EPOCH,
    BROKER_HEARTBEAT,
    END_QUORUM_EPOCH,
    FETCH,
    LEADER_AND_ISR,
    LIST_OFFSETS,
    OFFSET_FOR_LEADER_EPOCH,
    PRODUCE,
    STOP_REPLICA,
    UPDATE_METADATA,
    VOTE,
)
from detectors.rules import alter_partition, fetch, isr, produce, quorum, remote, stop_replica
from detectors.rules.base import RULES, Rule

READ_APIS = frozenset(
    {
        PRODUCE,  # rules.produce; the epochs it states measure its node's clock
        FETCH,  # rules.fetch, and rules.quorum for fetches of __cluster_metadata; clocks as Produce
        LIST_OFFSETS,  # rules.fetch; clocks
        OFFSET_FOR_LEADER_EPOCH,  # rules.fetch; clocks
        STOP_REPLICA,  # rules.stop_replica; the controller epoch it is held to; clocks
        LEADER_AND_ISR,  # ZooKeeper mode: the partitions' leaders and epochs, and the controller epoch
        UPDATE_METADATA,  # ZooKeeper mode: the controller epoch rules.stop_replica holds StopReplica to
        ALTER_PARTITION,  # rules.alter_partition; clocks
        VOTE,  # rules.quorum
        BEGIN_QUORUM_EPOCH,  # rules.quorum
        END_QUORUM_EPOCH,  # rules.quorum
        # How far its broker had applied the metadata log (ClusterState.metadata_applied),
        # for rules.fetch, rules.produce and rules.remote; logged by the active controller.
        BROKER_HEARTBEAT,
    }
)

# The judgments of requests made over the grace windows of every moment the
# node's clock interval allows, which change nothing but the alerts they raise:
# ClusterState.judge makes them again at single offsets to find the possible
# violations among what they do not raise as certain.
CLOCK_WINDOWED = frozenset({produce.judge, fetch.judge, stop_replica.judge, alter_partition.judge})

__all__ = [
    "CLOCK_WINDOWED",
    "READ_APIS",
    "RULES",
    "Rule",
    "alter_partition",
    "fetch",
    "isr",
    "produce",
    "quorum",
    "remote",
    "stop_replica",
]
