"""``fencewatch convert`` (SPEC section 4), fencewatch/convert.py."""

from __future__ import annotations

import importlib.util
import io
import re
import subprocess
import sys
from pathlib import Path

import orjson
import pytest

from detectors.envelope import Envelope, parse_envelope
from fencewatch import cli

DATA = Path(__file__).resolve().parents[1] / "data"
REQUEST_LOG = str(DATA / "request.log")
METADATA_DUMP = str(DATA / "metadata.dump")
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def main(monkeypatch):
    """``cli.main`` with only ``convert`` registered: these tests are about convert,
    so another command's import problem must not mask them (the subprocess test
    below runs the full command line)."""
    monkeypatch.setattr(cli, "COMMANDS", {"convert": cli.COMMANDS["convert"]})
    return cli.main


def envelopes(stdout: str) -> list[Envelope]:
    lines = stdout.splitlines()
    items = [parse_envelope(line, f"stdout:{n}") for n, line in enumerate(lines, 1)]
    assert all(isinstance(i, Envelope) for i in items), items
    return items  # type: ignore[return-value]


def test_request_log_to_envelope_jsonl(main, capsys):
    code = main(["convert", "request-log", "--node", "1", "--cluster", "prod-eu-1", REQUEST_LOG])
    out, err = capsys.readouterr()

    assert code == 0
    items = envelopes(out)
    names = [i.body["requestHeader"]["requestApiKeyName"] for i in items]
    assert names == ["PRODUCE", "STOP_REPLICA", "ALTER_PARTITION", "FETCH"]
    assert {(i.cluster, i.node, i.kind, i.offset) for i in items} == {("prod-eu-1", 1, "request", None)}
    assert items[0].ts_ms == 1795169702345
    # Key-sorted compact JSON, as detectors.envelope.dumps writes it.
    first = out.splitlines()[0]
    assert first.startswith('{"body":') and first.endswith(',"ts_ms":1795169702345}')
    # Every one of the 19 lines is accounted for: 4 + 0 + 10 + 5 + 0 + 0.
    assert err.strip() == (
        "fencewatch convert request-log: 1 file(s), 19 lines: 4 records "
        "(ALTER_PARTITION=1, FETCH=1, PRODUCE=1, STOP_REPLICA=1), 0 dead letters, "
        "10 continuation lines of multi-line entries; skipped: 5 other-logger lines, 0 blank lines, "
        "0 lines before any log4j entry"
    )


def test_metadata_dump_to_envelope_jsonl(main, capsys):
    code = main(["convert", "metadata-dump", METADATA_DUMP])
    out, err = capsys.readouterr()

    assert code == 0
    items = envelopes(out)
    # The snapshot's voter set first (a snapshot's records have no log offset), then the log's records.
    assert [i.offset for i in items] == [None, *range(13)]
    assert items[0].body["type"] == "KRAFT_VOTERS"
    assert {(i.cluster, i.node, i.kind) for i in items} == {("default", None, "metadata")}
    # 14 + 0 + 3 + 17 + 0 + 0 = 34 lines.
    assert err.strip() == (
        "fencewatch convert metadata-dump: 1 file(s), 34 lines: 14 records, 0 dead letters; skipped: "
        "3 control records (KRAFT_VERSION=1, SNAPSHOT_FOOTER=1, SNAPSHOT_HEADER=1), "
        "17 header and batch lines, 0 blank lines, 0 unrecognised lines"
    )
    assert "LEADER_CHANGE" not in err


def test_several_files_keep_input_order(main, capsys, tmp_path):
    second = tmp_path / "second.log"
    second.write_text('[2026-11-20 09:00:00,000] DEBUG Completed request:{"n":2} (kafka.request.logger)\n')
    assert main(["convert", "request-log", "--node", "1", str(second), REQUEST_LOG]) == 0
    items = envelopes(capsys.readouterr().out)
    assert items[0].body == {"n": 2}
    assert len(items) == 5


def test_dead_letters_go_to_the_dead_letter_file(main, capsys, tmp_path):
    log = tmp_path / "broken.log"
    log.write_bytes(
        b'[2026-11-20 10:00:00,000] DEBUG Completed request:{"a":1,,} (kafka.request.logger)\n'
        b'[2026-11-20 10:00:01,000] DEBUG Completed request:{"a":2} (kafka.request.logger)\n'
        b'[2026-11-20 10:00:02,000] DEBUG Completed request:{"a":"\xff"} (kafka.request.logger)\n'
    )
    dead = tmp_path / "dead.jsonl"
    code = main(["convert", "request-log", "--node", "1", "--dead-letter", str(dead), str(log)])
    out, err = capsys.readouterr()

    assert code == 0  # dead letters are reported, not fatal
    assert [i.body for i in envelopes(out)] == [{"a": 2}]
    letters = [orjson.loads(line) for line in dead.read_text().splitlines()]
    assert [d["position"] for d in letters] == [f"{log}:1", f"{log}:3"]
    assert "malformed request JSON" in letters[0]["reason"]
    assert "not UTF-8" in letters[1]["reason"]
    assert letters[0]["raw"].endswith('{"a":1,,} (kafka.request.logger)')
    assert "1 records (no API=1), 2 dead letters" in err
    assert '"position"' not in err  # they went to the file, not stderr


def test_dead_letters_go_to_stderr_by_default(main, capsys, tmp_path):
    dump = tmp_path / "bad.dump"
    dump.write_text("| offset: 1 CreateTime: 1795168800000 keySize: -1 payload: {oops\n")
    assert main(["convert", "metadata-dump", str(dump)]) == 1  # no line of the input was usable
    out, err = capsys.readouterr()
    assert out == ""
    letter = orjson.loads(err.splitlines()[0])
    assert letter["position"] == f"{dump}:1" and "malformed payload JSON" in letter["reason"]
    assert err.splitlines()[-1] == (
        f"fencewatch convert: no record in {dump}: 1 non-blank lines, 1 dead letters -- the dead letters' "
        "reasons say what is wrong with its records"
    )


def test_stdin_is_read_as_bytes(main, capsys, monkeypatch):
    data = (DATA / "request.log").read_bytes()
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(data)))
    assert main(["convert", "request-log", "--node", "7", "-"]) == 0
    items = envelopes(capsys.readouterr().out)
    assert len(items) == 4 and items[0].node == 7


def test_tz_shifts_request_log_timestamps(main, capsys):
    assert main(["convert", "request-log", "--node", "1", "--tz", "Europe/Berlin", REQUEST_LOG]) == 0
    assert envelopes(capsys.readouterr().out)[0].ts_ms == 1795169702345 - 3_600_000


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["request-log", REQUEST_LOG], "request-log needs --node N"),
        (["request-log", "--node", "-1", REQUEST_LOG], "--node must be a node id"),
        (["request-log", "--node", "1", "--tz", "Mars/Olympus", REQUEST_LOG], "time zone"),
        (["request-log", "--node", "1", "--tz", "Europe", REQUEST_LOG], "time zone"),
        (["metadata-dump", "--tz", "UTC", METADATA_DUMP], "--tz applies to request-log only"),
        (["metadata-dump", "--cluster", "", METADATA_DUMP], "--cluster must be"),
    ],
)
def test_usage_errors_exit_2_with_a_message(main, capsys, argv, message):
    assert main(["convert", *argv]) == 2
    out, err = capsys.readouterr()
    assert out == "" and message in err


def test_argparse_usage_errors_exit_2(main, capsys):
    with pytest.raises(SystemExit) as exc:
        main(["convert", "syslog", REQUEST_LOG])
    assert exc.value.code == 2
    assert "invalid choice" in capsys.readouterr().err


def test_a_record_over_the_limit_is_a_too_large_dead_letter(main, capsys, tmp_path):
    log = tmp_path / "big.log"
    big = (
        '[2026-11-20 10:00:00,000] DEBUG Completed request:{"pad":"'
        + "p" * 5000
        + '"} (kafka.request.logger)'
    )
    log.write_text(
        big + "\n" + '[2026-11-20 10:00:01,000] DEBUG Completed request:{"a":2} (kafka.request.logger)\n'
    )
    code = main(["convert", "request-log", "--node", "1", "--max-record-bytes", "1000", str(log)])
    out, err = capsys.readouterr()

    assert code == 0
    assert [i.body for i in envelopes(out)] == [{"a": 2}]
    letter = orjson.loads(err.splitlines()[0])
    assert letter["position"] == f"{log}:1"
    assert "longer than the record size limit of 1000 bytes" in letter["reason"]
    assert "--max-record-bytes" in letter["reason"] and len(letter["raw"]) <= 2000
    assert "1 records (no API=1), 1 dead letters" in err


def test_the_record_limit_comes_from_the_environment(main, capsys, tmp_path, monkeypatch):
    dump = tmp_path / "d.dump"
    dump.write_text("| offset: 1 CreateTime: 1795168800000 keySize: -1 payload: " + "{" * 300 + "\n")
    monkeypatch.setenv("FENCEWATCH_MAX_RECORD_BYTES", "100")
    assert main(["convert", "metadata-dump", str(dump)]) == 1  # its one line was too large
    assert "limit of 100 bytes" in capsys.readouterr().err


@pytest.mark.parametrize("value", ["0", "-5", "lots"])
def test_a_record_limit_that_is_not_a_positive_number_is_a_usage_error(main, capsys, value):
    with pytest.raises(SystemExit) as exc:
        main(["convert", "metadata-dump", "--max-record-bytes", value, METADATA_DUMP])
    assert exc.value.code == 2
    assert "--max-record-bytes" in capsys.readouterr().err


def test_a_bad_record_limit_in_the_environment_is_one_line(main, monkeypatch):
    monkeypatch.setenv("FENCEWATCH_MAX_RECORD_BYTES", "16M")
    with pytest.raises(SystemExit) as exc:
        main(["convert", "metadata-dump", METADATA_DUMP])
    assert str(exc.value.code) == (
        "fencewatch: FENCEWATCH_MAX_RECORD_BYTES='16M' is not a whole number of bytes"
        " -- fix or unset FENCEWATCH_MAX_RECORD_BYTES"
    )


_ALL_COMMANDS_IMPORTABLE = all(importlib.util.find_spec(m) for m in cli.COMMANDS.values())


@pytest.mark.skipif(
    not _ALL_COMMANDS_IMPORTABLE,
    reason="`python -m fencewatch` imports every command; some are not written yet",
)
def test_runs_as_a_subprocess():
    result = subprocess.run(
        [sys.executable, "-m", "fencewatch", "convert", "request-log", "--node", "1", "-"],
        input=(DATA / "request.log").read_bytes() + b"[2026-11-20 10:16:00,000] DEBUG "
        b'Completed request:{"x":"\xfe"} (kafka.request.logger)\n',
        capture_output=True,
        cwd=REPO,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert len(envelopes(result.stdout.decode())) == 4
    err = result.stderr.decode()
    assert '"position":"stdin:20"' in err and "not UTF-8" in err
    assert "4 records (ALTER_PARTITION=1, FETCH=1, PRODUCE=1, STOP_REPLICA=1), 1 dead letters" in err


# --- an input of another kind -------------------------------------------------

QUORUM_STATE = str(DATA / "native" / "quorum-state-v0.json")
REMOTE_LOG_METADATA = str(DATA / "native" / "remote-log-metadata.txt")


def converted(tmp_path: Path) -> str:
    """request.log converted: envelope JSONL."""
    path = tmp_path / "converted.jsonl"
    result = subprocess.run(
        [sys.executable, "-m", "fencewatch", "convert", "request-log", "--node", "1", REQUEST_LOG],
        capture_output=True,
        cwd=REPO,
        timeout=60,
        check=True,
    )
    path.write_bytes(result.stdout)
    return str(path)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["request-log", "--node", "1", METADATA_DUMP],
            f"{METADATA_DUMP} looks like kafka-dump-log.sh output, not a Kafka request log: "
            f"run `fencewatch convert metadata-dump --cluster C {METADATA_DUMP}`",
        ),
        (
            ["metadata-dump", "--cluster", "prod", REQUEST_LOG],
            f"{REQUEST_LOG} looks like a Kafka request log, not kafka-dump-log.sh output: "
            f"run `fencewatch convert request-log --cluster prod --node N {REQUEST_LOG}`",
        ),
        (
            ["request-log", "--node", "3", QUORUM_STATE],
            f"{QUORUM_STATE} looks like a controller's quorum-state file, not a Kafka request log: "
            f"run `fencewatch convert quorum-state --cluster C --node 3 {QUORUM_STATE}`",
        ),
        (
            ["metadata-dump", REMOTE_LOG_METADATA],
            f"{REMOTE_LOG_METADATA} looks like RemoteLogMetadataFormatter output, not kafka-dump-log.sh "
            f"output: run `fencewatch convert remote-log-metadata --cluster C {REMOTE_LOG_METADATA}`",
        ),
    ],
    ids=["dump-as-request-log", "request-log-as-dump", "quorum-state-as-request-log", "remote-as-dump"],
)
def test_an_input_of_another_kind_is_refused_with_the_command_that_reads_it(main, capsys, argv, message):
    assert main(["convert", *argv]) == 1
    out, err = capsys.readouterr()
    assert out == ""
    assert err == f"fencewatch convert: {message}\n"


def test_envelope_jsonl_is_converted_already(main, capsys, tmp_path):
    envelopes_file = converted(tmp_path)
    assert main(["convert", "request-log", "--node", "1", envelopes_file]) == 1
    assert capsys.readouterr().err == (
        f"fencewatch convert: {envelopes_file} looks like envelope JSONL, not a Kafka request log: "
        f"it is converted already: run `fencewatch replay {envelopes_file}`\n"
    )


def test_a_binary_file_is_refused_before_any_output(main, capsys, tmp_path):
    binary = tmp_path / "00000000000000000000.log"
    binary.write_bytes(b"\0\0\0\0\0\0\0\0\0\0\0\x4f\0\0\0\0\x02\xc3\x1f" + bytes(range(256)) * 40)
    # The good file first: nothing of it is written either.
    assert main(["convert", "metadata-dump", METADATA_DUMP, str(binary)]) == 1
    out, err = capsys.readouterr()
    assert out == ""
    assert err == (
        f"fencewatch convert: {binary} looks like a binary file, not kafka-dump-log.sh output: "
        "fencewatch reads text here; a metadata log segment or snapshot is read by "
        f"`fencewatch convert metadata-log --cluster C {binary}`\n"
    )


def test_stdin_is_recognised_too(main, capsys, monkeypatch):
    data = (DATA / "metadata.dump").read_bytes()
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(data)))
    assert main(["convert", "request-log", "--node", "1", "-"]) == 1
    assert capsys.readouterr().err == (
        "fencewatch convert: stdin looks like kafka-dump-log.sh output, not a Kafka request log: "
        "run `fencewatch convert metadata-dump --cluster C -`\n"
    )


def test_a_log4j_log_without_request_entries_gives_no_record_and_says_why(main, capsys, tmp_path):
    server_log = tmp_path / "server.log"
    server_log.write_text(
        "[2026-11-20 10:15:01,002] INFO [BrokerServer id=1] started (kafka.server.BrokerServer)\n"
        "java.lang.IllegalStateException: boom\n"
        "\n"
        "[2026-11-20 10:15:02,002] INFO [BrokerServer id=1] stopped (kafka.server.BrokerServer)\n"
    )
    assert main(["convert", "request-log", "--node", "1", str(server_log)]) == 1
    out, err = capsys.readouterr()
    assert out == ""
    assert err.splitlines() == [
        "fencewatch convert request-log: 1 file(s), 4 lines: 0 records, 0 dead letters, 0 continuation lines "
        "of multi-line entries; skipped: 3 other-logger lines, 1 blank lines, 0 lines before any log4j entry",
        f"fencewatch convert: no record in {server_log}: 3 non-blank lines, 0 dead letters; it looks like a "
        "Kafka log4j log without request-logger entries -- request entries are written with logger "
        "kafka.request.logger at DEBUG, to kafka-request.log",
    ]


def test_text_of_no_known_kind_gives_no_record_and_exits_1(main, capsys, tmp_path):
    notes = tmp_path / "notes.txt"
    notes.write_text("hello\n\nworld\n")
    assert main(["convert", "request-log", "--node", "1", str(notes)]) == 1
    err = capsys.readouterr().err
    assert "3 lines: 0 records, 0 dead letters, 0 continuation lines of multi-line entries; skipped: " in err
    assert "0 other-logger lines, 1 blank lines, 2 lines before any log4j entry" in err
    assert (
        f"no record in {notes}: 2 non-blank lines, 0 dead letters; it looks like text of no kind fencewatch "
        "reads -- `fencewatch convert --help` lists the formats it reads"
    ) in err


def test_one_input_of_several_giving_nothing_is_said_but_not_fatal(main, capsys, tmp_path):
    notes = tmp_path / "notes.txt"
    notes.write_text("hello\n")
    assert main(["convert", "request-log", "--node", "1", REQUEST_LOG, str(notes)]) == 0
    out, err = capsys.readouterr()
    assert len(envelopes(out)) == 4
    assert f"fencewatch convert: no record in {notes}: 1 non-blank lines" in err


# --- every line accounted for -------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "path"),
    [
        (["request-log", "--node", "1"], DATA / "request.log"),
        (["request-log", "--node", "1"], DATA / "e2e" / "broker-1-request.log"),
        (["metadata-dump"], DATA / "metadata.dump"),
        (["metadata-dump"], DATA / "native" / "metadata-leader-change.dump"),
        (["remote-log-metadata"], DATA / "native" / "remote-log-metadata.txt"),
    ],
    ids=lambda v: v.name if isinstance(v, Path) else None,
)
def test_the_summary_accounts_for_every_line(main, capsys, argv, path):
    assert main(["convert", *argv, str(path)]) == 0
    summary = capsys.readouterr().err.strip()
    total = len(path.read_bytes().splitlines())
    assert f" {total} lines: " in summary
    counts_part = summary.split(" lines: ", 1)[1]
    # The numbers after "N lines:" other than those inside a breakdown in parentheses add up to N.
    outside_parentheses = re.sub(r"\([^)]*\)", "", counts_part)
    parts = [int(n) for n in re.findall(r"(?:^|[,;:] )(\d+) ", outside_parentheses)]
    assert sum(parts) == total, summary


# --- dead letters beyond a handful ------------------------------------------------


def broken_log(tmp_path: Path, bad: int) -> Path:
    log = tmp_path / "broken.log"
    lines = [
        f"[2026-11-20 10:00:{n:02d},000] DEBUG Completed request:{{oops {n}}} (kafka.request.logger)\n"
        for n in range(bad)
    ]
    lines.append('[2026-11-20 10:01:00,000] DEBUG Completed request:{"a":1} (kafka.request.logger)\n')
    log.write_text("".join(lines))
    return log


def test_beyond_five_dead_letters_all_go_to_a_file_in_the_current_directory(
    main, capsys, tmp_path, monkeypatch
):
    monkeypatch.chdir(tmp_path)
    log = broken_log(tmp_path, 19)
    assert main(["convert", "request-log", "--node", "1", str(log)]) == 0
    out, err = capsys.readouterr()
    assert len(envelopes(out)) == 1
    shown = [orjson.loads(line) for line in err.splitlines() if line.startswith("{")]
    assert [d["position"] for d in shown] == [f"{log}:{n}" for n in range(1, 6)]
    letters = [
        orjson.loads(line) for line in (tmp_path / "fencewatch-dead-letters.jsonl").read_text().splitlines()
    ]
    assert [d["position"] for d in letters] == [f"{log}:{n}" for n in range(1, 20)]
    assert all("malformed request JSON" in d["reason"] for d in letters)
    assert (
        "fencewatch convert: 19 dead letters: the first 5 above, all 19 in fencewatch-dead-letters.jsonl "
        "(name the file with --dead-letter FILE)"
    ) in err.splitlines()


def test_an_earlier_dead_letter_file_is_never_overwritten(main, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "fencewatch-dead-letters.jsonl").write_text("earlier\n")
    assert main(["convert", "request-log", "--node", "1", str(broken_log(tmp_path, 6))]) == 0
    assert (tmp_path / "fencewatch-dead-letters.jsonl").read_text() == "earlier\n"
    assert len((tmp_path / "fencewatch-dead-letters-2.jsonl").read_text().splitlines()) == 6
    assert "all 6 in fencewatch-dead-letters-2.jsonl" in capsys.readouterr().err


def test_five_dead_letters_stay_on_stderr_only(main, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["convert", "request-log", "--node", "1", str(broken_log(tmp_path, 5))]) == 0
    err = capsys.readouterr().err
    assert sum(line.startswith("{") for line in err.splitlines()) == 5
    assert "dead letters:" not in err and not list(tmp_path.glob("fencewatch-dead-letters*"))


def test_with_a_dead_letter_file_stderr_says_where_they_went(main, capsys, tmp_path):
    dead = tmp_path / "dead.jsonl"
    assert (
        main(
            [
                "convert",
                "request-log",
                "--node",
                "1",
                "--dead-letter",
                str(dead),
                str(broken_log(tmp_path, 7)),
            ]
        )
        == 0
    )
    err = capsys.readouterr().err
    assert not any(line.startswith("{") for line in err.splitlines())
    assert f"fencewatch convert: 7 dead letters written to {dead}" in err.splitlines()
    assert len(dead.read_text().splitlines()) == 7


def test_when_no_dead_letter_file_can_be_made_the_rest_stay_on_stderr(main, capsys, tmp_path, monkeypatch):
    log = broken_log(tmp_path, 7)
    gone = tmp_path / "gone"
    gone.mkdir()
    monkeypatch.chdir(gone)
    gone.rmdir()  # the current directory no longer exists: nothing can be created in it
    assert main(["convert", "request-log", "--node", "1", str(log)]) == 0
    err = capsys.readouterr().err.splitlines()
    assert sum(line.startswith("{") for line in err) == 7
    assert (
        "fencewatch convert: cannot create fencewatch-dead-letters.jsonl in the current directory: "
        "No such file or directory; the rest go to stderr -- name a file with --dead-letter FILE"
    ) in err


def test_a_dump_counts_its_blank_and_unrecognised_lines_apart_from_its_headers(main, capsys, tmp_path):
    dump = tmp_path / "d.dump"
    dump.write_text((DATA / "metadata.dump").read_text() + "\nSome note a person added\n")
    assert main(["convert", "metadata-dump", str(dump)]) == 0
    assert "17 header and batch lines, 1 blank lines, 1 unrecognised lines" in capsys.readouterr().err
