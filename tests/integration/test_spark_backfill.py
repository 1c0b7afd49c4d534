"""``fencewatch replay --engine spark``: the streaming job's detector over
envelope files on a real local Spark gives exactly ``fencewatch replay``'s
alerts, dead letters and summary (streaming/file_source.py)."""

from __future__ import annotations

import io
import os
import re
import subprocess
import sys
from collections.abc import Sequence
from contextlib import redirect_stderr, redirect_stdout
from itertools import pairwise
from pathlib import Path

import orjson
import pytest
from test_job import BAD_RECORDS, simulate

from detectors.config import DetectorConfig
from detectors.engine import Detector
from detectors.envelope import envelope_from_obj
from fencewatch.cli import main as fencewatch
from fencewatch.summaries import print_summary
from streaming.file_source import BackfillOptions, BackfillResult, FilesOutOfOrder, backfill

pytestmark = pytest.mark.integration

REPO_ROOT = Path(__file__).resolve().parents[2]
RECORD_LIMIT = 4096  # --max-record-bytes for the bad-lines file
# Bad lines, each with the class replay gives it (inserted among good ones).
BAD_LINES = [
    # the job's bad records, but for the cluster mismatch (a file has no record key)
    *((bad, kind) for bad, kind in BAD_RECORDS if kind != "cluster_mismatch"),
    (
        b'{"cluster": "sim-1", "node": 1, "ts_ms": 1763720000000, "kind": "request", "body": {"x": "\xff"}}',
        "malformed_json",
    ),  # valid JSON but for one byte: Spark must not decode it into a valid envelope
    (b'{"cluster": "sim-1", "node": 1, "ts_ms": 1763720000000, "kind": "request"}', "missing_field"),
    (b"[1, 2, 3]", "wrong_type"),
    (b"  \t \x0c", None),  # blank: skipped, but counted as a line
    (b'{"pad": "' + b"x" * RECORD_LIMIT + b'"}', "too_large"),  # the reader knows only it is longer
    (b"y" * (RECORD_LIMIT + 1), "too_large"),  # one byte over: the reader knows its size
    (b"z" * RECORD_LIMIT, "malformed_json"),  # at the limit: read, and not JSON
]


def write(path: Path, lines: Sequence[bytes], newline: bytes = b"\n") -> str:
    path.write_bytes(b"".join(line + newline for line in lines))
    return str(path)


def replay(files: Sequence[str], tmp_path: Path, *options: str) -> tuple[list[dict], list[dict], str]:
    """``fencewatch replay`` in this process: (alerts, dead letters, summary);
    without clock measurement, as the Spark engine's bucketed detector judges
    (docs/architecture.md, "Time and clocks")."""
    dead = tmp_path / "replay-dead-letters.jsonl"
    out, err = io.StringIO(), io.StringIO()
    argv = ["replay", "--no-progress", "--no-measure-clocks", "--dead-letter", str(dead), *options, *files]
    with redirect_stdout(out), redirect_stderr(err):
        code = fencewatch(argv)
    assert code == 0, err.getvalue()
    # print_summary's tables only: not the command's own lines (where the dead
    # letters went, the accounting of every line read, which the Python engine alone makes).
    lines = err.getvalue().splitlines(keepends=True)
    summary = "".join(line for line in lines if not line.startswith("fencewatch replay: "))
    return parse(out.getvalue()), parse(dead.read_text()), summary


def spark_replay(
    spark, files: Sequence[str], buckets: int, **options: int
) -> tuple[list[dict], list[dict], str, BackfillResult]:
    """The Spark engine on the fixture's session: (alerts, dead letters, summary, result)."""
    letters: list[str] = []
    result = backfill(
        spark, BackfillOptions(files=files, buckets=buckets, progress_seconds=None, **options), letters.append
    )
    summary = io.StringIO()
    print_summary(result.counters, result.dead_letters, summary)
    return (
        [orjson.loads(a) for a in result.alerts],
        [orjson.loads(x) for x in letters],
        summary.getvalue(),
        result,
    )


def parse(text: str) -> list[dict]:
    return [orjson.loads(line) for line in text.splitlines() if line.strip()]


def by_id(alerts: list[dict]) -> dict[str, dict]:
    """Alerts by id, without ``detected_ms`` (the wall clock when raised)."""
    ids = [a["alert_id"] for a in alerts]
    assert len(ids) == len(set(ids)), "an alert was printed twice"
    return {a["alert_id"]: {k: v for k, v in a.items() if k != "detected_ms"} for a in alerts}


def sorted_letters(letters: list[dict]) -> list[dict]:
    return sorted(letters, key=lambda d: (d["position"], d["reason"]))


@pytest.fixture(scope="module")
def history(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[bytes], str]:
    lines = [orjson.dumps(e) for e in simulate(seed=7, events=20_000)[0]]
    return lines, write(tmp_path_factory.mktemp("history") / "history.jsonl", lines)


@pytest.mark.parametrize("buckets", [1, 7])
def test_one_file_gives_replays_alerts_and_summary(spark, history, tmp_path: Path, buckets: int):
    _, path = history
    alerts, letters, summary = replay([path], tmp_path)
    assert len(alerts) >= 5, "the simulated history should raise alerts"
    got, got_letters, got_summary, result = spark_replay(spark, [path], buckets)
    assert by_id(got) == by_id(alerts)  # the same ids, and the same alert JSON (evidence positions too)
    assert got_letters == letters == []
    assert got_summary == summary
    # Spark splits the 20 MB file in two for the two cores; each split's lines are numbered on.
    assert result.batches == 1 and result.lines == 20_000


def test_pieces_in_order_give_replays_alerts(spark, history, tmp_path: Path):
    lines, whole = history
    cuts = [0, 6_113, 13_901, len(lines)]
    pieces = [write(tmp_path / f"piece-{i}.jsonl", lines[a:b]) for i, (a, b) in enumerate(pairwise(cuts))]
    alerts, _, summary = replay(pieces, tmp_path)
    assert by_id(alerts).keys() == by_id(replay([whole], tmp_path)[0]).keys()  # positions differ
    got, got_letters, got_summary, _ = spark_replay(spark, pieces, buckets=7)
    assert by_id(got) == by_id(alerts)
    assert got_letters == []
    assert got_summary == summary


def test_the_end_of_input_judges_what_is_still_waiting(spark, history, tmp_path: Path):
    """Cut where an alert is raised only by the flush at the end of the input:
    the Spark engine must judge at its end too, and only there."""
    lines, _ = history
    cut = flush_only_cut(lines)
    path = write(tmp_path / "cut.jsonl", lines[:cut])
    alerts, _, summary = replay([path], tmp_path)
    got, _, got_summary, _ = spark_replay(spark, [path], buckets=7)
    assert by_id(got) == by_id(alerts)
    assert got_summary == summary


def flush_only_cut(lines: list[bytes]) -> int:
    """A prefix of ``lines`` whose end-of-input flush raises an alert: one that
    ends at the last line of an alert's evidence, before its grace window closed."""

    def read(prefix: list[bytes]) -> Detector:
        detector = Detector(DetectorConfig())
        for i, line in enumerate(prefix, start=1):
            detector.ingest(envelope_from_obj(orjson.loads(line), str(i), i))
        return detector

    whole = read(lines)
    whole.flush()
    for alert in whole.drain():
        cut = max(int(e.position) for e in alert.evidence)
        detector = read(lines[:cut])
        before = {a.alert_id for a in detector.drain()}
        detector.flush()
        if alert.alert_id in {a.alert_id for a in detector.drain()} - before:
            return cut
    raise AssertionError("no cut raises an alert at the flush")


def test_bad_lines_give_replays_dead_letters(spark, history, tmp_path: Path):
    lines, _ = history
    mixed = list(lines[:3_000])
    for n, (bad, _) in enumerate(BAD_LINES):
        mixed.insert(40 + 250 * n, bad)
    mixed.insert(10, b"")  # an empty line
    # CRLF line ends: replay strips them, and so must the Spark engine.
    first = write(tmp_path / "bad-a.jsonl", mixed[:1_500], newline=b"\r\n")
    second = write(tmp_path / "bad-b.jsonl", mixed[1_500:])
    files = [first, second]
    alerts, letters, summary = replay(files, tmp_path, "--max-record-bytes", str(RECORD_LIMIT))
    expected_classes = sorted(kind for _, kind in BAD_LINES if kind is not None)
    assert len(letters) == len(expected_classes)
    # Read in splits of 64 KiB (Spark's default would be 4 MiB here): line numbers go across splits.
    got, got_letters, got_summary, result = spark_replay(
        spark, files, buckets=7, max_record_bytes=RECORD_LIMIT, split_bytes=64 * 1024
    )
    assert result.lines == len(mixed)
    assert by_id(got) == by_id(alerts)
    # The same letters (position file:line, reason, raw), and the same count per class.
    assert sorted_letters(got_letters) == sorted_letters(letters)
    assert got_summary == summary
    for kind in set(expected_classes):
        assert f"dead letters: {kind}" in summary


def test_files_that_overlap_in_time_are_refused(spark, history, tmp_path: Path):
    """One file per source (here: metadata apart from the rest) is not a piece
    of one stream: replay merges it by ts_ms, the Spark engine would not."""
    lines, _ = history
    metadata = [line for line in lines if b'"kind":"metadata"' in line]
    rest = [line for line in lines if b'"kind":"metadata"' not in line]
    files = [write(tmp_path / "rest.jsonl", rest), write(tmp_path / "metadata.jsonl", metadata)]
    with pytest.raises(FilesOutOfOrder, match=re.escape("metadata.jsonl has a record of cluster 'sim-1'")):
        spark_replay(spark, files, buckets=7)
    # Pieces named out of order are refused as well.
    half = len(lines) // 2
    late = write(tmp_path / "second-half.jsonl", lines[half:])
    early = write(tmp_path / "first-half.jsonl", lines[:half])
    with pytest.raises(FilesOutOfOrder, match=re.escape("first-half.jsonl has a record")):
        spark_replay(spark, [late, early], buckets=7)


@pytest.mark.extended  # the engine's parity is checked in-process above
def test_command_line(history, tmp_path: Path):
    """``fencewatch replay --engine spark`` as a user runs it: its own Spark,
    progress on stderr, the alerts on stdout; a missing file is one line;
    Spark's and the JVM's output only in a log file, removed once the batch succeeded."""
    _, path = history
    own_tmp = tmp_path / "tmp"
    own_tmp.mkdir()
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")])),
        "TMPDIR": str(own_tmp),  # where the command puts Spark's log
    }
    # Clocks unmeasured as in replay() below: with them measured, 3 buckets prove what
    # detectors.split.Split(3) proves, not the whole cluster's replay (docs/architecture.md).
    command = [
        *(sys.executable, "-m", "fencewatch.cli", "replay", "--engine", "spark"),
        *("--buckets", "3", "--no-measure-clocks"),
    ]
    missing = subprocess.run(
        [*command, str(tmp_path / "nope.jsonl")], capture_output=True, text=True, env=env
    )
    assert missing.returncode == 1
    nope = tmp_path / "nope.jsonl"
    assert missing.stderr.strip().splitlines() == [
        f"fencewatch replay: cannot open {nope}: no such file or directory -- check the path"
    ]
    stdin = subprocess.run([*command, "-"], capture_output=True, text=True, env=env, input="")
    assert stdin.returncode == 1 and "cannot read stdin" in stdin.stderr
    done = subprocess.run([*command, path], capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stderr
    alerts, _, summary = replay([path], tmp_path)
    assert by_id(parse(done.stdout)) == by_id(alerts)
    assert "fencewatch replay: " in done.stderr and "1 batch done: 20000 lines" in done.stderr
    assert done.stderr.endswith(summary)
    own_lines = done.stderr[: -len(summary)].splitlines()
    assert own_lines and all(line.startswith("fencewatch replay: ") for line in own_lines), own_lines
    assert not list(own_tmp.glob("fencewatch-replay-*.log"))
