"""KIP-595 rules for the KRaft metadata quorum: one leader per epoch, epochs
that never go back, one vote per voter and epoch, and no zombie leaders.

The quorum is controllers 1, 2 and 3 (``VOTERS``). ``quorum_state`` events are
what a controller persisted; VOTE and BEGIN/END_QUORUM_EPOCH lines are logged
by the receiver; metadata FETCH lines by the leader serving them. No partition
state is involved, so alerts carry no topic or partition.
"""

from __future__ import annotations

from typing import Any

import pytest

from detectors.config import DetectorConfig
from producers import shapes as s
from tests.unit.test_rules_isr_alter_partition import alter_partition

VOTERS = [1, 2, 3]
OBSERVER = 100  # a broker: it fetches the metadata log but is not a voter


@pytest.fixture
def quorum(make_history):
    return make_history(standard=False)


def lead(history: Any, ts_ms: int, node: int, epoch: int) -> None:
    """``node`` persists itself as leader of ``epoch``."""
    history.quorum_state(ts_ms, node, s.quorum_state(node, epoch, node, VOTERS))


def follow(history: Any, ts_ms: int, node: int, leader: int, epoch: int) -> None:
    history.quorum_state(ts_ms, node, s.quorum_state(leader, epoch, leader, VOTERS))


def serve_fetch(history: Any, ts_ms: int, leader: int, epoch: int, replica: int) -> None:
    history.request(ts_ms, leader, s.quorum_fetch(leader, epoch, replica))


def _cited(outcome: Any) -> list[tuple[str, list[tuple[str, str]]]]:
    """Each alert's rule and what its evidence says (not where it was read)."""
    return [(a.rule, [(e.kind, e.summary) for e in a.evidence]) for a in outcome.alerts]


def keys_with_status(outcome: Any) -> list[tuple[Any, ...]]:
    return [(*key, alert.status) for key, alert in zip(outcome.keys, outcome.alerts, strict=True)]


# ---- QUORUM_TWO_LEADERS_IN_EPOCH ------------------------------------------------------------


@pytest.mark.violation("QUORUM_TWO_LEADERS_IN_EPOCH")
def test_two_nodes_persisting_leadership_of_one_epoch_is_flagged(quorum):
    lead(quorum, 1000, 1, 5)
    lead(quorum, 1500, 2, 5)
    outcome = quorum.run()
    assert outcome.keys == [("QUORUM_TWO_LEADERS_IN_EPOCH", 2, 1500, None, None)]
    assert outcome.alerts[0].severity == "critical"
    assert [e.ts_ms for e in outcome.alerts[0].evidence] == [1000, 1500]


@pytest.mark.violation("QUORUM_TWO_LEADERS_IN_EPOCH")
def test_two_nodes_beginning_the_same_epoch_is_flagged(quorum):
    quorum.request(1000, 3, s.begin_quorum_epoch(1, 5))
    quorum.request(1200, 3, s.begin_quorum_epoch(2, 5))
    assert quorum.keys() == [("QUORUM_TWO_LEADERS_IN_EPOCH", 2, 1200, None, None)]


@pytest.mark.violation("QUORUM_TWO_LEADERS_IN_EPOCH")
def test_second_node_serving_metadata_fetches_as_leader_of_the_epoch_is_flagged(quorum):
    lead(quorum, 1000, 1, 5)
    serve_fetch(quorum, 1200, 2, 5, 3)
    assert quorum.keys() == [("QUORUM_TWO_LEADERS_IN_EPOCH", 2, 1200, None, None)]


def test_followers_naming_the_leader_is_not_a_violation(quorum):
    lead(quorum, 1000, 1, 5)
    follow(quorum, 1100, 2, 1, 5)
    follow(quorum, 1100, 3, 1, 5)
    quorum.request(1100, 2, s.begin_quorum_epoch(1, 5))
    quorum.request(1100, 3, s.begin_quorum_epoch(1, 5))
    serve_fetch(quorum, 1200, 1, 5, 2)
    assert quorum.keys() == []


def test_new_leader_in_a_newer_epoch_is_not_a_violation(quorum):
    lead(quorum, 1000, 1, 5)
    lead(quorum, 3000, 2, 6)
    follow(quorum, 3100, 1, 2, 6)
    follow(quorum, 3100, 3, 2, 6)
    assert quorum.keys() == []


# ---- QUORUM_EPOCH_REGRESSION ----------------------------------------------------------------


@pytest.mark.violation("QUORUM_EPOCH_REGRESSION")
def test_node_persisting_an_older_epoch_is_flagged(quorum):
    follow(quorum, 1000, 3, 1, 5)
    follow(quorum, 2000, 3, 1, 4)
    outcome = quorum.run()
    assert outcome.keys == [("QUORUM_EPOCH_REGRESSION", 3, 2000, None, None)]
    assert outcome.alerts[0].severity == "critical"


@pytest.mark.violation("QUORUM_EPOCH_REGRESSION")
def test_a_regression_alert_cites_the_same_earlier_state_whichever_of_one_millisecond_arrives_first(quorum):
    """Node 3 persisted its vote and then the leader it learned in one
    millisecond; re-delivery brings the two in either order (found in a
    simulated history whose third was given twice, 2026-11-28)."""
    quorum.quorum_state(1000, 3, s.quorum_state(-1, 6, 2, VOTERS))
    quorum.quorum_state(1000, 3, s.quorum_state(2, 6, 2, VOTERS))
    follow(quorum, 2000, 3, 1, 5)
    first, second = quorum.run(), quorum.run([1, 0, 2])
    assert [a.rule for a in first.alerts] == ["QUORUM_EPOCH_REGRESSION"]
    assert _cited(second) == _cited(first)


def test_same_epoch_persisted_again_is_not_a_violation(quorum):
    """A voter persists its vote, then the leader it learned, in one epoch."""
    quorum.quorum_state(1000, 3, s.quorum_state(-1, 5, 1, VOTERS))
    quorum.quorum_state(1200, 3, s.quorum_state(1, 5, 1, VOTERS))
    assert quorum.keys() == []


def test_other_nodes_being_at_an_older_epoch_is_not_a_regression(quorum):
    follow(quorum, 1000, 3, 1, 5)
    follow(quorum, 2000, 2, 1, 4)
    assert quorum.keys() == []


# ---- QUORUM_DOUBLE_VOTE ---------------------------------------------------------------------


@pytest.mark.violation("QUORUM_DOUBLE_VOTE")
def test_voter_granting_two_candidates_in_one_epoch_is_flagged(quorum):
    quorum.request(1000, 3, s.vote(1, 5, True, voter=3))
    quorum.request(1200, 3, s.vote(2, 5, True, voter=3))
    outcome = quorum.run()
    assert outcome.keys == [("QUORUM_DOUBLE_VOTE", 3, 1200, None, None)]
    assert outcome.alerts[0].severity == "critical"


@pytest.mark.violation("QUORUM_DOUBLE_VOTE")
def test_voter_persisting_two_votes_in_one_epoch_is_flagged(quorum):
    quorum.quorum_state(1000, 3, s.quorum_state(-1, 5, 1, VOTERS))
    quorum.quorum_state(1200, 3, s.quorum_state(-1, 5, 2, VOTERS))
    assert quorum.keys() == [("QUORUM_DOUBLE_VOTE", 3, 1200, None, None)]


def test_pre_votes_to_two_candidates_are_not_a_violation(quorum):
    """KIP-996 pre-votes do not bind the voter."""
    quorum.request(1000, 3, s.vote(1, 5, True, pre_vote=True, voter=3))
    quorum.request(1200, 3, s.vote(2, 5, True, pre_vote=True, voter=3))
    quorum.request(1300, 3, s.vote(2, 5, True, voter=3))
    assert quorum.keys() == []


def test_votes_in_different_epochs_or_not_granted_are_not_a_violation(quorum):
    quorum.request(1000, 3, s.vote(1, 5, True, voter=3))
    quorum.request(1200, 3, s.vote(2, 5, False, voter=3))
    quorum.request(1300, 3, s.vote(2, 6, True, voter=3))
    quorum.request(1400, 3, s.vote(1, 5, True, voter=3))  # the same vote repeated
    assert quorum.keys() == []


def test_voter_naming_another_leader_than_it_voted_for_is_not_a_violation(quorum):
    quorum.quorum_state(1000, 3, s.quorum_state(-1, 5, 1, VOTERS))
    quorum.quorum_state(1200, 3, s.quorum_state(2, 5, 1, VOTERS))
    assert quorum.keys() == []


# ---- QUORUM_ZOMBIE_LEADER -------------------------------------------------------------------


@pytest.mark.violation("QUORUM_ZOMBIE_LEADER")
def test_old_leader_acting_past_grace_after_a_newer_leader_fires_then_resolves(quorum):
    """Clocks unmeasured: node 2's claim, stamped by its clock, may have been
    made up to the grace window after its stamp; node 1's act, by another
    clock, is a zombie's past the grace window after that."""
    lead(quorum, 1000, 1, 5)
    lead(quorum, 2000, 2, 6)
    serve_fetch(quorum, 6500, 1, 5, OBSERVER)  # still serving as leader of 5
    follow(quorum, 7000, 1, 2, 6)  # steps down
    outcome = quorum.run()
    assert keys_with_status(outcome) == [
        ("QUORUM_ZOMBIE_LEADER", 1, 6500, None, None, "firing"),
        ("QUORUM_ZOMBIE_LEADER", 1, 7000, None, None, "resolved"),
    ]
    firing, resolved = outcome.alerts
    assert firing.alert_id != resolved.alert_id
    assert [e.ts_ms for e in firing.evidence] == [2000, 6500]
    assert [(e.role, e.ts_ms) for e in resolved.evidence] == [("violation", 6500), ("violation", 7000)]


@pytest.mark.violation("QUORUM_ZOMBIE_LEADER")
def test_a_zombie_alert_cites_the_same_record_of_the_election_whichever_arrives_first(quorum):
    """Node 2's quorum state and the LeaderChange of its election share a
    millisecond; re-delivered records or cut files bring them in either order,
    and the alert must not change (found in a replay of one file given twice)."""
    lead(quorum, 1000, 1, 5)
    lead(quorum, 2000, 2, 6)
    quorum.metadata(2000, s.leader_change(6, 2, VOTERS, [2, 3]))
    serve_fetch(quorum, 5000, 1, 5, OBSERVER)
    order = list(range(len(quorum.envelopes)))
    order[1], order[2] = order[2], order[1]
    first, second = quorum.run(), quorum.run(order)
    assert [a.rule for a in first.alerts] == ["QUORUM_ZOMBIE_LEADER"]
    assert _cited(second) == _cited(first)
    assert first.alerts[0].evidence[0].kind == "metadata"


@pytest.mark.violation("QUORUM_DOUBLE_VOTE")
def test_a_double_vote_alert_cites_the_same_first_vote_whichever_record_of_it_arrives_first(quorum):
    """Voter 3's answer granting node 2 its vote and the quorum state it
    persisted for it share a millisecond."""
    quorum.request(2000, 3, s.vote(2, 6, True, voter=3))
    quorum.quorum_state(2000, 3, s.quorum_state(-1, 6, 2, VOTERS))
    quorum.request(3000, 3, s.vote(1, 6, True, voter=3))
    first, second = quorum.run(), quorum.run([1, 0, 2])
    assert [a.rule for a in first.alerts] == ["QUORUM_DOUBLE_VOTE"]
    assert _cited(second) == _cited(first)


@pytest.mark.violation("QUORUM_ZOMBIE_LEADER")
def test_leader_without_voter_fetches_beyond_the_fetch_timeout_fires_then_resolves(quorum):
    """1.5 x quorum.fetch.timeout.ms (2000 ms by default) = 3000 ms of silence."""
    lead(quorum, 1000, 1, 5)
    serve_fetch(quorum, 1100, 1, 5, 2)
    serve_fetch(quorum, 1100, 1, 5, 3)
    quorum.request(4000, 2, s.begin_quorum_epoch(1, 5))  # 2900 ms since the last fetch: fine
    quorum.request(5000, 2, s.begin_quorum_epoch(1, 5))  # 3900 ms: a zombie
    quorum.request(6000, 2, s.end_quorum_epoch(1, 5))
    outcome = quorum.run()
    assert keys_with_status(outcome) == [
        ("QUORUM_ZOMBIE_LEADER", 1, 5000, None, None, "firing"),
        ("QUORUM_ZOMBIE_LEADER", 1, 6000, None, None, "resolved"),
    ]
    assert "fetched in the last 3000 ms" in outcome.alerts[0].message


@pytest.mark.violation("QUORUM_ZOMBIE_LEADER")
def test_leader_fetched_only_by_observers_beyond_the_fetch_timeout_fires(quorum):
    """Brokers (observers) keep fetching from a leader cut off from the other
    voters; only voters count toward the majority (KIP-595 check-quorum)."""
    lead(quorum, 1000, 1, 5)
    serve_fetch(quorum, 1100, 1, 5, 2)
    serve_fetch(quorum, 1100, 1, 5, 3)
    for ts_ms in (2000, 3000, 4000, 5000):
        serve_fetch(quorum, ts_ms, 1, 5, OBSERVER)
    outcome = quorum.run()
    assert keys_with_status(outcome) == [("QUORUM_ZOMBIE_LEADER", 1, 5000, None, None, "firing")]


def test_fetch_timeout_follows_the_configured_quorum_fetch_timeout(make_history):
    history = make_history(DetectorConfig(quorum_fetch_timeout_ms=4000), standard=False)
    lead(history, 1000, 1, 5)
    serve_fetch(history, 1100, 1, 5, 2)
    history.request(5000, 2, s.begin_quorum_epoch(1, 5))  # 3900 ms < 6000 ms
    assert history.keys() == []


def test_old_leader_acting_within_grace_after_the_election_is_not_a_zombie(quorum):
    lead(quorum, 1000, 1, 5)
    serve_fetch(quorum, 1100, 1, 5, 2)
    lead(quorum, 2000, 2, 6)
    serve_fetch(quorum, 3500, 1, 5, 3)  # 1500 ms after the election: grace is 2000 ms
    follow(quorum, 3600, 1, 2, 6)
    assert quorum.keys() == []


def test_voters_of_a_version_0_file_are_not_used_once_files_name_none(quorum):
    """After kraft.version 1 the quorum-state file (data_version 1) names no voters
    and controllers may have been replaced: new voters 4 and 5 fetching from the
    leader must not look like a leader without its majority of the old set."""
    lead(quorum, 1000, 1, 5)
    v1 = {"leaderId": 1, "leaderEpoch": 6, "votedId": 1, "votedDirectoryId": "A" * 22, "data_version": 1}
    quorum.quorum_state(2000, 1, v1)
    for ts_ms in range(2100, 9000, 1000):
        serve_fetch(quorum, ts_ms, 1, 6, 4)
        serve_fetch(quorum, ts_ms, 1, 6, 5)
    assert quorum.keys() == []


def test_leader_whose_followers_fetch_regularly_is_not_a_zombie(quorum):
    lead(quorum, 1000, 1, 5)
    for ts_ms in range(1100, 12_000, 1000):
        serve_fetch(quorum, ts_ms, 1, 5, 2)
        serve_fetch(quorum, ts_ms, 1, 5, 3)
        serve_fetch(quorum, ts_ms, 1, 5, OBSERVER)
    quorum.request(12_000, 2, s.begin_quorum_epoch(1, 5))
    assert quorum.keys() == []


def test_leader_fetched_by_one_of_two_other_voters_has_its_majority(quorum):
    lead(quorum, 1000, 1, 5)
    for ts_ms in range(1100, 8000, 1000):
        serve_fetch(quorum, ts_ms, 1, 5, 2)
    assert quorum.keys() == []


@pytest.mark.violation("QUORUM_ZOMBIE_LEADER")
def test_a_newer_leader_stamped_by_the_metadata_log_is_known_though_first_heard_of_unplaced(make_history):
    """With clocks measured, a claim is placed by the clock of the node that
    logged it. Node 2's leadership of epoch 6 is first heard of from node 3,
    whose clock nothing measures, so that claim cannot be placed; its
    LeaderChange record, which the log stamped, places it exactly. Node 1,
    whose clock its AlterPartition answer measured, still acts as leader of
    epoch 5 three seconds later: a zombie."""
    history = make_history(DetectorConfig(measure_clocks=True))
    lead(history, 1000, 1, 5)
    history.change(1500, isr=[1, 2])
    alter_partition(
        history,
        1510,
        controller=1,
        leader_epoch=0,
        partition_epoch=0,
        new_isr=[1, 2],
        error=0,
        result_partition_epoch=1,
    )
    history.request(1900, 3, s.begin_quorum_epoch(2, 6))
    history.metadata(2000, s.leader_change(6, 2, VOTERS, [2, 3]))
    # Voter 3 still fetches from it: the fetch timeout does not tell.
    serve_fetch(history, 5000, 1, 5, 3)
    follow(history, 7000, 1, 2, 6)
    outcome = history.run()
    assert outcome.detector.cluster("c1").clocks.interval(3, 1900).measured is False
    assert keys_with_status(outcome) == [
        ("QUORUM_ZOMBIE_LEADER", 1, 5000, None, None, "firing"),
        ("QUORUM_ZOMBIE_LEADER", 1, 7000, None, None, "resolved"),
    ]
    assert [e.ts_ms for e in outcome.alerts[0].evidence] == [2000, 5000]
