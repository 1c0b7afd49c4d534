"""The nemesis' schedule (localkafka.nemesis.plan): repeatable by seed, bounded
by the duration, every fault kind once when it fits, the skewed clock last.
The faults themselves run against a real cluster in
tests/integration/test_real_kafka.py."""

from __future__ import annotations

from localkafka.nemesis import FAULTS, SKEW_CLOCK, UNCLEAN_ELECTION, WIPE_BROKER, plan

BROKERS = [1, 2, 3]


def test_the_same_seed_gives_the_same_schedule_and_another_seed_another() -> None:
    assert plan(5, 600, BROKERS) == plan(5, 600, BROKERS)
    assert plan(5, 600, BROKERS) != plan(6, 600, BROKERS)


def test_a_long_run_has_every_kind_and_the_skew_last() -> None:
    for seed in range(20):
        faults = plan(seed, 600, BROKERS)
        assert {f.kind for f in faults} == set(FAULTS), seed
        assert faults[-1].kind == SKEW_CLOCK and faults[-1].broker in BROKERS
        assert [f.kind for f in faults].count(SKEW_CLOCK) == 1
        # The slow, one-off faults are not repeated.
        assert [f.kind for f in faults].count(UNCLEAN_ELECTION) == 1
        assert [f.kind for f in faults].count(WIPE_BROKER) == 1


def test_a_short_run_leaves_out_what_does_not_fit() -> None:
    faults = plan(1, 150, BROKERS)
    assert 0 < len(faults) < len(FAULTS)
    assert plan(1, 5, BROKERS) == []


def test_without_repeats_each_kind_once() -> None:
    faults = plan(4, 3600, BROKERS, repeat=False)
    assert sorted(f.kind for f in faults) == sorted(FAULTS)


def test_only_the_kinds_asked_for() -> None:
    faults = plan(3, 600, BROKERS, ("kill-broker", "preferred-election"))
    assert {f.kind for f in faults} == {"kill-broker", "preferred-election"}
    assert all(f.broker in BROKERS for f in faults if f.kind == "kill-broker")
