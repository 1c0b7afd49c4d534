"""End to end on Kafka's native formats: ``fencewatch convert`` and
``fencewatch replay`` run as subprocesses, the way an incident responder runs
them, on one consistent cluster story in ``tests/data/e2e/``:

``metadata.dump`` (``kafka-dump-log.sh --cluster-metadata-decoder`` of
``__cluster_metadata-0``), cluster time 2026-11-20 UTC:

- 10:13:00 LeaderChange control record (controller 3000), feature levels;
- brokers 1, 2, 3 register (broker epochs 3, 4, 5, their records' offsets) and
  are unfenced; topic ``orders`` with partitions 0 (leader 1) and 1 (leader 2);
- 10:14:00 a NO_OP_RECORD;
- 10:14:58 orders-0's leader moves from broker 1 to broker 3 (leader epoch 1);
- 10:15:10 broker 2 is fenced and leaves both ISRs, orders-1 gets leader 3;
- 10:15:15 LeaderChange control record (controller 3001 takes over);
- 10:15:20 a PARTITION_CHANGE_RECORD puts fenced broker 2 back into the ISR of
  orders-0: ISR_INELIGIBLE_REPLICA_ADMITTED;
- 10:15:30 broker 2 is unfenced, then rejoins orders-1's ISR (not a violation).

``broker-1-request.log`` (broker 1's ``kafka-request.log``): produces and
fetches while it leads orders-0, a produce 1.1 s after losing leadership
(within grace: not a violation), the SPEC 1.2 sample line at 10:15:02,345 —
a produce to orders-0 answered NONE 4.3 s after broker 1 lost leadership:
PRODUCE_ACCEPTED_BY_NON_LEADER — and a stale fetch rejected with
FENCED_LEADER_EPOCH (fencing working). Other loggers' lines are mixed in.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import orjson
import pytest

DATA = Path(__file__).resolve().parents[1] / "data" / "e2e"
METADATA_DUMP = DATA / "metadata.dump"
REQUEST_LOG = DATA / "broker-1-request.log"
CLUSTER = "prod-eu-1"
TOPIC_ID = "qG8hUlWTTJ2eRb_bFvWRXg"
SPEC_LINE_PREFIX = (
    '[2026-11-20 10:15:02,345] DEBUG Completed request:{"isForwarded":false,"requestHeader":'
    '{"requestApiKey":0,"requestApiVersion":13,"correlationId":283,"clientId":"p1",'
    '"requestApiKeyName":"PRODUCE"},'
)
SPEC_LINE_TS_MS = 1_795_169_702_345  # 2026-11-20T10:15:02.345Z

# (rule, node, topic, partition, ts_ms)
EXPECTED_ALERTS = [
    ("PRODUCE_ACCEPTED_BY_NON_LEADER", 1, "orders", 0, SPEC_LINE_TS_MS),
    ("ISR_INELIGIBLE_REPLICA_ADMITTED", 2, "orders", 0, 1_795_169_720_000),  # 10:15:20.000
]


def fencewatch(*args: str | Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    """Run the command line as a user would; FENCEWATCH_* overrides from the
    caller's environment are dropped so the defaults apply."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("FENCEWATCH_")}
    return subprocess.run(
        [sys.executable, "-m", "fencewatch", *map(str, args)],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def jsonl(text: str) -> list[dict]:
    return [orjson.loads(line) for line in text.splitlines() if line.strip()]


def summary_tables(stderr: str) -> dict[str, dict[str, list[str]]]:
    """``print_summary``'s tables: title -> first column -> other columns."""
    tables: dict[str, dict[str, list[str]]] = {}
    rows: dict[str, list[str]] = {}
    for line in stderr.splitlines():
        if not line.strip():
            continue
        if not line.startswith(" "):
            rows = tables.setdefault(line.strip(), {})
            continue
        first, *rest = re.split(r"\s{2,}", line.strip())
        rows[first] = rest
    return tables


@dataclass
class Converted:
    """Both native files converted; the envelopes are in ``dir`` as
    ``metadata.jsonl`` and ``broker-1.jsonl``."""

    dir: Path
    metadata: subprocess.CompletedProcess[str]
    request: subprocess.CompletedProcess[str]


@pytest.fixture(scope="module")
def converted(tmp_path_factory: pytest.TempPathFactory) -> Converted:
    workdir = tmp_path_factory.mktemp("e2e")
    out = Converted(
        workdir,
        fencewatch("convert", "metadata-dump", "--cluster", CLUSTER, METADATA_DUMP, cwd=workdir),
        fencewatch("convert", "request-log", "--cluster", CLUSTER, "--node", "1", REQUEST_LOG, cwd=workdir),
    )
    (workdir / "metadata.jsonl").write_text(out.metadata.stdout)
    (workdir / "broker-1.jsonl").write_text(out.request.stdout)
    return out


def test_the_fixture_carries_the_spec_sample_line():
    lines = REQUEST_LOG.read_text().splitlines()
    (line,) = [x for x in lines if x.startswith(SPEC_LINE_PREFIX)]
    assert line.endswith("} (kafka.request.logger)")


def test_convert_metadata_dump(converted):
    run = converted.metadata
    assert run.returncode == 0, run.stderr
    assert run.stderr.strip() == (
        "fencewatch convert metadata-dump: 1 file(s), 39 lines: 21 records, 0 dead letters; "
        "skipped: 0 control records, 18 header and batch lines, 0 blank lines, 0 unrecognised lines"
    )
    envelopes = jsonl(run.stdout)
    assert {(e["cluster"], e["kind"], e["node"]) for e in envelopes} == {(CLUSTER, "metadata", None)}
    # Offsets are the log's own; the two LeaderChange control records (0 and 17) are quorum facts.
    assert [e["offset"] for e in envelopes] == list(range(21))
    assert [e["body"]["type"] for e in envelopes if e["offset"] not in (0, 17)] == [
        "FEATURE_LEVEL_RECORD",
        "FEATURE_LEVEL_RECORD",
        *["REGISTER_BROKER_RECORD"] * 3,
        *["BROKER_REGISTRATION_CHANGE_RECORD"] * 3,
        "TOPIC_RECORD",
        "PARTITION_RECORD",
        "PARTITION_RECORD",
        "NO_OP_RECORD",
        "PARTITION_CHANGE_RECORD",
        "BROKER_REGISTRATION_CHANGE_RECORD",
        "PARTITION_CHANGE_RECORD",
        "PARTITION_CHANGE_RECORD",
        "PARTITION_CHANGE_RECORD",
        "BROKER_REGISTRATION_CHANGE_RECORD",
        "PARTITION_CHANGE_RECORD",
    ]
    violating = next(e for e in envelopes if e["offset"] == 18)
    assert violating["ts_ms"] == 1_795_169_720_000
    assert violating["body"] == {
        "type": "PARTITION_CHANGE_RECORD",
        "version": 0,
        "data": {"partitionId": 0, "topicId": TOPIC_ID, "isr": [1, 3, 2]},
    }


def test_convert_request_log(converted):
    run = converted.request
    assert run.returncode == 0, run.stderr
    assert run.stderr.strip() == (
        "fencewatch convert request-log: 1 file(s), 7 lines: 5 records (FETCH=2, PRODUCE=3), 0 dead letters, "
        "0 continuation lines of multi-line entries; skipped: 2 other-logger lines, 0 blank lines, "
        "0 lines before any log4j entry"
    )
    envelopes = jsonl(run.stdout)
    assert [(e["cluster"], e["kind"], e["node"], e["offset"]) for e in envelopes] == [
        (CLUSTER, "request", 1, None)
    ] * 5
    assert [e["body"]["requestHeader"]["requestApiKeyName"] for e in envelopes] == [
        "PRODUCE",
        "FETCH",
        "PRODUCE",
        "PRODUCE",
        "FETCH",
    ]
    # The SPEC 1.2 line: ts_ms from its log4j stamp (UTC), body the JSON after the marker, unchanged.
    (line,) = [x for x in REQUEST_LOG.read_text().splitlines() if x.startswith(SPEC_LINE_PREFIX)]
    body_text = line.split("Completed request:", 1)[1].removesuffix(" (kafka.request.logger)")
    spec = next(e for e in envelopes if e["ts_ms"] == SPEC_LINE_TS_MS)
    assert spec["body"] == orjson.loads(body_text)


@pytest.mark.parametrize("order", ["metadata-first", "requests-first"])
def test_replay_raises_exactly_the_two_violations(converted, order):
    files = ["metadata.jsonl", "broker-1.jsonl"]
    if order == "requests-first":
        files.reverse()  # replay merges by ts_ms: file order must not matter
    run = fencewatch("replay", "--no-progress", *files, cwd=converted.dir)
    assert run.returncode == 0, run.stderr
    alerts = jsonl(run.stdout)
    assert [(a["rule"], a["node"], a["topic"], a["partition"], a["ts_ms"]) for a in alerts] == EXPECTED_ALERTS
    assert {(a["cluster"], a["topic_id"], a["status"], a["severity"]) for a in alerts} == {
        (CLUSTER, TOPIC_ID, "firing", "critical")
    }
    produce, isr = alerts
    assert [(e["role"], e["kind"], e["offset"]) for e in produce["evidence"]] == [
        ("view", "metadata", 13),  # the leader change to broker 3
        ("violation", "request", None),
    ]
    assert produce["evidence"][-1]["ts_ms"] == SPEC_LINE_TS_MS
    assert [(e["role"], e["kind"], e["offset"]) for e in isr["evidence"]] == [
        ("view", "metadata", 14),  # broker 2 fenced
        ("violation", "metadata", 18),
    ]
    assert summary_tables(run.stderr) == {
        "events": {"metadata": ["21"], "request:FETCH": ["2"], "request:PRODUCE": ["3"]},
        "not judged": {"dead letters": ["0"], "duplicates": ["0"], "late (beyond lateness)": ["0"]},
        "alerts: 2 violations and 0 resolutions": {
            "violations": ["count"],
            "ISR_INELIGIBLE_REPLICA_ADMITTED": ["1"],
            "PRODUCE_ACCEPTED_BY_NON_LEADER": ["1"],
            "total violations": ["2"],
            "resolutions": ["count"],
            "total resolutions": ["0"],
        },
        # The LeaderChange at offset 17 hands the log to another controller's clock
        # (ClockBook.taken_over): node 1's one bound, from before it, is loosened,
        # and no request of node 1 after it settles that.
        "clocks of prod-eu-1 (measured from what each node's requests knew; verdicts allow for them)": {
            "node 1's clock is within -89.0..+115.3 s of the metadata log's: wider than the clock limit, "
            "its verdicts are counted clock uncertain": []
        },
        # Every line read accounted for: 21 metadata records and 5 requests.
        "fencewatch replay: 2 file(s), 26 lines: 26 envelopes processed, 0 duplicates, 0 too late to judge, "
        "0 dead letters, 0 blank lines": {},
    }


def test_replay_alert_ids_do_not_depend_on_file_order(converted):
    runs = [
        fencewatch("replay", "--no-progress", *files, cwd=converted.dir)
        for files in (["metadata.jsonl", "broker-1.jsonl"], ["broker-1.jsonl", "metadata.jsonl"])
    ]
    ids = [[a["alert_id"] for a in jsonl(run.stdout)] for run in runs]
    assert ids[0] == ids[1]
    assert len(set(ids[0])) == 2


def test_simulate_then_replay_with_truth_agrees(tmp_path):
    # 1000 events/s puts the last half of the 20 000 events past the simulator's 10 s warm-up,
    # so faults are injected.
    sim = fencewatch(
        "simulate",
        "--seed",
        "1",
        "--events",
        "20000",
        "--events-per-second",
        "1000",
        "--fault-rate",
        "0.01",
        "--output",
        "events.jsonl",
        cwd=tmp_path,
    )
    assert sim.returncode == 0, sim.stderr
    assert "simulated 20000 events" in sim.stderr
    truth = jsonl((tmp_path / "events.jsonl.truth.jsonl").read_text())
    assert truth, sim.stderr
    run = fencewatch(
        "replay", "--no-progress", "--truth", "events.jsonl.truth.jsonl", "events.jsonl", cwd=tmp_path
    )
    assert run.returncode == 0, run.stderr
    # Possible violations (clock evidence allows them, not proves them) are not ground truth.
    assert len([a for a in jsonl(run.stdout) if a["confidence"] == "certain"]) == len(truth)
    tables = summary_tables(run.stderr)
    ground_truth = next(rows for title, rows in tables.items() if title.startswith("ground truth"))
    resolutions = sum(t["status"] == "resolved" for t in truth)
    assert ground_truth["total violations"] == [str(len(truth) - resolutions), "0", "0"]
    assert ground_truth["total resolutions"] == [str(resolutions), "0", "0"]
    assert f"injected {len(truth) - resolutions} violations and " in sim.stderr
    assert tables["not judged"]["dead letters"] == ["0"]
