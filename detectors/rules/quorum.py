"""KIP-595: the Raft metadata quorum. Acts of leadership, votes and step-downs
are collected as they arrive; judgments run once every source has had its
grace window, so the verdicts do not depend on arrival order."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from detectors.alerts import Evidence
from detectors.envelope import Envelope
from detectors.errors import KafkaError
from detectors.fields import INT32, get_bool, get_int, get_list, get_obj, objects
from detectors.quorum import Claim
from detectors.render import iso_utc
from detectors.requests import (
    BEGIN_QUORUM_EPOCH,
    END_QUORUM_EPOCH,
    FETCH,
    VOTE,
    Header,
    fetch_replica_id,
    quorum_partitions,
)
from detectors.rules.base import Deferred, Rule, register

if TYPE_CHECKING:
    from detectors.cluster import ClusterState

# A LeaderChange's leader id and epoch are never negative: the leader writes it
# about itself, in the epoch it won.
_NON_NEGATIVE = (0, INT32[1])


@register
class QuorumTwoLeadersInEpoch(Rule):
    """KIP-595. Two different nodes acted as leader of the same epoch (persisted
    ``leaderId`` = itself, sent BeginQuorumEpoch, served metadata fetches as
    leader, or is the ``leaderId`` of a LeaderChange control record in the
    metadata log). Raft allows at most one leader per epoch. ``node`` is the
    later claimant. Not a violation: followers naming the leader; the same
    leader announced again for its epoch (its LeaderChange and its quorum
    state agreeing); a new leader in a newer epoch."""

    id = "QUORUM_TWO_LEADERS_IN_EPOCH"
    severity = "critical"
    proposals = ("KIP-595",)


@register
class QuorumEpochRegression(Rule):
    """KIP-595. A node persisted a quorum state whose ``leaderEpoch`` is lower
    than one it persisted before, or a LeaderChange control record of the
    metadata log has a lower epoch than one at a lower offset (a Raft log's
    epochs never decrease along its offsets; ``node`` is the LeaderChange's
    leader, None when the dump does not name it). Epochs only grow. Not a
    violation: the same epoch persisted again (a vote, then the leader
    learned); epochs rising from one LeaderChange to the next."""

    id = "QUORUM_EPOCH_REGRESSION"
    severity = "critical"
    proposals = ("KIP-595",)


@register
class QuorumDoubleVote(Rule):
    """KIP-595. One voter granted its vote to two different candidates in the
    same epoch (from granted Vote responses, persisted ``votedId``, or the
    ``grantingVoters`` of a LeaderChange in the metadata log). Not a
    violation: pre-votes (KIP-996, ``preVote: true``), which do not bind; votes
    in different epochs; a voter that names another node as leader than the
    one it voted for."""

    id = "QUORUM_DOUBLE_VOTE"
    severity = "critical"
    proposals = ("KIP-595",)


@register
class QuorumZombieLeader(Rule):
    """KIP-595. A node still acts as leader of epoch E after another node's
    leadership of a newer epoch had been known for the grace window, or acts as
    leader more than 1.5 x ``quorum.fetch.timeout.ms`` after it last served
    fetches from a majority of the voters. A timer alert: ``firing`` when it
    starts, ``resolved`` when the node steps down (persists another leader or a
    newer epoch, or sends EndQuorumEpoch). Not a violation: an old leader acting
    within the grace window after the election; a leader whose followers fetch
    regularly."""

    id = "QUORUM_ZOMBIE_LEADER"
    severity = "critical"
    proposals = ("KIP-595",)


def ingest_state(cs: ClusterState, env: Envelope) -> list[Deferred]:
    """A ``quorum_state`` event: the QuorumStateMessage ``env.node`` persisted."""
    body, node = env.body, env.node
    assert node is not None
    leader = get_int(body, "leaderId", "body")
    epoch = get_int(body, "leaderEpoch", "body")
    voted = get_int(body, "votedId", "body", default=-1)
    voters = get_list(body, "currentVoters", "body", default=None)
    if voters is not None:
        cs.quorum.voters = tuple(get_int(v, "voterId", p) for p, v in objects(voters, "body.currentVoters"))
    elif get_int(body, "data_version", "body", default=0) >= 1:
        # kraft.version 1 (KIP-853): the voter set lives in the metadata log and may change;
        # the file names none, so voters learned from older files may be stale. Forget them:
        # the fetch-timeout check then waits for a voter set rather than judge by an old one.
        cs.quorum.voters = ()
    q = cs.quorum
    previous = q.persisted_epochs.get(node)
    evidence = Evidence.of("view", env, f"node {node} persisted leader {leader} epoch {epoch}")
    if previous is not None and epoch < previous[0]:
        cs.emit(
            QuorumEpochRegression,
            env,
            message=f"node {node} persisted leader epoch {epoch} after epoch {previous[0]}",
            node=node,
            identity=(epoch, previous[0], env.ts_ms),
            evidence=[previous[1]],
        )
    if previous is None or _persisted_rank(epoch, evidence) >= _persisted_rank(*previous):
        q.persisted_epochs[node] = (epoch, evidence)
    judgments: list[Deferred] = []
    if voted >= 0:
        q.add_vote(node, voted, epoch, env.ts_ms, evidence)
        judgments.append((_judge_vote, (node, voted, epoch)))
    if leader == node:
        q.add_claim(node, epoch, env.ts_ms, evidence, cs.moment(env)[1])
        judgments.append((_judge_claim, (node, epoch)))
    else:
        judgments.append((_judge_step_down, (node, epoch)))
    return judgments


def _persisted_rank(epoch: int, evidence: Evidence) -> tuple[int, int, str]:
    """Which of a node's persisted states is its last: the later, and of two
    of one millisecond (a vote and then the leader learned, often) the higher
    epoch, then either by what it says, never by which arrived last:
    re-delivered records and cut files bring them in either order."""
    return evidence.ts_ms, epoch, evidence.summary


def leader_change(body: dict[str, Any]) -> tuple[int, int]:
    """A LeaderChange record's epoch and leader (-1: not printed, by a tool
    before Kafka 4.1, so the leader is unknown); BadRecord if malformed."""
    epoch = get_int(body, "partitionLeaderEpoch", "body", bounds=_NON_NEGATIVE)
    data = get_obj(body, "data", "body")
    return epoch, get_int(data, "leaderId", "body.data", bounds=_NON_NEGATIVE, default=-1)


def ingest_leader_change(cs: ClusterState, env: Envelope) -> list[Deferred]:
    """A LeaderChange control record of the metadata log (``kind: metadata``,
    ``type: LEADER_CHANGE``; see detectors.parse_metadata_dump), applied in offset
    order. ``partitionLeaderEpoch`` is the epoch of the batch holding it: the
    epoch whose start the leader recorded. ``data`` is the LeaderChangeMessage
    as printed (``leaderId``, ``voters``, ``grantingVoters``) by tools from
    Kafka 4.1 on; older tools print only the control type, so ``data`` is empty
    and only the epoch's order in the log can be judged, not who led it."""
    epoch, leader = leader_change(env.body)
    data = env.body["data"]
    q = cs.quorum
    named = f"node {leader}" if leader >= 0 else "a leader the dump does not name"
    evidence = Evidence.of(
        "view", env, f"LeaderChange at metadata offset {env.offset}: {named} leads epoch {epoch}"
    )
    highest = q.log_epoch
    if highest is not None and epoch < highest[0]:
        cs.emit(
            QuorumEpochRegression,
            env,
            message=f"the metadata log's LeaderChange at offset {env.offset} has epoch {epoch}, "
            f"after epoch {highest[0]} at a lower offset",
            node=leader if leader >= 0 else None,
            identity=(epoch, highest[0], env.offset),
            evidence=[highest[1]],
        )
    else:
        q.log_epoch = (epoch, evidence)
    if leader < 0:
        return []
    voters = get_list(data, "voters", "body.data", default=None)
    if voters is not None:
        # LeaderChangeMessage.voters: the voter set of the epoch as its leader knew it
        # (KafkaRaftClient, LeaderState's voter states), the majority the fetch timeout counts.
        q.voters = tuple(get_int(v, "voterId", p) for p, v in objects(voters, "body.data.voters"))
    q.add_claim(leader, epoch, env.ts_ms, evidence)
    judgments: list[Deferred] = [(_judge_claim, (leader, epoch))]
    # LeaderChangeMessage.grantingVoters: the voters whose votes elected it (the
    # leader's own among them), each a vote granted to the leader in this epoch.
    granting = get_list(data, "grantingVoters", "body.data", default=[])
    for path, v in objects(granting, "body.data.grantingVoters"):
        voter = get_int(v, "voterId", path)
        vote = Evidence.of(
            "view",
            env,
            f"LeaderChange at metadata offset {env.offset}: voter {voter} elected {leader} in epoch {epoch}",
        )
        q.add_vote(voter, leader, epoch, env.ts_ms, vote)
        judgments.append((_judge_vote, (voter, leader, epoch)))
    return judgments


def ingest_voters(cs: ClusterState, env: Envelope) -> list[Deferred]:
    """A KRaftVoters control record of the metadata log (``type: KRAFT_VOTERS``,
    KIP-853): the voter set from its offset on, as a LeaderChange's ``voters``
    give it (a tool before Kafka 4.1 prints no message: ``data`` is empty)."""
    data = get_obj(env.body, "data", "body")
    voters = get_list(data, "voters", "body.data", default=None)
    if voters is not None:
        cs.quorum.voters = tuple(get_int(v, "voterId", p) for p, v in objects(voters, "body.data.voters"))
    return []


def ingest_request(cs: ClusterState, env: Envelope, header: Header) -> list[Deferred]:
    """VOTE, BEGIN_QUORUM_EPOCH, END_QUORUM_EPOCH and metadata-quorum FETCH lines."""
    node = env.node
    assert node is not None
    body = env.body
    judgments: list[Deferred] = []
    if header.api_key == VOTE:
        granted = {i: p for i, (_, p) in enumerate(quorum_partitions(body, "response"))}
        request = get_obj(body, "request", "body")
        for i, (path, part) in enumerate(quorum_partitions(body, "request")):
            candidate = get_int(part, "candidateId" if "candidateId" in part else "replicaId", path)
            epoch = get_int(part, "candidateEpoch" if "candidateEpoch" in part else "replicaEpoch", path)
            pre_vote = get_bool(
                part, "preVote", path, default=get_bool(request, "preVote", "body.request", default=False)
            )
            answer = granted.get(i, {})
            if pre_vote or not answer.get("voteGranted") or answer.get("errorCode", 0) != KafkaError.NONE:
                continue
            evidence = Evidence.of(
                "view", env, f"node {node} granted its vote to {candidate} in epoch {epoch}"
            )
            cs.quorum.add_vote(node, candidate, epoch, env.ts_ms, evidence)
            judgments.append((_judge_vote, (node, candidate, epoch)))
    elif header.api_key in (BEGIN_QUORUM_EPOCH, END_QUORUM_EPOCH):
        for path, part in quorum_partitions(body, "request"):
            leader = get_int(part, "leaderId", path)
            epoch = get_int(part, "leaderEpoch", path)
            if header.api_key == BEGIN_QUORUM_EPOCH:
                evidence = Evidence.of("view", env, f"node {leader} began epoch {epoch} as leader")
                cs.quorum.add_claim(leader, epoch, env.ts_ms, evidence, cs.moment(env)[1])
                judgments.append((_judge_claim, (leader, epoch)))
            else:
                judgments.append((_judge_step_down, (leader, epoch)))
    elif header.api_key == FETCH:
        judgments.extend(_ingest_quorum_fetch(cs, env, node))
    return judgments


def _ingest_quorum_fetch(cs: ClusterState, env: Envelope, node: int) -> list[Deferred]:
    request = get_obj(env.body, "request", "body")
    response = get_obj(env.body, "response", "body", default={})
    if get_int(response, "errorCode", "body.response", default=0) != KafkaError.NONE:
        return []
    replica = fetch_replica_id(request)
    topics = get_list(request, "topics", "body.request")
    answers = [
        p
        for _, t in objects(get_list(response, "responses", "body.response", default=[]), "r")
        for _, p in objects(get_list(t, "partitions", "r"), "p")
    ]
    judgments: list[Deferred] = []
    for tpath, topic in objects(topics, "body.request.topics"):
        for path, part in objects(get_list(topic, "partitions", tpath), f"{tpath}.partitions"):
            epoch = get_int(part, "currentLeaderEpoch", path, default=-1)
            answer = answers[0] if answers else {}
            if answer.get("errorCode", 0) != KafkaError.NONE:
                continue
            leader = answer.get("currentLeader")
            if isinstance(leader, dict) and leader.get("leaderId", node) != node:
                continue  # the node answered as a follower
            if isinstance(leader, dict) and isinstance(leader.get("leaderEpoch"), int):
                epoch = leader["leaderEpoch"]
            if epoch < 0:
                continue
            cs.quorum.add_fetch(node, epoch, replica, env.ts_ms)
            if cs.quorum.claim_is_new(node, epoch, env.ts_ms):
                evidence = Evidence.of(
                    "view", env, f"node {node} served a metadata fetch as leader of epoch {epoch}"
                )
                cs.quorum.add_claim(node, epoch, env.ts_ms, evidence, cs.moment(env)[1])
            judgments.append((_judge_claim, (node, epoch)))
    return judgments


def _judge_claim(cs: ClusterState, env: Envelope, node: int, epoch: int) -> None:
    q = cs.quorum
    claims = q.claims.get(epoch, {})
    first = min(claims.values(), key=Claim.order)
    if first.node != node:
        cs.emit(
            QuorumTwoLeadersInEpoch,
            env,
            message=f"node {node} acted as leader of epoch {epoch}, already led by node {first.node}",
            node=node,
            identity=(epoch,),
            evidence=[first.evidence],
        )
    if (node, epoch) in q.open_zombies or env.kind == "metadata":
        # A LeaderChange record starts its leader's epoch, so it is no act of a
        # leader that has lost its quorum (and its time is the log's own, which a
        # step of the log's clock moves apart from the claim it made).
        return
    grace = cs.config.grace_ms
    # Each act placed in the metadata log's clock by its node's offset
    # (detectors.clocks): the newer leader's as late, this one's as early as allowed.
    newer = []
    if cs.placed(env.node, env.ts_ms) is not None:
        earliest = cs.moment(env)[0]
        newer = [
            c
            for e, by_node in q.claims.items()
            if e > epoch
            for other in by_node
            if other != node
            for c in q.claims_of(e, other)
            if (latest := _latest(cs, c, env.node)) is not None and latest <= earliest - grace
        ]
    reason = None
    if newer:
        known = min(newer, key=Claim.order)
        reason = f"node {known.node} has led epoch {known.epoch} since {iso_utc(known.ts_ms)}"
        evidence = [known.evidence]
    else:
        reason, evidence = _fetch_timeout(cs, env, node, epoch)
    if reason:
        chain = Evidence.of("violation", env, f"node {node} still acts as leader of epoch {epoch}")
        q.open_zombies[(node, epoch)] = chain
        cs.emit(
            QuorumZombieLeader,
            env,
            message=f"node {node} still acts as leader of epoch {epoch}: {reason}",
            node=node,
            identity=(epoch,),
            evidence=evidence,
        )


def _latest(cs: ClusterState, claim: Claim, by: int | None = None) -> int | None:
    """The latest moment a claim may have been made at, placed by the clock of
    the node that logged it (a controller's clock is measured only once it
    handles requests as the active one, often after its claim): as known when
    the claim was seen or as known now, whichever is later. None if that clock
    is not measured: the claim cannot be placed. A claim the metadata log
    stamped is exact.

    ``by``: the node whose act the claim is held against. With clocks
    unmeasured every clock is taken to agree with the metadata log's within
    the grace window, so a claim another node's clock stamped may have been
    made as late as that after its stamp: the act's own grace window absorbs
    its clock and its late view, this one the other clock. Without it, a
    controller 1.5 s behind whose claim of the next epoch came 0.9 s before
    the old leader's last fetch made that fetch look 2.4 s late: a zombie."""
    if claim.latest_ms is None:
        return claim.ts_ms
    if not cs.measures_clocks:
        other = by is not None and claim.evidence.node != by
        return claim.ts_ms + cs.config.grace_ms if other else claim.ts_ms
    placed = cs.placed(claim.evidence.node, claim.ts_ms)
    return None if placed is None else max(claim.latest_ms, placed[1])


def _fetch_timeout(
    cs: ClusterState, env: Envelope, node: int, epoch: int
) -> tuple[str | None, list[Evidence]]:
    q = cs.quorum
    if not q.voters or (node, epoch) not in q.fetches:
        return None, []  # without observed fetches the timeout cannot be judged
    timeout = cs.config.quorum_fetch_timeout_ms * 3 // 2
    began = q.claims[epoch][node]
    if began.evidence.node == env.node:
        # The claim and this act are in the same node's log: its own clock times them.
        elapsed: int | None = env.ts_ms - began.ts_ms
    else:
        since = min((t for c in q.claims_of(epoch, node) if (t := _latest(cs, c)) is not None), default=None)
        placed = cs.placed(env.node, env.ts_ms) is not None
        elapsed = cs.moment(env)[0] - since if placed and since is not None else None
    if elapsed is None or elapsed < timeout:
        return None, []
    # Only voters make a majority: brokers (observers) fetch from a leader the
    # other voters have already abandoned.
    recent = (q.fetched_between(node, epoch, env.ts_ms - timeout, env.ts_ms) & set(q.voters)) - {node}
    needed = len(q.voters) // 2 + 1 - (1 if node in q.voters else 0)
    if len(recent) >= needed:
        return None, []
    return (
        f"only {sorted(recent)} of voters {list(q.voters)} fetched in the last {timeout} ms",
        [began.evidence],
    )


def _judge_step_down(cs: ClusterState, env: Envelope, node: int, epoch: int) -> None:
    """``node`` no longer leads anything before ``epoch`` (nor ``epoch`` itself
    when it names another leader)."""
    for key in sorted(k for k in cs.quorum.open_zombies if k[0] == node and k[1] <= epoch):
        fired = cs.quorum.open_zombies.pop(key)
        cs.emit(
            QuorumZombieLeader,
            env,
            message=f"node {node} stepped down as leader of epoch {key[1]}",
            node=node,
            identity=(key[1],),
            evidence=[fired],
            status="resolved",
        )


def _judge_vote(cs: ClusterState, env: Envelope, voter: int, candidate: int, epoch: int) -> None:
    votes = cs.quorum.votes.get((voter, epoch), {})
    first = min(votes.values(), key=Claim.order)
    if first.node != candidate:
        cs.emit(
            QuorumDoubleVote,
            env,
            message=f"voter {voter} granted votes to {first.node} and {candidate} in epoch {epoch}",
            node=voter,
            identity=(epoch, candidate),
            evidence=[first.evidence],
        )
