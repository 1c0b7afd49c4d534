"""``fencewatch convert quorum-state`` (SPEC section 4), fencewatch/convert.py, and
``fencewatch replay`` of what it writes: the envelopes are what the quorum rules read."""

from __future__ import annotations

import io
import os
import shutil
import sys
from pathlib import Path

import orjson
import pytest

from detectors.envelope import Envelope, parse_envelope
from fencewatch import cli

NATIVE = Path(__file__).resolve().parents[1] / "data" / "native"
V0 = NATIVE / "quorum-state-v0.json"  # controller 1: leader of epoch 7
V1 = NATIVE / "quorum-state-v1.json"  # a controller that voted for 1 in epoch 7
MTIME_MS = 1795168800123
TS = 1795168900000


@pytest.fixture
def main(monkeypatch):
    """``cli.main`` with only the commands these tests use registered."""
    monkeypatch.setattr(cli, "COMMANDS", {k: cli.COMMANDS[k] for k in ("convert", "replay")})
    return cli.main


def envelopes(stdout: str) -> list[Envelope]:
    items = [parse_envelope(line, f"stdout:{n}") for n, line in enumerate(stdout.splitlines(), 1)]
    assert all(isinstance(i, Envelope) for i in items), items
    return items  # type: ignore[return-value]


def copy_with_mtime(src: Path, dst: Path, mtime_ms: int) -> Path:
    shutil.copyfile(src, dst)
    os.utime(dst, ns=(mtime_ms * 1_000_000, mtime_ms * 1_000_000))
    return dst


def test_both_versions_convert_with_the_file_time(main, capsys, tmp_path):
    v0 = copy_with_mtime(V0, tmp_path / "quorum-state", MTIME_MS)
    v1 = copy_with_mtime(V1, tmp_path / "quorum-state-1", MTIME_MS + 5)

    code = main(["convert", "quorum-state", "--node", "2", "--cluster", "prod-eu-1", str(v0), str(v1)])
    out, err = capsys.readouterr()

    assert code == 0
    items = envelopes(out)
    assert [(i.cluster, i.node, i.kind, i.offset, i.ts_ms) for i in items] == [
        ("prod-eu-1", 2, "quorum_state", None, MTIME_MS),
        ("prod-eu-1", 2, "quorum_state", None, MTIME_MS + 5),
    ]
    assert [i.body for i in items] == [orjson.loads(V0.read_bytes()), orjson.loads(V1.read_bytes())]
    assert err.splitlines() == [
        "fencewatch convert quorum-state: 2 file(s): 2 records (data_version 0: 1, data_version 1: 1), "
        "0 dead letters"
    ]


def test_ts_ms_overrides_the_file_time_and_reads_stdin(main, capsys, monkeypatch):
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(V1.read_bytes())))
    assert main(["convert", "quorum-state", "--node", "3", "--ts-ms", str(TS), "-"]) == 0
    (item,) = envelopes(capsys.readouterr().out)
    assert (item.node, item.ts_ms) == (3, TS)


def test_a_bad_file_is_a_dead_letter_and_counted(main, capsys, tmp_path):
    bad = tmp_path / "quorum-state"
    bad.write_text('{"leaderId":1,"leaderEpoch":7,"votedId":-1,"data_version":9}')
    dead = tmp_path / "dead.jsonl"

    code = main(["convert", "quorum-state", "--node", "1", "--dead-letter", str(dead), str(bad), str(V0)])
    out, err = capsys.readouterr()

    assert code == 0
    assert len(envelopes(out)) == 1
    (letter,) = [orjson.loads(line) for line in dead.read_text().splitlines()]
    assert letter["position"] == f"{bad}:1"
    assert letter["reason"].startswith("data_version 9 is not one fencewatch reads")
    assert "2 file(s): 1 records (data_version 0: 1), 1 dead letters" in err


@pytest.mark.parametrize(
    ("argv", "problem"),
    [
        (["quorum-state", str(V0)], "quorum-state needs --node N"),
        (["quorum-state", "--node", "1", "-"], "quorum-state from stdin needs --ts-ms"),
        (["quorum-state", "--node", "1", "--ts-ms", "-1", str(V0)], "--ts-ms must be epoch milliseconds"),
        (["metadata-dump", "--ts-ms", "5", str(V0)], "--ts-ms applies to quorum-state only"),
    ],
)
def test_usage_errors(main, capsys, argv, problem):
    assert main(["convert", *argv]) == 2
    out, err = capsys.readouterr()
    assert out == "" and problem in err


# ---- converted samples replayed through the rules -----------------------------------------


def convert(main, capsys, path: Path, node: int, ts_ms: int) -> str:
    assert main(["convert", "quorum-state", "--node", str(node), "--ts-ms", str(ts_ms), str(path)]) == 0
    return capsys.readouterr().out


def replay(main, capsys, tmp_path: Path, *converted: str) -> tuple[list[dict], str]:
    """The alerts and the summary of replaying the converted files."""
    files = []
    for n, text in enumerate(converted):
        files.append(tmp_path / f"events-{n}.jsonl")
        files[-1].write_text(text)
    assert main(["replay", "--no-progress", *map(str, files)]) == 0
    out, err = capsys.readouterr()
    return [orjson.loads(line) for line in out.splitlines()], " ".join(err.split())


def test_leader_and_its_voter_raise_nothing(main, capsys, tmp_path):
    leader = convert(main, capsys, V0, node=1, ts_ms=TS)
    voter = convert(main, capsys, V1, node=2, ts_ms=TS + 100)
    # Node 1's file again, as a restarted shipper would send it: the same fact.
    again = convert(main, capsys, V0, node=1, ts_ms=TS + 60_000)
    alerts, summary = replay(main, capsys, tmp_path, leader, voter, again)
    assert alerts == []
    assert "quorum_state 2" in summary and "dead letters 0 duplicates 1" in summary


def test_two_controllers_claiming_the_same_epoch_are_flagged(main, capsys, tmp_path):
    # Controller 2's version-1 file names itself leader of epoch 7, which controller 1 leads.
    rival = tmp_path / "quorum-state"
    body = orjson.loads(V1.read_bytes()) | {"leaderId": 2, "votedId": -1, "votedDirectoryId": "A" * 22}
    rival.write_bytes(orjson.dumps(body))
    leader = convert(main, capsys, V0, node=1, ts_ms=TS)
    second = convert(main, capsys, rival, node=2, ts_ms=TS + 100)

    alerts, _ = replay(main, capsys, tmp_path, leader, second)

    assert [(a["rule"], a["node"], a["ts_ms"]) for a in alerts] == [
        ("QUORUM_TWO_LEADERS_IN_EPOCH", 2, TS + 100)
    ]
    assert "already led by node 1" in alerts[0]["message"]
