"""The everyday Produce and Fetch, proved to need no judgment (issue 45).

Nearly every Produce and Fetch carries its partition's current leader epoch
to its current leader and is answered as expected: 13,405 of the 13,520
judgments of a simulated history's first 20,000 events are proved here. The
full judgment of such a request (ClusterState.judge running
rules.produce.judge or rules.fetch.judge over its grace window, and again at
each clock offset where a state changes inside it, which in a cluster that
elects leaders every few seconds is most of them) raises nothing and counts
nothing, and took about half of replay's time (cProfile of 100,000 events).

:func:`nothing_to_judge` proves that cheaply when the judgment comes due (its
due time checked again first, Detector._judge_due), with the clock interval
and the view the judgment itself would read. What the request contributes
(its counts, its clock evidence, its identity for a re-delivery, its source's
progress) was taken when it was ingested, as ever. Whatever it cannot prove
goes to the rule, which stays the one place a verdict is made.

The proof. The judgment looks at the window of the whole clock interval
(ClusterState.window_of) and, where states change inside it, at the window
of each single offset o of the interval, ``[arrival - o - grace, ts - o +
grace]``. Every one of those windows holds the *core*: the moments common to
the windows of every offset the interval allows. A state in effect in the
core is therefore in every window the judgment looks at; where such a state
makes the rule's verdict "no violation" at every window holding it (the node
led it at an epoch no newer than the request's, say), nothing is raised at
any offset. Failing that, it is enough that every state of the whole window
is such a state (an interval wider than the grace windows has no core).
Nothing is counted either when every partition has a response
entry, resolves to one topic over the whole window (a name can be reused:
ClusterState.partition_window counts two topics as clock uncertain) and has
a state there.

tests/unit/test_fast_path.py holds the detector with and without this to the
same alerts, counts and state on simulated histories.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import partial

from detectors.cluster import ClusterState, handling_ms
from detectors.envelope import Envelope
from detectors.errors import KafkaError
from detectors.requests import PartitionOutcome
from detectors.rules import fetch, produce
from detectors.view import NULL_TOPIC_ID, PartitionState

_NONE = KafkaError.NONE
_FENCED = KafkaError.FENCED_LEADER_EPOCH
_UNKNOWN_EPOCH = KafkaError.UNKNOWN_LEADER_EPOCH

# The whole window a judgment looks at, and its core.
_Windows = tuple[tuple[int, int], tuple[int, int]]


def nothing_to_judge(cs: ClusterState, judgment: partial[None]) -> bool:
    """Whether ``judgment`` (a queued rules.produce.judge or rules.fetch.judge,
    due now) would raise no alert and count nothing at any clock offset. False
    whenever that is not proved."""
    func = judgment.func
    if func is produce.judge:
        _, env, _, _, outcomes = judgment.args
        return _all_proved(cs, env, outcomes, _produce_clean)
    if func is fetch.judge:
        _, env, _, outcomes = judgment.args
        # rules.fetch looks only at reads answered NONE at a stated epoch (and counts missing answers).
        return _all_proved(cs, env, fetch.judged(outcomes), _fetch_clean)
    return False


def _produce_clean(node: int | None, outcome: PartitionOutcome) -> Callable[[PartitionState], bool] | None:
    """What makes a state one over which rules.produce raises nothing for
    ``outcome``, whatever other states a window holds with it: NONE from its
    leader at an epoch it is not newer than (or none stated); FENCED_LEADER_EPOCH
    for an epoch older than its; UNKNOWN_LEADER_EPOCH for one newer. None: no
    state is needed (any other error, or no epoch stated with an error)."""
    epoch, error = outcome.epoch, outcome.error
    if error == _NONE:
        return lambda s: s.leader == node and (epoch < 0 or s.leader_epoch <= epoch)
    if epoch < 0:
        return None
    if error == _FENCED:
        return lambda s: s.leader_epoch > epoch
    if error == _UNKNOWN_EPOCH:
        return lambda s: s.leader_epoch < epoch
    return None


def _fetch_clean(node: int | None, outcome: PartitionOutcome) -> Callable[[PartitionState], bool] | None:
    """What makes a state one over which rules.fetch raises nothing for
    ``outcome`` (a read answered NONE at a stated epoch): that epoch is not older."""
    epoch = outcome.epoch
    return lambda s: s.leader_epoch <= epoch


def _all_proved(
    cs: ClusterState,
    env: Envelope,
    outcomes: Sequence[PartitionOutcome],
    clean: Callable[[int | None, PartitionOutcome], Callable[[PartitionState], bool] | None],
) -> bool:
    """Every outcome has a response entry and its partition a state over the
    whole window, and either a state of the core is clean (it is in every
    window the rule looks at, and makes each raise nothing) or every state of
    the whole window is (each window the rule looks at holds only such)."""
    windows = _windows(cs, env)
    if windows is None:
        return False
    node = env.node
    for outcome in outcomes:
        if outcome.error is None:
            return False  # no response entry: counted by the rule
        found = _states(cs, outcome, windows)
        if found is None:
            return False
        whole, core = found
        check = clean(node, outcome)
        if check is not None and not any(map(check, core)) and not all(map(check, whole)):
            return False
    return True


def _windows(cs: ClusterState, env: Envelope) -> _Windows | None:
    """The window ClusterState.judge looks at over the whole clock interval,
    and its core (see the module's docstring); None if the interval is too
    uncertain to place the request (the rule counts it)."""
    window = cs.window_of(env)
    if window is None:
        return None
    # Over an interval [low, high] the window is [arrival - ceil(high) - grace,
    # ts - floor(low) + grace] (ClusterState.window_of), and every offset o
    # that judge tries lies in [floor(low), ceil(high)], its window [arrival - o
    # - grace, ts - o + grace]. So the core starts where the window ends less
    # the request's handling and twice the grace, and ends where the window
    # starts plus them. Where judge looks at one window only (no interval, or
    # none wider than a point) the core is cut to that window.
    lo, hi = window
    span = handling_ms(env) + 2 * cs.config.grace_ms
    return window, (max(lo, hi - span), min(hi, lo + span))


def _states(
    cs: ClusterState, outcome: PartitionOutcome, windows: _Windows
) -> tuple[list[PartitionState], list[PartitionState]] | None:
    """The partition's states over the whole window and over its core, where it
    resolves to one topic over the whole window and has a state there, as
    ClusterState.partition_window finds them (without counting anything); else None."""
    window, core = windows
    view = cs.view
    topic_id = outcome.topic_id
    if topic_id and topic_id != NULL_TOPIC_ID:
        key = topic_id if topic_id in view.topics else None
    else:
        name = outcome.topic
        named = view.topic_ids_by_name.get(name) if name is not None else None
        if named is None:
            # A name without topic records' history resolves the same at every moment.
            key = view.resolve_topic(name, None)
        else:
            # partition_window resolves a name at its window's ends less the grace,
            # the latest unless it named nothing then (a topic deleted inside);
            # a window of one offset resolves it to that topic or to none.
            grace = cs.config.grace_ms
            first, last = window[0] + grace, window[1] - grace
            key = named.at(last) or named.at(first)
            if any(other not in (key, None) for other in named.window(first, last)):
                return None
    history = view.partition((key, outcome.partition)) if key else None
    whole = history.window(*window) if history is not None else None
    if not whole:
        return None
    assert history is not None
    return whole, history.window(*core) if core[0] <= core[1] else []
