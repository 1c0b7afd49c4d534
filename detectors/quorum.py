"""The KRaft metadata quorum as its members reported it (KIP-595): who acted as
leader of which epoch, who voted for whom, and which leaders were fetched from."""

from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass, field

from detectors.alerts import Evidence
from detectors.pickling import fast_pickle

# The body ``type`` of a LeaderChange control record of the metadata log, as
# detectors.parse_metadata_dump makes it: Kafka's ControlRecordType name
# (clients/.../common/record/ControlRecordType.java, id 2), which no metadata
# record type (``*_RECORD``) can take.
LEADER_CHANGE = "LEADER_CHANGE"
# The body ``type`` of a KRaftVoters control record (KIP-853, ControlRecordType id 6):
# the voter set from its offset on (a snapshot's: the voter set the snapshot holds).
KRAFT_VOTERS = "KRAFT_VOTERS"


@fast_pickle
@dataclass(frozen=True, slots=True)
class Claim:
    """A node acting as leader of an epoch (first seen at ``ts_ms``)."""

    node: int
    epoch: int
    ts_ms: int
    evidence: Evidence
    # The latest moment of the metadata log's clock it may have happened at
    # (detectors.cluster.ClusterState.moment); None: ts_ms.
    latest_ms: int | None = None

    @property
    def latest(self) -> int:
        return self.ts_ms if self.latest_ms is None else self.latest_ms

    def order(self) -> tuple[int, int, int, str, int, int, str]:
        """Earliest first, then by what the record says, never by arrival: two
        records of one act at the same millisecond (a node's quorum state and
        the LeaderChange of its election) arrive in either order when records
        are re-delivered or files cut, and the alert must cite the same one."""
        e = self.evidence
        return (
            self.ts_ms,
            self.epoch,
            self.node,
            e.kind,
            _or_minus_one(e.node),
            _or_minus_one(e.offset),
            e.summary,
        )


def _or_minus_one(value: int | None) -> int:
    return -1 if value is None else value


@fast_pickle
@dataclass(slots=True)
class QuorumView:
    # epoch -> node -> its first act as leader of that epoch
    claims: dict[int, dict[int, Claim]] = field(default_factory=dict)
    # (voter, epoch) -> candidate -> the first evidence of that granted vote
    votes: dict[tuple[int, int], dict[int, Claim]] = field(default_factory=dict)
    # node -> (epoch, evidence) of its last persisted quorum state
    persisted_epochs: dict[int, tuple[int, Evidence]] = field(default_factory=dict)
    voters: tuple[int, ...] = ()
    # (leader, epoch) -> voter -> times that leader served the voter's fetches, oldest first
    fetches: dict[tuple[int, int], dict[int, list[int]]] = field(default_factory=dict)
    # (node, epoch) -> evidence of the zombie-leader alert that is firing
    open_zombies: dict[tuple[int, int], Evidence] = field(default_factory=dict)
    # (epoch, evidence) of the highest-epoch LeaderChange of the metadata log so far,
    # in offset order. Last, so that a state pickled before it restores (fast_pickle).
    log_epoch: tuple[int, Evidence] | None = None
    # (epoch, leader) -> the claim of its LeaderChange record, kept beside the
    # leader's earliest claim: the log stamped it, so it is placed exactly, where
    # an earlier claim logged by a node whose clock is not measured cannot be.
    stamped: dict[tuple[int, int], Claim] = field(default_factory=dict)

    def claim_is_new(self, node: int, epoch: int, ts_ms: int) -> bool:
        """Whether :meth:`add_claim` may keep a claim at ``ts_ms``: only each
        node's earliest in an epoch is kept (:meth:`Claim.order`), and a
        leader's every metadata fetch claims again, so its evidence need not be
        built for the later ones."""
        known = self.claims.get(epoch, {}).get(node)
        return known is None or ts_ms <= known.ts_ms

    def add_claim(
        self, node: int, epoch: int, ts_ms: int, evidence: Evidence, latest_ms: int | None = None
    ) -> None:
        """``latest_ms`` None: a claim the metadata log stamped (a LeaderChange record)."""
        claim = Claim(node, epoch, ts_ms, evidence, latest_ms)
        if latest_ms is None:
            self.stamped.setdefault((epoch, node), claim)
        by_node = self.claims.setdefault(epoch, {})
        known = by_node.get(node)
        if known is None or claim.order() < known.order():
            by_node[node] = claim

    def claims_of(self, epoch: int, node: int) -> list[Claim]:
        """The kept claims of ``node`` leading ``epoch``: its earliest and its stamped one."""
        first = self.claims.get(epoch, {}).get(node)
        stamped = self.stamped.get((epoch, node))
        if stamped is None or stamped is first:
            return [] if first is None else [first]
        return [stamped] if first is None else [first, stamped]

    def add_vote(self, voter: int, candidate: int, epoch: int, ts_ms: int, evidence: Evidence) -> None:
        by_candidate = self.votes.setdefault((voter, epoch), {})
        known = by_candidate.get(candidate)
        vote = Claim(candidate, epoch, ts_ms, evidence)
        if known is None or vote.order() < known.order():
            by_candidate[candidate] = vote

    def add_fetch(self, leader: int, epoch: int, voter: int, ts_ms: int) -> None:
        times = self.fetches.setdefault((leader, epoch), {}).setdefault(voter, [])
        if not times or ts_ms >= times[-1]:
            times.append(ts_ms)
        else:
            times.insert(bisect_left(times, ts_ms), ts_ms)

    def fetched_between(self, leader: int, epoch: int, lo_ms: int, hi_ms: int) -> set[int]:
        """Voters whose fetches ``leader`` served in ``epoch`` within ``[lo_ms, hi_ms]``."""
        out = set()
        for voter, times in self.fetches.get((leader, epoch), {}).items():
            i = bisect_left(times, lo_ms)
            if i < len(times) and times[i] <= hi_ms:
                out.add(voter)
        return out

    def prune(self, before_ms: int) -> None:
        """Forget fetch times no judgment can need any more."""
        for by_voter in self.fetches.values():
            for times in by_voter.values():
                i = bisect_left(times, before_ms)
                if i > 1:
                    del times[: i - 1]
