"""The fencing rules, one module per protocol area. Importing this package
registers every rule in :data:`detectors.rules.base.RULES`."""

from detectors.rules import alter_partition, fetch, isr, produce, quorum, remote, stop_replica
from detectors.rules.base import RULES, Rule

__all__ = [
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
