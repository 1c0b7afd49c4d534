"""``fencewatch convert`` (SPEC section 4), fencewatch/convert.py."""

from __future__ import annotations

import importlib.util
import io
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
    assert "4 records, 0 dead letters, 5 other-logger lines skipped" in err


def test_metadata_dump_to_envelope_jsonl(main, capsys):
    code = main(["convert", "metadata-dump", METADATA_DUMP])
    out, err = capsys.readouterr()

    assert code == 0
    items = envelopes(out)
    assert [i.offset for i in items] == list(range(13))
    assert {(i.cluster, i.node, i.kind) for i in items} == {("default", None, "metadata")}
    assert "13 records, 0 dead letters, 4 control records skipped" in err
    assert "LEADER_CHANGE" not in err and "KRAFT_VOTERS=1" in err


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
    assert "1 records, 2 dead letters" in err
    assert '"position"' not in err  # they went to the file, not stderr


def test_dead_letters_go_to_stderr_by_default(main, capsys, tmp_path):
    dump = tmp_path / "bad.dump"
    dump.write_text("| offset: 1 CreateTime: 1795168800000 keySize: -1 payload: {oops\n")
    assert main(["convert", "metadata-dump", str(dump)]) == 0
    out, err = capsys.readouterr()
    assert out == ""
    letter = orjson.loads(err.splitlines()[0])
    assert letter["position"] == f"{dump}:1" and "malformed payload JSON" in letter["reason"]


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
    assert "1 records, 1 dead letters" in err


def test_the_record_limit_comes_from_the_environment(main, capsys, tmp_path, monkeypatch):
    dump = tmp_path / "d.dump"
    dump.write_text("| offset: 1 CreateTime: 1795168800000 keySize: -1 payload: " + "{" * 300 + "\n")
    monkeypatch.setenv("FENCEWATCH_MAX_RECORD_BYTES", "100")
    assert main(["convert", "metadata-dump", str(dump)]) == 0
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
    assert "4 records, 1 dead letters" in err
