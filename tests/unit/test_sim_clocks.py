"""Broken clocks in the simulator (``fencewatch simulate --clock``,
``--failover-at``, ``--failover-to``): the specs, what each node's ``ts_ms``
then carries, forced controller failovers handing the metadata log to another
clock, the truth's ``true_ms`` and the ``FILE.clocks.json`` sidecar."""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from typing import Any

import orjson
import pytest

from detectors.truth import MATCH_FIELDS, match_key
from fencewatch import simulate as simulate_command
from producers.sim_clocks import (
    ClockDrift,
    ClockOffset,
    Clocks,
    ClockStep,
    Failover,
    parse_clock,
    parse_time_ms,
)
from producers.sim_model import CONTROLLER_IDS, stamped_at
from producers.simulator import SimConfig, Simulator

START = SimConfig().start_ms
VOTE, BEGIN_QUORUM_EPOCH = 52, 53


def timed(config: SimConfig, events: int) -> tuple[Simulator, list[tuple[int, dict[str, Any]]]]:
    sim = Simulator(config)
    return sim, list(sim.timed_events(events))


def api_key(env: dict[str, Any]) -> int | None:
    if env["kind"] != "request":
        return None
    return int(env["body"]["requestHeader"]["requestApiKey"])


def writer(sim: Simulator, true_ms: int, env: dict[str, Any]) -> int:
    """Whose clock stamped ``env``: the active controller's for metadata."""
    return sim.metadata_clock_node(true_ms) if env["kind"] == "metadata" else int(env["node"])


# ---- the specs --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "fault"),
    [
        ("3=+3s", ClockOffset(3, 3000)),
        ("3=-250ms", ClockOffset(3, -250)),
        ("3000=+1.5s", ClockOffset(3000, 1500)),
        (" 2 = +0s ", ClockOffset(2, 0)),
        ("3=+8s@60s", ClockStep(3, 8000, 60000)),
        ("3=-250ms@1.5s", ClockStep(3, -250, 1500)),
        ("3=+8s@0ms", ClockStep(3, 8000, 0)),
        ("3001=+5ms/s", ClockDrift(3001, 5000)),
        ("3001=-5ms/s", ClockDrift(3001, -5000)),
        ("1=+0.5ms/s", ClockDrift(1, 500)),
        ("1=+0.001s/s", ClockDrift(1, 1000)),
    ],
)
def test_each_form_parses(text: str, fault: object) -> None:
    parsed = parse_clock(text)
    assert parsed == fault
    # the canonical spec reads back as the same fault
    assert parse_clock(f"{parsed.node}={parsed.spec}") == parsed


@pytest.mark.parametrize(
    "text",
    [
        "3=3s",  # no sign
        "3=+3",  # no unit
        "3=+3h",
        "3=+0.5ms",  # not a whole millisecond
        "3=+8s@-1s",  # a time takes no sign
        "3=+8s@60",
        "3=+5ms/m",
        "3=+0.0005ms/s",  # not a whole microsecond per second
        "3=",
        "x=+3s",
        "3",
        "+3s",
    ],
)
def test_bad_specs_name_the_accepted_forms(text: str) -> None:
    with pytest.raises(ValueError) as bad:
        parse_clock(text)
    message = str(bad.value)
    assert "\n" not in message
    assert message.startswith(f"--clock {text}: ")
    assert "+OFFSET (constant), NODE=+OFFSET@TIME" in message and "+RATE/s (drift)" in message


def test_times() -> None:
    assert parse_time_ms("60s") == parse_time_ms("60000ms") == 60000
    assert parse_time_ms("1.5s") == 1500
    for bad in ("60", "+60s", "-1s", "1.0005s", "1m"):
        with pytest.raises(ValueError):
            parse_time_ms(bad)


def test_offsets_of_each_form_and_their_sum() -> None:
    clocks = Clocks(
        [parse_clock(t) for t in ("3=+2s", "3=+8s@60s", "3=-5ms/s", "4=+1ms/s", "3001=-3s")], START
    )
    assert clocks.offset_ms(3, START) == 2000
    assert clocks.offset_ms(3, START + 59_999) == 2000 - 299  # -299.995 ms of drift, toward zero
    assert clocks.offset_ms(3, START + 60_000) == 2000 + 8000 - 300
    assert clocks.offset_ms(3001, START + 123_456) == -3000
    assert clocks.offset_ms(1, START + 123_456) == 0  # no faults
    drift = [clocks.offset_ms(4, START + s * 1000) for s in range(0, 100, 10)]
    assert drift == list(range(0, 100, 10))
    assert clocks.offset_ms(4, START + 999) == 0
    assert ClockDrift(4, -1000).at(999) == 0 and ClockDrift(4, -1000).at(1000) == -1


# ---- what the nodes' clocks stamp ----------------------------------------------------------------


BROKEN = (
    parse_clock("3=+2s"),
    parse_clock("3=+8s@4s"),
    parse_clock("2=+20ms/s"),
    parse_clock("3000=-30ms/s"),
)


@pytest.fixture(scope="module")
def broken() -> tuple[Simulator, list[tuple[int, dict[str, Any]]]]:
    return timed(SimConfig(seed=5, clocks=BROKEN), 16_000)


def test_ts_is_true_time_plus_base_skew_plus_faults(broken) -> None:
    sim, events = broken
    skew = sim.model.clock_skew
    assert set(skew) >= {1, 2, 3, 4, 5, 6, *CONTROLLER_IDS}
    assert all(abs(s) <= sim.config.skew_ms for s in skew.values())
    clocks = Clocks(BROKEN, START)
    for true_ms, env in events:
        node = writer(sim, true_ms, env)
        stamped = stamped_at(true_ms, env["kind"])
        assert env["ts_ms"] == stamped + skew[node] + clocks.offset_ms(node, stamped), env
        assert env["ts_ms"] == sim.node_clock_ms(node, stamped)


def test_a_step_takes_effect_at_its_time(broken) -> None:
    sim, events = broken
    base = sim.model.clock_skew[3]
    extra = {
        (true_ms - START >= 4000, env["ts_ms"] - stamped_at(true_ms, "request") - base)
        for true_ms, env in events
        if env["node"] == 3 and env["kind"] == "request"
    }
    assert extra == {(False, 2000), (True, 10_000)}
    # the events around the step: the last before 4 s and the first after
    before = max(t for t, env in events if env["node"] == 3 and t < START + 4000)
    after = min(t for t, env in events if env["node"] == 3 and t >= START + 4000)
    assert after - before < 1000


def test_drift_grows_linearly(broken) -> None:
    sim, events = broken
    for node, ms_per_s in ((2, 20), (3000, -30)):  # 3000 stamps the metadata log too
        base = sim.model.clock_skew[node]
        drifted = [
            (stamped_at(true_ms, env["kind"]) - START, env["ts_ms"] - stamped_at(true_ms, env["kind"]) - base)
            for true_ms, env in events
            if writer(sim, true_ms, env) == node
        ]
        assert len(drifted) > 100
        for elapsed, offset in drifted:
            assert offset == int(ms_per_s * elapsed / 1000)  # whole ms, toward zero
        assert drifted[-1][0] >= 5000 and abs(drifted[-1][1]) >= abs(ms_per_s) * 5


def test_clock_faults_are_not_held_to_the_skew_limit() -> None:
    with pytest.raises(ValueError, match="quarter of grace_ms"):
        SimConfig(skew_ms=600)
    SimConfig(clocks=(ClockOffset(3, 60_000), ClockDrift(3001, -50_000)))


@pytest.mark.parametrize(
    "config",
    [
        {"clocks": (ClockOffset(7, 1000),)},  # 6 brokers
        {"clocks": (ClockStep(3003, 1000, 0),)},
        {"failovers": (Failover(1000), Failover(1000))},
        {"failovers": (Failover(-1),)},
        {"failovers": (Failover(0),)},  # the setup's records are stamped at the start
        {"failovers": (Failover(1000, 3),)},
    ],
)
def test_impossible_clock_configs(config: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match=" -- "):
        SimConfig(**config)


def raw(config: SimConfig, events: int) -> Iterator[bytes]:
    return (orjson.dumps(env) for env in Simulator(config).events(events))


def test_no_fault_no_failover_changes_nothing_else() -> None:
    """Zero offsets, and failovers after the end, draw nothing from the seed:
    the same events as without them."""
    plain = list(raw(SimConfig(seed=2), 6000))
    zero = (ClockOffset(3, 0), ClockStep(2, 0, 10))
    assert list(raw(SimConfig(seed=2, clocks=zero), 6000)) == plain
    assert list(raw(SimConfig(seed=2, failovers=(Failover(3_600_000, 3001),)), 6000)) == plain


# ---- forced failovers ----------------------------------------------------------------------------


def failover_run(to: int | None, events: int = 12_000) -> tuple[Simulator, list[tuple[int, dict[str, Any]]]]:
    config = SimConfig(seed=11, clocks=(parse_clock("3001=-3s"),), failovers=(Failover(3000, to),))
    return timed(config, events)


@pytest.mark.parametrize("to", [3001, None])
def test_a_forced_failover_elects_at_its_time(to: int | None) -> None:
    sim, events = failover_run(to)
    at = START + 3000
    history = sim.leader_history
    assert history[:2] == [(START, 3000), (at, to or history[1][1])]
    new = history[1][1]
    assert new != 3000  # the seed picks another controller
    elected = [(t, env) for t, env in events if t == at and env["kind"] in ("quorum_state", "request")]
    votes = [env for _, env in elected if api_key(env) == VOTE]
    assert {env["body"]["request"]["topics"][0]["partitions"][0]["replicaId"] for env in votes} == {new}
    assert any(api_key(env) == BEGIN_QUORUM_EPOCH for _, env in elected)
    states = [env["body"] for _, env in elected if env["kind"] == "quorum_state"]
    assert {(s["leaderId"], s["leaderEpoch"]) for s in states} >= {(new, 6)}
    # The metadata log's clock: the old leader's before, the new leader's after.
    skew = sim.model.clock_skew
    meta = [(t, env["ts_ms"]) for t, env in events if env["kind"] == "metadata"]
    assert any(t < at for t, _ in meta) and any(t >= at for t, _ in meta)
    for t, ts in meta:
        if t < at:
            assert ts == t + skew[3000]
        else:
            assert ts == t + skew[new] - (3000 if new == 3001 else 0)
            assert sim.metadata_clock_node(t) == new
    assert sim.metadata_clock_node(at - 1) == 3000


def test_failover_onto_a_skewed_controller_moves_every_offset() -> None:
    sim, _ = failover_run(3001)
    at = START + 3000
    skew = sim.model.clock_skew
    # before: measured against 3000's clock; after: against 3001's, 3 s slow
    assert sim.clock_offset_ms(1, at - 1) == skew[1] - skew[3000]
    assert sim.clock_offset_ms(1, at) == skew[1] - (skew[3001] - 3000)
    assert sim.clock_offset_ms(3001, at) == 0
    assert sim.clock_offset_ms(3000, at) == skew[3000] - skew[3001] + 3000


def test_failover_to_the_leader_reelects_it() -> None:
    sim, events = timed(SimConfig(seed=11, failovers=(Failover(2000, 3000),)), 8000)
    assert sim.leader_history[:2] == [(START, 3000), (START + 2000, 3000)]
    states = [env["body"] for t, env in events if t == START + 2000 and env["kind"] == "quorum_state"]
    assert (3000, 6) in {(s["leaderId"], s["leaderEpoch"]) for s in states}


def test_forced_failovers_raise_no_alert() -> None:
    """Without clock faults, a forced failover is a legitimate election."""
    import detectors.rules  # noqa: F401  (registers every rule)
    from detectors.config import DetectorConfig
    from detectors.engine import Detector
    from detectors.envelope import envelope_from_obj

    sim = Simulator(
        SimConfig(
            seed=4, fault_rate=0.0, failovers=(Failover(2000, 3002), Failover(4000), Failover(5000, 3000))
        )
    )
    detector = Detector(DetectorConfig(), now_ms=lambda: 0)
    dead = []
    for i, env in enumerate(sim.events(14_000)):
        dead.extend(detector.ingest(envelope_from_obj(env, f"sim:{i}", i)))
    dead.extend(detector.flush())
    assert len(sim.leader_history) >= 4
    assert dead == []
    assert [(a.rule, a.node, a.ts_ms) for a in detector.drain()] == []


# ---- the truth in true time ----------------------------------------------------------------------


def test_truth_records_carry_true_time() -> None:
    config = SimConfig(
        seed=8,
        fault_rate=0.02,
        warmup_ms=3000,
        clocks=(parse_clock("2=+3s"), parse_clock("3001=-2s@4s"), parse_clock("5=+10ms/s")),
        failovers=(Failover(5000, 3001),),
    )
    sim, _ = timed(config, 16_000)
    assert len(sim.truth) > 50
    for record in sim.truth:
        true_ms = record["true_ms"]
        # stamped by the node it names or by the metadata log (the active controller),
        # a request's line when it completed
        writers = {record["node"], sim.metadata_clock_node(true_ms)} - {None}
        moments = {true_ms, stamped_at(true_ms, "request")}
        assert record["ts_ms"] in {sim.node_clock_ms(w, t) for w in writers for t in moments}, record
    assert "true_ms" not in MATCH_FIELDS
    record = sim.truth[0]
    assert match_key(record) == match_key({k: v for k, v in record.items() if k != "true_ms"})


# ---- the command line and the sidecar ------------------------------------------------------------


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(prog="fencewatch")
    simulate_command.add_parser(top.add_subparsers())
    return top


def cli(argv: list[str]) -> int:
    args = parser().parse_args(["simulate", *argv])
    return int(args.run(args))


def test_options_make_the_config() -> None:
    args = parser().parse_args(
        [
            "simulate",
            *("--clock", "3=+2s", "--clock", "3=+8s@60s", "--clock", "3001=-5ms/s"),
            *("--failover-at", "90s", "--failover-at", "60000ms", "--failover-to", "3001"),
        ]
    )
    config = simulate_command.config_from(args)
    assert config.clocks == (ClockOffset(3, 2000), ClockStep(3, 8000, 60_000), ClockDrift(3001, -5000))
    # the first --failover-to names the winner of the earliest failover
    assert config.failovers == (Failover(60_000, 3001), Failover(90_000, None))
    assert simulate_command.config_from(parser().parse_args(["simulate"])) == SimConfig()


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["--clock", "3=3s"], "--clock 3=3s: '3s' is not a clock fault -- write NODE=+OFFSET (constant)"),
        (["--clock", "9=+3s"], "clock fault 9=+3000ms: there is no node 9 -- name one of brokers 1..6"),
        (["--failover-at", "60"], "--failover-at 60: '60' is not a time -- write a time after the start"),
        (["--failover-to", "3001"], "1 --failover-to for 0 --failover-at"),
        (["--failover-at", "1s", "--failover-to", "4"], "failover to 4: not a controller -- name one of"),
        (["--failover-at", "1s", "--failover-at", "1000ms"], "forced failovers at [1000, 1000] ms -- "),
    ],
)
def test_bad_options_end_in_one_line(argv: list[str], expected: str, tmp_path) -> None:
    with pytest.raises(SystemExit) as ended:
        cli([*argv, "--events", "10", "-o", str(tmp_path / "e.jsonl")])
    message = str(ended.value.code)  # a message: the interpreter prints it and exits 1
    assert message.startswith(f"fencewatch simulate: {expected}"), message
    assert "\n" not in message
    assert list(tmp_path.iterdir()) == []


def test_sidecar_recomputes_every_clock(tmp_path) -> None:
    out = tmp_path / "e.jsonl"
    argv = (
        f"--seed 6 --events 9000 -o {out} --clock 3=+2s --clock 3=+8s@2s --clock 2=-7ms/s "
        "--clock 3001=-3s --failover-at 3s --failover-to 3001"
    ).split()
    assert cli(argv) == 0
    sidecar = orjson.loads((tmp_path / "e.jsonl.clocks.json").read_bytes())
    assert sidecar["start_ms"] == START and sidecar["skew_ms"] == 200
    assert sidecar["raft_leaders"][:2] == [[START, 3000], [START + 3000, 3001]]
    nodes = {n["node"]: n for n in sidecar["nodes"]}
    assert set(nodes) == {1, 2, 3, 4, 5, 6, *CONTROLLER_IDS}
    assert nodes[3]["faults"] == [
        {"kind": "offset", "spec": "+2000ms", "offset_ms": 2000},
        {"kind": "step", "spec": "+8000ms@2000ms", "offset_ms": 8000, "at_ms": 2000},
    ]
    assert nodes[2]["faults"] == [{"kind": "drift", "spec": "-7ms/s", "ppm": -7000}]
    assert nodes[1]["faults"] == []

    def clock(node: int, t: int) -> int:
        """A node's clock from the sidecar alone, as --help describes it."""
        total = t + nodes[node]["base_skew_ms"]
        for f in nodes[node]["faults"]:
            elapsed = t - sidecar["start_ms"]
            if f["kind"] == "offset":
                total += f["offset_ms"]
            elif f["kind"] == "step":
                total += f["offset_ms"] if elapsed >= f["at_ms"] else 0
            else:
                gained = abs(f["ppm"]) * elapsed // 1_000_000
                total += gained if f["ppm"] >= 0 else -gained
        return total

    def leader(t: int) -> int:
        return [node for at, node in sidecar["raft_leaders"] if at <= t][-1]

    # The file's events, with their true times from the same simulation.
    args = parser().parse_args(["simulate", *argv])
    again = Simulator(simulate_command.config_from(args)).timed_events(args.events)
    lines = out.read_bytes().splitlines()
    checked = 0
    for line, (true_ms, env) in zip(lines, again, strict=True):
        assert line == orjson.dumps(env)
        node = leader(true_ms) if env["kind"] == "metadata" else env["node"]
        assert env["ts_ms"] == clock(node, stamped_at(true_ms, env["kind"]))
        checked += 1
    assert checked == len(lines) >= 9000
    truth = [orjson.loads(x) for x in (tmp_path / "e.jsonl.truth.jsonl").read_bytes().splitlines()]
    assert all("true_ms" in r for r in truth)


def test_no_sidecar_without_an_output_file(tmp_path, monkeypatch, capsysbinary) -> None:
    monkeypatch.chdir(tmp_path)
    assert cli(["--events", "200", "--clock", "3=+1s"]) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fencewatch-truth.jsonl"]
    assert capsysbinary.readouterr().out.count(b"\n") >= 200
