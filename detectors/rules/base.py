"""The rule catalog: every rule is a class whose docstring names its source
proposal and states its condition; ids are stable (SPEC section 2)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

KIP_LINKS = {
    "KIP-320": "https://cwiki.apache.org/confluence/display/KAFKA/KIP-320%3A+Allow+fetchers+to+detect+and+handle+log+truncation",
    "KIP-359": "https://cwiki.apache.org/confluence/display/KAFKA/KIP-359%3A+Verify+leader+epoch+in+produce+requests",
    "KIP-570": "https://cwiki.apache.org/confluence/display/KAFKA/KIP-570%3A+Add+leader+epoch+in+StopReplicaRequest",
    "KIP-595": "https://cwiki.apache.org/confluence/display/KAFKA/KIP-595%3A+A+Raft+Protocol+for+the+Metadata+Quorum",
    "KIP-841": "https://cwiki.apache.org/confluence/display/KAFKA/KIP-841%3A+Fenced+replicas+should+not+be+allowed+to+join+the+ISR+in+KRaft",
    "KIP-903": "https://cwiki.apache.org/confluence/display/KAFKA/KIP-903%3A+Replicas+with+stale+broker+epoch+should+not+be+allowed+to+join+the+ISR",
    "KIP-405": "https://cwiki.apache.org/confluence/display/KAFKA/KIP-405%3A+Kafka+Tiered+Storage",
    "KIP-1272": "https://cwiki.apache.org/confluence/display/KAFKA/KIP-1272",
}


class Rule:
    """A fencing rule. Subclasses set the class attributes; their docstring is
    the rule's documentation (source, condition, what is not a violation)."""

    id: ClassVar[str]
    severity: ClassVar[str]
    proposals: ClassVar[tuple[str, ...]]

    @classmethod
    def links(cls) -> tuple[str, ...]:
        return tuple(KIP_LINKS[p] for p in cls.proposals if p in KIP_LINKS)


RULES: dict[str, type[Rule]] = {}

# A judgment a rule asks for: ``(judge, facts)``. Once the event's grace window
# is complete the engine calls ``judge(cs, event, *facts)`` with the event
# stripped of its body: judgments use the facts extracted at ingest, and a
# waiting body would only cost memory (and state-store bytes in the streaming job).
Deferred = tuple[Callable[..., None], tuple[Any, ...]]


def register(cls: type[Rule]) -> type[Rule]:
    if cls.id in RULES:
        raise ValueError(f"duplicate rule id {cls.id}")
    RULES[cls.id] = cls
    return cls
