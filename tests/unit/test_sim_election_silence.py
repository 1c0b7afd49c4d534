"""An election's silence in the simulator (``Failover.silence_ms``,
``fencewatch simulate --failover-silence``): after a crashed controller the
metadata log writes nothing, not even NoOps, until the new leader is elected;
the brokers keep serving; whatever needs the controller waits; the ground
truth keeps its meaning."""

from __future__ import annotations

import argparse
from itertools import pairwise
from typing import Any

import pytest

from fencewatch import simulate as simulate_command
from producers.sim_clocks import Failover, parse_clock
from producers.sim_faults import CONTROLLER_RULES
from producers.sim_model import CONTROLLER_IDS, stamped_at
from producers.simulator import SimConfig, Simulator

START = SimConfig().start_ms
AT, SILENCE = 5000, 3000
NOOP_MS = SimConfig().noop_interval_ms


def timed(config: SimConfig, events: int) -> tuple[Simulator, list[tuple[int, dict[str, Any]]]]:
    sim = Simulator(config)
    return sim, list(sim.timed_events(events))


def silent_run(
    silence_ms: int = SILENCE, **config: Any
) -> tuple[Simulator, list[tuple[int, dict[str, Any]]]]:
    settings: dict[str, Any] = {
        "seed": 8,
        "fault_rate": 0.02,
        "warmup_ms": 2000,
        "clocks": (parse_clock("3001=-2s"),),
        "failovers": (Failover(AT, to=3001, silence_ms=silence_ms),),
    }
    settings.update(config)
    return timed(SimConfig(**settings), 24_000)


def in_window(true_ms: int, silence_ms: int = SILENCE) -> bool:
    return START + AT <= true_ms < START + AT + silence_ms


def test_the_silence_leaves_no_metadata_record() -> None:
    sim, events = silent_run()
    metadata = [t for t, env in events if env["kind"] == "metadata"]
    assert [t for t in metadata if in_window(t)] == []
    # the new leader's first record (a NoOp, if nothing else) comes when the silence ends
    first = min(t for t in metadata if t >= START + AT)
    assert START + AT + SILENCE <= first <= START + AT + SILENCE + NOOP_MS
    # the heartbeat resumes: a NoOp at least every interval after it
    after = [t for t in metadata if t >= first]
    assert max(b - a for a, b in pairwise(after)) <= NOOP_MS
    assert sim.model.raft.silences == [(START + AT, START + AT + SILENCE)]


def test_the_silence_is_not_ignored() -> None:
    """Without the silence the same run writes NoOps (at least) in the window."""
    _, events = silent_run(0)
    assert len([t for t, env in events if env["kind"] == "metadata" and in_window(t)]) >= SILENCE // NOOP_MS
    _, silent = silent_run()
    assert [t for t, env in silent if env["kind"] == "metadata" and in_window(t)] == []


def test_brokers_keep_serving_and_controller_work_waits() -> None:
    sim, events = silent_run()
    window = [env for t, env in events if in_window(t)]
    brokers = {
        env["node"] for env in window if env["kind"] == "request" and env["node"] not in CONTROLLER_IDS
    }
    assert len(brokers) >= 4  # produce, fetch... to the partitions' leaders
    assert sum(1 for env in window if env["kind"] == "request") > SILENCE  # ~2000 events a second
    # no controller line (the election comes at the end; a random election's
    # deposed leader may serve one late fetch, within the traffic's lag)
    late = [t for t, env in events if in_window(t) and env["node"] in CONTROLLER_IDS]
    assert all(t <= START + AT + sim.traffic.lag_ms for t in late)
    # the lost leader serves no late fetch after the election (a deposed leader may)
    elected = START + AT + SILENCE
    lost = next(n for t, n in reversed(sim.leader_history) if t < elected)
    assert lost != 3001
    assert not [
        t
        for t, env in events
        if elected < t <= elected + sim.traffic.lag_ms and env["kind"] == "request" and env["node"] == lost
    ]
    votes = [env for t, env in events if t == START + AT + SILENCE and env["kind"] == "quorum_state"]
    assert {env["body"]["leaderId"] for env in votes} >= {3001}
    # controller work resumes after the silence: changes other than NoOps
    changes = [
        t
        for t, env in events
        if env["kind"] == "metadata"
        and t >= START + AT + SILENCE
        and env["body"].get("type") != "NO_OP_RECORD"
    ]
    assert changes, "no metadata change after the silence"


def test_the_truth_keeps_its_meaning() -> None:
    sim, _ = silent_run()
    assert len(sim.truth) > 20
    # the election when the silence ends; the new leader's clock stamps the log from then
    elected = START + AT + SILENCE
    assert (elected, 3001) in sim.leader_history
    assert sim.metadata_clock_node(elected) == 3001
    for record in sim.truth:
        true_ms = record["true_ms"]
        writers = {record["node"], sim.metadata_clock_node(true_ms)} - {None}
        moments = {true_ms, stamped_at(true_ms, "request")}
        assert record["ts_ms"] in {sim.node_clock_ms(w, t) for w in writers for t in moments}, record
        # no controller is there to write, log or send a violation during the silence
        if in_window(true_ms):
            assert record["rule"] not in CONTROLLER_RULES, record
    assert [elected, 3001] in sim.clock_record()["raft_leaders"]


def test_quorum_faults_keep_clear_of_the_silence() -> None:
    sim, _ = silent_run(fault_rate=0.05, faults=("QUORUM_EPOCH_REGRESSION", "QUORUM_TWO_LEADERS_IN_EPOCH"))
    quorum = [r["true_ms"] for r in sim.truth]
    assert quorum
    margin = sim.faults.margin_ms
    assert all(not START + AT <= t <= START + AT + SILENCE + margin for t in quorum)


def test_a_metadata_record_in_the_silence_is_a_bug() -> None:
    sim = Simulator(SimConfig(seed=1))
    sim.model.raft.silences.append((START + 100, START + 200))
    sim.model.emit("metadata", START + 99, {"type": 0})
    with pytest.raises(RuntimeError, match="inside an election's silence"):
        sim.model.emit("metadata", START + 100, {"type": 0})
    sim.model.emit("metadata", START + 200, {"type": 0})


def test_a_silence_without_faults_raises_no_certain_alert() -> None:
    """A silent election is legitimate: no violation, no certain alert. (The
    take-over's loosening leaves requests near it possible: some thousands of
    possible alerts here, an open problem of their noise, docs/architecture.md.)"""
    import detectors.rules  # noqa: F401  (registers every rule)
    from detectors.config import DetectorConfig
    from detectors.engine import Detector
    from detectors.envelope import envelope_from_obj

    sim = Simulator(SimConfig(seed=4, fault_rate=0.0, failovers=(Failover(3000, 3002, silence_ms=2500),)))
    detector = Detector(DetectorConfig(measure_clocks=True), now_ms=lambda: 0)
    dead = []
    for i, env in enumerate(sim.events(16_000)):
        dead.extend(detector.ingest(envelope_from_obj(env, f"sim:{i}", i)))
    dead.extend(detector.flush())
    assert dead == []
    certain = [a for a in detector.drain() if a.confidence != "possible"]
    assert [(a.rule, a.node, a.ts_ms) for a in certain] == []


@pytest.mark.parametrize(
    "failovers",
    [
        (Failover(1000, silence_ms=-1),),
        (Failover(1000, silence_ms=2000), Failover(3000)),  # the next election inside the silence
    ],
)
def test_impossible_silences(failovers: tuple[Failover, ...]) -> None:
    with pytest.raises(ValueError, match=" -- "):
        SimConfig(failovers=failovers)
    SimConfig(failovers=(Failover(1000, silence_ms=2000), Failover(3001)))


# ---- the command line ----------------------------------------------------------------------------


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(prog="fencewatch")
    simulate_command.add_parser(top.add_subparsers())
    return top


def test_the_option_makes_the_config() -> None:
    args = parser().parse_args(
        [
            "simulate",
            *("--failover-at", "90s", "--failover-at", "60s", "--failover-to", "3001"),
            *("--failover-silence", "3s", "--failover-silence", "2500ms"),
        ]
    )
    config = simulate_command.config_from(args)
    # the first --failover-silence goes with the earliest --failover-at
    assert config.failovers == (Failover(60_000, 3001, 3000), Failover(90_000, None, 2500))
    plain = simulate_command.config_from(parser().parse_args(["simulate", "--failover-at", "60s"]))
    assert plain.failovers == (Failover(60_000, None, 0),)


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["--failover-at", "1s", "--failover-silence", "3"], "--failover-silence 3: '3' is not a time"),
        (["--failover-silence", "3s"], "1 --failover-silence for 0 --failover-at"),
        (
            ["--failover-at", "1s", "--failover-at", "2s", "--failover-silence", "1s"],
            "failover at 2000 ms falls in the 1000 ms silence",
        ),
    ],
)
def test_bad_silences_end_in_one_line(argv: list[str], expected: str) -> None:
    with pytest.raises(SystemExit) as ended:
        simulate_command.config_from(parser().parse_args(["simulate", *argv]))
    message = str(ended.value.code)
    assert message.startswith(f"fencewatch simulate: {expected}"), message
    assert "\n" not in message
