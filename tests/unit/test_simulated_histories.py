"""Properties of the detector over whole simulated KRaft histories.

The simulator (``producers``) keeps its own model of the cluster and writes
down every violation it injects; the detector rebuilds the cluster from the
events alone. These tests let hypothesis pick the seeds and fault rates and
check that the two agree:

- a history without injected faults raises nothing;
- every injected fault is detected by its rule, and nothing else is raised;
- arrival order within ``lateness_ms`` (per-source delays, swapped neighbours)
  changes no alert;
- the same seed gives the same bytes and the same alert ids.

Each example simulates tens of thousands of events, so example counts are
small; ``FENCEWATCH_SIM_EXAMPLES=N`` multiplies them for a longer bug hunt.
The simulator keeps faults out of its first ``warmup_ms`` (default 10 s of
simulated time, about 20 000 events at 2000 events/s); the fault tests shorten
it to ``WARMUP_MS`` so that every example spends most of its events on faults.
"""

from __future__ import annotations

import os
import random
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import orjson
import pytest
from hypothesis import Phase, given, settings
from hypothesis import strategies as st

import detectors.rules  # noqa: F401  (registers every rule)
from detectors.alerts import Alert
from detectors.cluster import Counters
from detectors.config import DetectorConfig
from detectors.engine import Detector
from detectors.envelope import DeadLetter, Envelope, envelope_from_obj
from detectors.rules.base import RULES
from detectors.truth import confusion, match_key
from producers import shapes as s
from producers.simulator import SimConfig, Simulator

SCALE = max(1, int(os.environ.get("FENCEWATCH_SIM_EXAMPLES", "1")))
CONFIG = DetectorConfig()  # grace 2000 ms, lateness 1000 ms: what replay runs with
FAULT_RULES = sorted(Simulator(SimConfig()).faults.injectors)

Source = tuple[str, int | None]  # (kind, node): one shipper, which keeps its own order

WARMUP_MS = 3_000  # 6 000 events at the simulator's 2000 events/s; its own margin is 2.6 s

seeds = st.integers(min_value=0, max_value=2**32 - 1)


def examples(n: int) -> settings:
    # No shrinking: a seed has no structure to shrink, and each example takes
    # seconds. A failure prints its example; hypothesis's database replays it first.
    return settings(
        max_examples=n * SCALE, deadline=None, phases=(Phase.explicit, Phase.reuse, Phase.generate)
    )


# ---- running a history -----------------------------------------------------------------------


@dataclass
class Run:
    alerts: list[Alert]
    dead_letters: list[DeadLetter]
    counters: Counters

    @property
    def ids(self) -> list[str]:
        return sorted(a.alert_id for a in self.alerts)

    def confusion(self, truth: list[dict[str, object]]) -> dict[tuple[str, str], dict[str, int]]:
        return confusion([a.to_dict() for a in self.alerts], truth)


def simulate(
    seed: int, fault_rate: float, faults: tuple[str, ...] = (), warmup_ms: int = SimConfig().warmup_ms
) -> Simulator:
    """A fresh simulator; read its history with :func:`envelopes`."""
    return Simulator(SimConfig(seed=seed, fault_rate=fault_rate, faults=faults, warmup_ms=warmup_ms))


def envelopes(sim: Simulator, events: int) -> list[Envelope]:
    """The simulated history as envelopes, in the order the simulator wrote them
    (true time; ``ts_ms`` carries each node's clock skew)."""
    return [envelope_from_obj(raw, f"sim:{i}", i) for i, raw in enumerate(sim.events(events))]


def detect(arrival: Iterable[Envelope], config: DetectorConfig = CONFIG) -> Run:
    detector = Detector(config, now_ms=lambda: 0)
    dead: list[DeadLetter] = []
    for env in arrival:
        dead.extend(detector.ingest(env))
    dead.extend(detector.flush())
    return Run(detector.drain(), dead, detector.counters)


def mismatches(table: dict[tuple[str, str], dict[str, int]]) -> dict[tuple[str, str], dict[str, int]]:
    return {key: row for key, row in table.items() if row["fp"] or row["fn"]}


def assert_detected_exactly(sim: Simulator, run: Run) -> dict[tuple[str, str], dict[str, int]]:
    """Every fault ``sim`` injected was detected by its rule, nothing else was
    raised, and no event was dead-lettered; returns the confusion table."""
    assert run.dead_letters == []
    assert sim.truth, "no fault injected: the history is too short for the fault rate"
    table = run.confusion(sim.truth)
    assert mismatches(table) == {}, explain(run, sim.truth)
    assert sum(row["tp"] for row in table.values()) == len(sim.truth)
    return table


def assert_rule_alone_detected_exactly(rule: str, sim: Simulator, run: Run) -> None:
    """``sim`` injected ``rule`` only, and ``run`` raised exactly what it injected."""
    assert set(sim.injected) == {rule}, f"{rule} was never injected, or not alone"
    # Keyed by (rule, status): a timer rule's resolutions are rows of their own.
    assert {rule for rule, _ in assert_detected_exactly(sim, run)} == {rule}


def explain(run: Run, truth: list[dict[str, object]]) -> str:
    """The false alarms and the missed faults, for an assertion message."""
    injected = Counter(match_key(t) for t in truth)
    alerts = run.alerts
    raised = Counter(match_key(a.to_dict()) for a in alerts)
    false_alarms = [
        f"  fp {a.rule} node={a.node} ts_ms={a.ts_ms}: {a.message}"
        for a in alerts
        if raised[match_key(a.to_dict())] > injected[match_key(a.to_dict())]
    ]
    missed = [f"  fn {key}" for key in injected if injected[key] > raised[key]]
    return "\n".join(["", *false_alarms, *missed])


# ---- a. no fault, no alert -----------------------------------------------------------------------


@examples(3)
@given(seed=seeds, events=st.integers(20_000, 30_000))
def test_a_history_without_faults_raises_nothing(seed, events):
    sim = simulate(seed, fault_rate=0.0)
    run = detect(envelopes(sim, events))
    assert sim.truth == []
    assert run.dead_letters == []
    assert [(a.rule, a.node, a.ts_ms, a.message) for a in run.alerts] == []
    assert run.counters.late == 0


# ---- b. every injected fault is caught by its rule, nothing else is raised ----------------------


def test_every_rule_has_a_fault_injector():
    assert sorted(RULES) == FAULT_RULES


@examples(4)
@given(seed=seeds, events=st.integers(20_000, 30_000), fault_rate=st.floats(0.005, 0.02))
def test_every_injected_fault_is_detected_and_nothing_else(seed, events, fault_rate):
    sim = simulate(seed, fault_rate, warmup_ms=WARMUP_MS)
    assert_detected_exactly(sim, detect(envelopes(sim, events)))


@pytest.mark.parametrize("rule", FAULT_RULES)
@examples(1)
@given(seed=seeds)
def test_each_rule_alone_is_injected_and_detected_exactly(rule, seed):
    # 5 s of faults is plenty for most rules; each quorum fault holds off
    # elections for seconds, so those get 9 s.
    events = 24_000 if rule.startswith("QUORUM_") else 16_000
    sim = simulate(seed, fault_rate=0.01, faults=(rule,), warmup_ms=WARMUP_MS)
    assert_rule_alone_detected_exactly(rule, sim, detect(envelopes(sim, events)))


# ---- c. arrival order within lateness_ms changes nothing -----------------------------------------


def source_of(env: Envelope) -> Source:
    # Remote log metadata is read from the __remote_log_metadata topic, one
    # ordered stream per partition, whichever broker wrote each record.
    if env.kind == "remote_log_metadata":
        return (env.kind, None)
    return (env.kind, env.node)


def regression_ms(events: Sequence[Envelope]) -> dict[Source, int]:
    """Per source, how far its ``ts_ms`` ever runs behind an earlier event of
    the same source (the metadata log's CreateTime steps back after a controller
    failover to a node with a slower clock)."""
    newest: dict[Source, int] = {}
    behind: dict[Source, int] = {}
    for env in events:
        source = source_of(env)
        top = max(newest.get(source, env.ts_ms), env.ts_ms)
        newest[source] = top
        behind[source] = max(behind.get(source, 0), top - env.ts_ms)
    return behind


def delayed_arrival(events: Sequence[Envelope], rng: random.Random) -> tuple[list[Envelope], dict]:
    """Each source ships its events in its own order, a random number of
    milliseconds late, so that no event arrives more than ``lateness_ms - 1``
    behind the newest ``ts_ms`` already in. Arrival time is the source's
    newest ``ts_ms`` so far plus its delay: a source's order is never changed."""
    behind = regression_ms(events)
    delays = {
        source: rng.randrange(max(CONFIG.lateness_ms - back, 1))
        for source, back in sorted(behind.items(), key=str)
    }
    newest: dict[Source, int] = {}
    keyed = []
    for i, env in enumerate(events):
        source = source_of(env)
        newest[source] = max(newest.get(source, env.ts_ms), env.ts_ms)
        keyed.append((newest[source] + delays[source], i, env))
    keyed.sort(key=lambda k: (k[0], k[1]))
    return [env for *_, env in keyed], delays


def swapped_neighbours(
    events: Sequence[Envelope], rng: random.Random, rate: float
) -> tuple[list[Envelope], int]:
    """Swap random adjacent pairs from different sources whose ``ts_ms`` differ
    by less than ``lateness_ms`` (pairs never overlap)."""
    out = list(events)
    swaps = 0
    i = 0
    while i < len(out) - 1:
        a, b = out[i], out[i + 1]
        if (
            source_of(a) != source_of(b)
            and abs(a.ts_ms - b.ts_ms) < CONFIG.lateness_ms
            and rng.random() < rate
        ):
            out[i], out[i + 1] = b, a
            swaps += 1
            i += 2
        else:
            i += 1
    return out, swaps


def assert_same_alerts(original: Run, reordered: Run) -> None:
    assert reordered.dead_letters == original.dead_letters == []
    assert reordered.counters.late == 0
    assert reordered.ids == original.ids, sorted(
        {(a.rule, a.node, a.ts_ms) for a in original.alerts}
        ^ {(a.rule, a.node, a.ts_ms) for a in reordered.alerts}
    )


@examples(2)
@given(
    seed=seeds,
    events=st.integers(20_000, 28_000),
    fault_rate=st.sampled_from([0.0, 0.005, 0.01, 0.02]),
    shuffle_seed=seeds,
)
def test_per_source_delays_within_lateness_change_no_alert(seed, events, fault_rate, shuffle_seed):
    sim = simulate(seed, fault_rate, warmup_ms=WARMUP_MS)
    history = envelopes(sim, events)
    original = detect(history)
    arrival, delays = delayed_arrival(history, random.Random(shuffle_seed))
    assert arrival != history, f"the delays {delays} reordered nothing"
    assert_same_alerts(original, detect(arrival))


@examples(2)
@given(
    seed=seeds,
    events=st.integers(20_000, 28_000),
    fault_rate=st.sampled_from([0.0, 0.005, 0.01, 0.02]),
    shuffle_seed=seeds,
    swap_rate=st.floats(0.05, 0.5),
)
def test_swapping_neighbours_within_lateness_changes_no_alert(
    seed, events, fault_rate, shuffle_seed, swap_rate
):
    sim = simulate(seed, fault_rate, warmup_ms=WARMUP_MS)
    history = envelopes(sim, events)
    original = detect(history)
    arrival, swaps = swapped_neighbours(history, random.Random(shuffle_seed), swap_rate)
    assert swaps > 0
    assert_same_alerts(original, detect(arrival))


# ---- d. determinism ----------------------------------------------------------------------------


@examples(2)
@given(seed=seeds, events=st.integers(16_000, 24_000), fault_rate=st.floats(0.005, 0.02))
def test_the_same_seed_gives_the_same_bytes_and_alert_ids(seed, events, fault_rate):
    runs = [simulate(seed, fault_rate, warmup_ms=WARMUP_MS) for _ in range(2)]
    streams = [[orjson.dumps(raw) for raw in sim.events(events)] for sim in runs]
    assert streams[0] == streams[1]
    assert runs[0].truth == runs[1].truth
    assert runs[0].truth, "no fault injected: nothing to compare alert ids on"
    # Read back from the bytes, under different read positions: ids name the violation only.
    alert_ids = [
        [
            a.alert_id
            for a in detect(
                envelope_from_obj(orjson.loads(line), f"{name}:{i}", i) for i, line in enumerate(lines)
            ).alerts
        ]
        for name, lines in zip(("first", "second"), streams, strict=True)
    ]
    assert alert_ids[0] == alert_ids[1]
    assert len(alert_ids[0]) >= len(runs[0].truth)


# ---- a known detector bug, found by the properties above ----------------------------------------


def failover_history(restarted: int) -> list[Envelope]:
    """Broker ``restarted`` re-registers with epoch 60 at 5200 ms by the active
    controller's clock; the controller fails over to a node whose clock is
    200 ms behind (the simulator's skew is up to 200 ms per node), which writes
    an ISR expansion and logs the accepted AlterPartition at 5000 ms, naming
    the broker with its new, correct epoch. Nothing here is a violation."""
    topic_id = "qG8hUlWTTJ2eRb_bFvWRXg"
    epochs = {1: 10, 2: 11, 3: 12}
    records = [
        (1000, s.feature_level(21)),
        *((1000, s.register_broker(b, e, fenced=False)) for b, e in epochs.items()),
        (1000, s.topic("orders", topic_id)),
        (1000, s.partition(topic_id, 0, [1, 2, 3], [1, 2, 3], 1)),
        (4000, s.partition_change(topic_id, 0, isr=[1, 2])),
        (5200, s.register_broker(restarted, 60, fenced=True)),
        (5200, s.broker_change(restarted, 60, fenced=-1)),
        (5000, s.partition_change(topic_id, 0, isr=[1, 2, 3])),
    ]
    raw = [s.envelope("c1", "metadata", ts, body, offset=n) for n, (ts, body) in enumerate(records, 1)]
    epochs[restarted] = 60
    request = s.alter_partition(
        "orders",
        topic_id,
        0,
        broker_id=1,
        broker_epoch=epochs[1],
        leader_epoch=0,
        partition_epoch=1,
        new_isr=[1, 2, 3],
        isr_epochs=epochs,
        error=0,
        result_leader=1,
        result_leader_epoch=0,
        result_partition_epoch=2,
    )
    raw.append(s.envelope("c1", "request", 5000, request, node=3000))
    return [envelope_from_obj(r, f"failover:{i}", i) for i, r in enumerate(raw)]


def failover_alerts(restarted: int) -> list[tuple[str, int | None, int]]:
    run = detect(failover_history(restarted))
    assert run.dead_letters == []
    return [(a.rule, a.node, a.ts_ms) for a in run.alerts]


# Regression: the AlterPartition broker-epoch checks once looked only backwards
# and called a re-registered broker's new, correct epoch stale after a failover.
@pytest.mark.parametrize("restarted", [3, 1], ids=["admitted-replica-restarted", "sender-restarted"])
def test_a_new_registration_stamped_by_the_previous_controller_is_not_stale(restarted):
    assert failover_alerts(restarted) == []
