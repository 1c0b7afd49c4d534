"""``fencewatch replay`` (SPEC section 4), fencewatch/replay.py: inputs that are
not envelope JSONL, dead letters beyond a handful, and the accounting of every
line read."""

from __future__ import annotations

import io
import shutil
import subprocess
import sys
from pathlib import Path

import orjson
import pytest

from fencewatch import cli

DATA = Path(__file__).resolve().parents[1] / "data"
REQUEST_LOG = str(DATA / "request.log")
METADATA_DUMP = str(DATA / "metadata.dump")
QUORUM_STATE = str(DATA / "native" / "quorum-state-v0.json")


@pytest.fixture
def main(monkeypatch):
    """``cli.main`` with only the commands these tests use registered."""
    monkeypatch.setattr(cli, "COMMANDS", {k: cli.COMMANDS[k] for k in ("convert", "replay")})
    return cli.main


@pytest.fixture
def envelopes(main, capsys) -> list[bytes]:
    """tests/data/request.log and metadata.dump converted: 17 envelope lines."""
    lines = []
    for argv in (["request-log", "--node", "1", REQUEST_LOG], ["metadata-dump", METADATA_DUMP]):
        assert main(["convert", *argv, "--cluster", "prod"]) == 0
        lines += capsys.readouterr().out.encode().splitlines(keepends=True)
    return lines


@pytest.mark.parametrize(
    ("path", "message"),
    [
        (
            REQUEST_LOG,
            f"{REQUEST_LOG} looks like a Kafka request log, not envelope JSONL: convert it first with "
            f"`fencewatch convert request-log --cluster C --node N {REQUEST_LOG} > request.jsonl`, "
            "then replay request.jsonl",
        ),
        (
            METADATA_DUMP,
            f"{METADATA_DUMP} looks like kafka-dump-log.sh output, not envelope JSONL: convert it first with "
            f"`fencewatch convert metadata-dump --cluster C {METADATA_DUMP} > metadata.jsonl`, "
            "then replay metadata.jsonl",
        ),
        (
            QUORUM_STATE,
            f"{QUORUM_STATE} looks like a controller's quorum-state file, not envelope JSONL: convert it "
            f"first with `fencewatch convert quorum-state --cluster C --node N {QUORUM_STATE} "
            "> quorum-state-v0.jsonl`, then replay quorum-state-v0.jsonl",
        ),
    ],
    ids=["request-log", "metadata-dump", "quorum-state"],
)
def test_a_native_log_is_refused_with_the_convert_to_run(main, capsys, path, message):
    assert main(["replay", "--no-progress", path]) == 1
    out, err = capsys.readouterr()
    assert out == ""
    assert err == f"fencewatch replay: {message}\n"


def test_a_binary_file_is_one_line_not_a_flood_of_dead_letters(main, capsys, tmp_path):
    binary = tmp_path / "ls"
    shutil.copyfile(sys.executable, binary)  # a real executable, as /bin/ls in the issue
    assert main(["replay", "--no-progress", str(binary)]) == 1
    out, err = capsys.readouterr()
    assert out == ""
    assert err.count("\n") == 1 and len(err) < 400
    assert err.startswith(f"fencewatch replay: {binary} looks like a binary file, not envelope JSONL: ")


def test_a_native_log_on_stdin_is_refused_too(main, capsys, monkeypatch):
    data = Path(REQUEST_LOG).read_bytes()
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(data)))
    assert main(["replay", "--no-progress", "-"]) == 1
    assert capsys.readouterr().err.startswith(
        "fencewatch replay: stdin looks like a Kafka request log, not envelope JSONL: convert it first with "
        "`fencewatch convert request-log --cluster C --node N - > stdin.jsonl`"
    )


def test_every_line_read_is_accounted_for(main, capsys, tmp_path, envelopes):
    first, second = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    first.write_bytes(b"".join(envelopes) + b"\n\n")
    # Overlapping pieces: the last three envelopes again, and a line that is no envelope.
    second.write_bytes(b"".join(envelopes[-3:]) + b"not json\n")
    assert main(["replay", "--no-progress", str(first), str(second)]) == 0
    err = capsys.readouterr().err
    # 18 + 2 blank + 3 + 1 = 24 lines: 18 processed, 3 duplicates, 1 dead letter, 2 blank.
    assert (
        "fencewatch replay: 2 file(s), 24 lines: 18 envelopes processed, 3 duplicates, 0 too late to judge, "
        "1 dead letters, 2 blank lines"
    ) in err.splitlines()


def test_an_envelope_past_its_grace_window_is_counted_as_too_late(main, capsys, tmp_path, envelopes):
    produce = orjson.loads(envelopes[0])
    later = {**produce, "ts_ms": produce["ts_ms"] + 3_600_000}
    # The same request an hour earlier than the newest record, but not a copy of the first.
    stale = {**produce, "body": {**produce["body"], "totalTimeMs": 1.0}}
    lines = [orjson.dumps(x) + b"\n" for x in (produce, later, stale)]
    path = tmp_path / "late.jsonl"
    path.write_bytes(b"".join(lines))
    assert main(["replay", "--no-progress", str(path)]) == 0
    assert (
        "fencewatch replay: 1 file(s), 3 lines: 2 envelopes processed, 0 duplicates, 1 too late to judge, "
        "0 dead letters, 0 blank lines"
    ) in capsys.readouterr().err.splitlines()


def test_text_that_gives_no_envelope_exits_1_and_keeps_its_dead_letters_off_the_terminal(
    main, capsys, tmp_path, monkeypatch
):
    monkeypatch.chdir(tmp_path)
    notes = tmp_path / "notes.txt"
    notes.write_text("".join(f"line {n}\n" for n in range(19)))
    assert main(["replay", "--no-progress", str(notes)]) == 1
    err = capsys.readouterr().err.splitlines()
    shown = [orjson.loads(line) for line in err if line.startswith("{")]
    assert [d["position"] for d in shown] == [f"{notes}:{n}" for n in range(1, 6)]
    stored = (tmp_path / "fencewatch-dead-letters.jsonl").read_text().splitlines()
    letters = [orjson.loads(line) for line in stored]
    assert [d["position"] for d in letters] == [f"{notes}:{n}" for n in range(1, 20)]
    assert all(d["reason"] for d in letters)
    assert (
        "fencewatch replay: 19 dead letters: the first 5 above, all 19 in fencewatch-dead-letters.jsonl "
        "(name the file with --dead-letter FILE)"
    ) in err
    assert (
        f"fencewatch replay: no envelope in {notes}: all 19 non-blank lines are dead letters -- their "
        "reasons say what is wrong; `fencewatch convert --help` lists the native formats it converts to "
        "envelopes"
    ) in err


def test_with_a_dead_letter_file_none_go_to_stderr(main, capsys, tmp_path, envelopes):
    path, dead = tmp_path / "in.jsonl", tmp_path / "dead.jsonl"
    path.write_bytes(b"".join(envelopes) + b"oops\n" * 8)
    assert main(["replay", "--no-progress", "--dead-letter", str(dead), str(path)]) == 0
    err = capsys.readouterr().err
    assert not any(line.startswith("{") for line in err.splitlines())
    assert f"fencewatch replay: 8 dead letters written to {dead}" in err.splitlines()
    assert [orjson.loads(line)["position"] for line in dead.read_text().splitlines()] == [
        f"{path}:{n}" for n in range(19, 27)
    ]


def test_a_log4j_log_is_refused_with_the_request_log_convert(main, capsys, tmp_path):
    server_log = tmp_path / "server.log"
    server_log.write_text(
        "[2026-11-20 10:15:01,002] INFO [BrokerServer id=1] started (kafka.server.BrokerServer)\n"
    )
    assert main(["replay", "--no-progress", str(server_log)]) == 1
    assert capsys.readouterr().err == (
        f"fencewatch replay: {server_log} looks like a Kafka log4j log without request-logger entries, not "
        f"envelope JSONL: convert it first with `fencewatch convert request-log --cluster C --node N "
        f"{server_log} > server.jsonl`, then replay server.jsonl\n"
    )


def test_replay_loads_neither_spark_nor_the_kafka_clients(tmp_path: Path):
    # Only the named command's module is imported: replay started in about a
    # second when every command's module (Spark's, the Kafka clients') was.
    history = tmp_path / "one.jsonl"
    history.write_bytes(
        orjson.dumps({"cluster": "c", "node": 1, "ts_ms": 5, "kind": "request", "body": {}}) + b"\n"
    )
    script = (
        "import sys\n"
        "from fencewatch.cli import main\n"
        f"assert main(['replay', '--no-progress', {str(history)!r}]) == 0\n"
        "print(sorted(m for m in ('pyspark', 'confluent_kafka', 'kafka', 'pyarrow') if m in sys.modules))\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    assert done.stdout.splitlines()[-1] == "[]"
