"""Every path-valued option of every command: a bad path ends the command in one
line on stderr (``fencewatch <command>: <what> -- <what to do>``) and exit code
1, before any work: no traceback, nothing on stdout, nothing created.
The commands run as users run them, as ``python -m fencewatch`` subprocesses."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from fencewatch.options import output_dir, output_file, truth_records

REPO = Path(__file__).resolve().parents[2]
DATA = REPO / "tests" / "data"
KAFKA = ["--bootstrap-servers", "127.0.0.1:1", "--topic", "t"]
SHIP = ["ship", "request-log", *KAFKA, "--cluster", "c", "--node", "1"]
RUN = ["run", *KAFKA]
AS_ROOT = os.geteuid() == 0


@pytest.fixture
def paths(tmp_path: Path) -> dict[str, str]:
    """A file, a directory, a missing file, a file in a missing directory, a
    path through a file, a good checkpoint, an empty state file that is not JSON."""
    (tmp_path / "file.txt").write_text("x\n")
    (tmp_path / "dir").mkdir()
    (tmp_path / "state.json").write_text("{not json")
    return {
        "FILE": str(tmp_path / "file.txt"),
        "DIR": str(tmp_path / "dir"),
        "MISSING": str(tmp_path / "missing.jsonl"),
        "NO_DIR": str(tmp_path / "no-such-dir" / "out.jsonl"),
        "THROUGH_FILE": str(tmp_path / "file.txt" / "out.jsonl"),
        "CHECKPOINT": str(tmp_path / "checkpoint"),
        "BAD_STATE": str(tmp_path / "state.json"),
        "OUT": str(tmp_path / "out.jsonl"),
    }


CASES = [
    # (command line with placeholders, what the one line must say)
    (["convert", "metadata-dump", "MISSING"], "fencewatch convert: cannot open MISSING: no such file"),
    (["convert", "metadata-dump", "DIR"], "fencewatch convert: cannot open DIR: it is a directory"),
    (
        ["convert", "metadata-dump", "--dead-letter", "DIR", str(DATA / "metadata.dump")],
        "fencewatch convert: cannot write --dead-letter DIR: it is a directory",
    ),
    (
        ["convert", "request-log", "--node", "1", "--dead-letter", "NO_DIR", str(DATA / "request.log")],
        "fencewatch convert: cannot write --dead-letter NO_DIR: directory",
    ),
    (["simulate", "--events", "10", "-o", "NO_DIR"], "fencewatch simulate: cannot write --output NO_DIR"),
    (
        ["simulate", "--events", "10", "-o", "THROUGH_FILE"],
        "fencewatch simulate: cannot write --output THROUGH_FILE",
    ),
    (
        ["simulate", "--events", "10", "-o", "OUT", "--truth", "DIR"],
        "fencewatch simulate: cannot write --truth DIR: it is a directory",
    ),
    (
        ["simulate", "--events", "10", "-o", "OUT", "--native-dir", "FILE"],
        "fencewatch simulate: cannot use --native-dir FILE: it is a file",
    ),
    ([*RUN, "--checkpoint", "FILE"], "fencewatch run: cannot use --checkpoint FILE: it is a file"),
    ([*RUN, "--checkpoint", "THROUGH_FILE"], "fencewatch run: cannot use --checkpoint THROUGH_FILE"),
    (
        [*RUN, "--checkpoint", "CHECKPOINT", "--webhooks", "MISSING"],
        "fencewatch run: cannot open --webhooks MISSING: no such file",
    ),
    (
        [*RUN, "--checkpoint", "CHECKPOINT", "--webhook-outbox", "DIR"],
        "fencewatch run: cannot write --webhook-outbox DIR: it is a directory",
    ),
    (["demo", "--webhooks", "DIR"], "fencewatch demo: cannot open --webhooks DIR: it is a directory"),
    (
        ["receive-webhooks", "--port", "0", "--secret-file", "MISSING"],
        "fencewatch receive-webhooks: cannot open --secret-file MISSING",
    ),
    (
        ["receive-webhooks", "--port", "0", "--output", "NO_DIR"],
        "fencewatch receive-webhooks: cannot write --output NO_DIR",
    ),
    ([*SHIP, "DIR"], "fencewatch ship request-log: cannot open DIR: it is a directory"),
    ([*SHIP, "--once", "MISSING"], "fencewatch ship request-log: cannot open MISSING: no such file"),
    (
        [*SHIP, "--state-file", "NO_DIR", "FILE"],
        "fencewatch ship request-log: cannot write --state-file NO_DIR",
    ),
    ([*SHIP, "--state-file", "BAD_STATE", "FILE"], "fencewatch ship request-log: state file BAD_STATE"),
    (
        ["ship", "metadata-dump", *KAFKA, "--cluster", "c", "MISSING"],
        "fencewatch ship metadata-dump: cannot open MISSING: no such file",
    ),
    (["convert", "metadata-log", "MISSING"], "fencewatch convert: cannot open MISSING: no such file"),
    (
        ["ship", "metadata-log", *KAFKA, "--cluster", "c", "MISSING"],
        "fencewatch ship metadata-log: cannot follow MISSING: no such directory",
    ),
    (
        ["ship", "metadata-log", *KAFKA, "--cluster", "c", "FILE"],
        "fencewatch ship metadata-log: cannot follow FILE: it is not a directory",
    ),
    (
        ["ship", "metadata-log", *KAFKA, "--cluster", "c", "--state-file", "NO_DIR", "DIR"],
        "fencewatch ship metadata-log: cannot write --state-file NO_DIR",
    ),
    (
        ["ship", "metadata-log", *KAFKA, "--cluster", "c", "--state-file", "BAD_STATE", "DIR"],
        "fencewatch ship metadata-log: state file BAD_STATE is not JSON",
    ),
    (["replay", "MISSING"], "fencewatch replay: cannot open MISSING: no such file"),
    (["replay", "FILE", "DIR"], "fencewatch replay: cannot open DIR: it is a directory"),
    (
        ["replay", "--dead-letter", "DIR", str(DATA / "e2e" / "metadata.dump")],
        "fencewatch replay: cannot write --dead-letter DIR: it is a directory",
    ),
    (
        ["replay", "--truth", "MISSING", "FILE"],
        "fencewatch replay: cannot open --truth MISSING: no such file",
    ),
    (["replay", "--truth", "BAD_STATE", "FILE"], "fencewatch replay: --truth BAD_STATE line 1 is not JSON"),
    (
        ["probe", "--bootstrap-servers", "127.0.0.1:1", "--webhooks", "MISSING"],
        "fencewatch probe: cannot open --webhooks MISSING: no such file",
    ),
    (
        ["probe", "--bootstrap-servers", "127.0.0.1:1", "--webhook-outbox", "NO_DIR"],
        "fencewatch probe: cannot write --webhook-outbox NO_DIR",
    ),
]


def fill(words: list[str], paths: dict[str, str]) -> list[str]:
    return [paths.get(word, word) for word in words]


def fencewatch(argv: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    # Settings from the environment must not change what is being tested.
    env = {k: v for k, v in os.environ.items() if not k.startswith("FENCEWATCH_")}
    env["PYTHONPATH"] = str(REPO)
    return subprocess.run(
        [sys.executable, "-m", "fencewatch", *argv],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=env,
        stdin=subprocess.DEVNULL,
        timeout=60,
        check=False,
    )


@pytest.mark.parametrize(
    ("argv", "expected"), CASES, ids=[" ".join(c[0][:3]) + f" #{n}" for n, c in enumerate(CASES)]
)
def test_a_bad_path_is_one_line_and_exit_1_before_any_work(argv, expected, paths, tmp_path):
    before = sorted(p.name for p in tmp_path.rglob("*"))
    result = fencewatch(fill(argv, paths), tmp_path)

    assert result.returncode == 1, result.stderr
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    message = lines[0]
    placeholders = re.compile(r"\b(" + "|".join(paths) + r")\b")
    assert message.startswith(placeholders.sub(lambda m: paths[m.group(1)], expected)), message
    assert " -- " in message, message
    assert sorted(p.name for p in tmp_path.rglob("*")) == before  # nothing written, nothing created


@pytest.mark.skipif(AS_ROOT, reason="root reads and writes regardless of permissions")
def test_unreadable_input_and_unwritable_directory(paths, tmp_path):
    os.chmod(paths["FILE"], 0)
    os.chmod(paths["DIR"], 0o500)
    try:
        unreadable = fencewatch(["convert", "metadata-dump", paths["FILE"]], tmp_path)
        unwritable = fencewatch(["simulate", "-o", os.path.join(paths["DIR"], "e.jsonl")], tmp_path)
    finally:
        os.chmod(paths["FILE"], 0o600)
        os.chmod(paths["DIR"], 0o700)
    assert unreadable.returncode == 1 and "permission denied" in unreadable.stderr
    assert unwritable.returncode == 1 and "permission denied" in unwritable.stderr
    assert len(unreadable.stderr.splitlines()) == len(unwritable.stderr.splitlines()) == 1


# -- the checks replay's options use, in-process ----------------------------------------


def one_line_exit(call) -> str:
    with pytest.raises(SystemExit) as exc:
        call()
    message = str(exc.value.code)
    assert "\n" not in message and " -- " in message
    return message


def test_truth_records_reads_a_simulators_ground_truth(tmp_path):
    truth = tmp_path / "t.jsonl"
    truth.write_text('{"rule":"QUORUM_DOUBLE_VOTE","ts_ms":5}\n\n{"rule":"QUORUM_ZOMBIE_LEADER"}\n')
    assert truth_records("fencewatch replay", str(truth)) == [
        {"rule": "QUORUM_DOUBLE_VOTE", "ts_ms": 5},
        {"rule": "QUORUM_ZOMBIE_LEADER"},
    ]


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        (b'{"rule":"R"}\n{"rule":', "line 2 is not JSON"),
        (b"[1, 2]\n", "line 1 is not a ground-truth record"),
        (b'{"ts_ms": 5}\n', "line 1 is not a ground-truth record"),
        (b"\xff\xfe\n", "line 1 is not JSON"),
    ],
)
def test_a_malformed_truth_file_is_one_line(tmp_path, content, expected):
    truth = tmp_path / "t.jsonl"
    truth.write_bytes(content)
    message = one_line_exit(lambda: truth_records("fencewatch replay", str(truth)))
    assert message.startswith(f"fencewatch replay: --truth {truth} {expected}"), message


def test_a_missing_or_directory_truth_is_one_line(tmp_path):
    missing = one_line_exit(lambda: truth_records("fencewatch replay", str(tmp_path / "nope")))
    assert missing.startswith(f"fencewatch replay: cannot open --truth {tmp_path / 'nope'}: no such file")
    directory = one_line_exit(lambda: truth_records("fencewatch replay", str(tmp_path)))
    assert "it is a directory" in directory


def test_output_checks_accept_what_is_fine_and_create_nothing(tmp_path):
    output_file("p", None, "--x")
    output_file("p", "-", "--x")
    output_file("p", str(tmp_path / "new.jsonl"), "--x")
    output_dir("p", str(tmp_path / "a" / "b" / "checkpoint"), "--checkpoint")
    output_dir("p", "hdfs://namenode/fencewatch/checkpoint", "--checkpoint")
    output_dir("p", f"file://{tmp_path}/ck", "--checkpoint")
    assert list(tmp_path.iterdir()) == []
    message = one_line_exit(lambda: output_file("fencewatch replay", str(tmp_path), "--dead-letter"))
    assert message == (
        f"fencewatch replay: cannot write --dead-letter {tmp_path}: it is a directory -- "
        "name a file to write, e.g. a file inside it"
    )
