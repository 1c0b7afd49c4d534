"""Only what a rule reads (issue 25, item 4): ``detectors.rules.READ_APIS``, the
request-log parser's filter, and ``fencewatch convert request-log`` with and
without ``--all-apis``, replayed.

A request log at DEBUG holds every API the broker serves. Convert and ship keep
the entries of the APIs some rule reads and count the others by API name; the
detector reads nothing of those but the "request:unchecked" count, so the
alerts are the same either way.
"""

from __future__ import annotations

import json
from collections import Counter
from datetime import UTC, datetime
from itertools import pairwise
from pathlib import Path
from typing import Any

import orjson
import pytest

from detectors.clocks import GAP_MS
from detectors.config import DetectorConfig
from detectors.engine import Detector
from detectors.envelope import Envelope, envelope_from_obj
from detectors.parse_request_log import RequestLogStats, iter_request_log
from detectors.requests import API_NAMES, MAX_KAFKA_API_KEY
from detectors.rules import READ_APIS
from fencewatch import cli
from producers.simulator import SimConfig, Simulator

CLUSTER = "sim-1"
# APIs no rule reads, as a consumer-heavy broker logs them: (key, Kafka's name).
UNREAD = ((12, "HEARTBEAT"), (3, "METADATA"), (18, "API_VERSIONS"))


@pytest.fixture
def main(monkeypatch: pytest.MonkeyPatch) -> Any:
    """``cli.main`` with only the commands these tests use registered."""
    monkeypatch.setattr(cli, "COMMANDS", {k: cli.COMMANDS[k] for k in ("convert", "replay")})
    return cli.main


def produce_shaped(api_key: int, name: str | None, correlation_id: int = 1) -> dict[str, Any]:
    """A request-log body with ``api_key`` in its header and a Produce's partitions
    in request and response, so that a rule reading partitions would find one."""
    head: dict[str, Any] = {
        "requestApiKey": api_key,
        "requestApiVersion": 4,
        "correlationId": correlation_id,
        "clientId": "consumer-1",
    }
    if name is not None:
        head["requestApiKeyName"] = name
    return {
        "isForwarded": False,
        "requestHeader": head,
        "request": {
            "acks": -1,
            "topicData": [{"name": "orders", "partitionData": [{"index": 0, "currentLeaderEpoch": 0}]}],
        },
        "response": {
            "errorCode": 0,
            "responses": [{"name": "orders", "partitionResponses": [{"index": 0, "errorCode": 0}]}],
        },
    }


def stamp(ts_ms: int) -> str:
    """log4j's default timestamp of ``ts_ms``, in UTC."""
    moment = datetime.fromtimestamp(ts_ms / 1000, UTC)
    return f"{moment:%Y-%m-%d %H:%M:%S},{ts_ms % 1000:03d}"


def log_line(ts_ms: int, body: dict[str, Any]) -> str:
    return f"[{stamp(ts_ms)}] DEBUG Completed request:{json.dumps(body)} (kafka.request.logger)\n"


# -- the list and the engine ------------------------------------------------------------


def test_the_engine_reads_no_api_outside_the_list() -> None:
    """Every API key the engine names is in READ_APIS, and a request of any other
    key is only counted as "request:unchecked": no judgment, no alert, no dead
    letter, with or without measured clocks. A rule that reads a new API fails
    this until READ_APIS has it."""
    assert set(API_NAMES) == READ_APIS
    for measure_clocks in (True, False):
        for api_key in range(MAX_KAFKA_API_KEY + 1):
            detector = Detector(DetectorConfig(measure_clocks=measure_clocks), now_ms=lambda: 0)
            body = produce_shaped(api_key, None)
            env = envelope_from_obj(
                {
                    "cluster": CLUSTER,
                    "node": 1,
                    "ts_ms": 1000,
                    "kind": "request",
                    "offset": None,
                    "body": body,
                }
            )
            letters = detector.ingest(env)
            pending = detector.pending_count()
            letters += detector.flush()
            events = dict(detector.counters.events)
            if api_key in READ_APIS:
                # Read: counted by name (a body not of the API's shape is its dead letter too).
                assert events.get(f"request:{API_NAMES[api_key]}") == 1, api_key
                assert "request:unchecked" not in events, api_key
                continue
            assert events == {"request:unchecked": 1}, api_key
            assert (pending, letters, detector.drain()) == (0, [], []), api_key


# -- the parser's filter ----------------------------------------------------------------


def test_the_parser_keeps_the_read_apis_and_counts_the_others_by_name() -> None:
    produce = produce_shaped(0, "PRODUCE", 1)
    fetch = produce_shaped(1, "FETCH", 2)
    lines = [
        log_line(1000, produce),
        log_line(1001, produce_shaped(12, "HEARTBEAT", 3)),
        # Wrapped over two lines: its continuation line is still accounted for.
        *(lambda text: [text[:80] + "\n", text[80:]])(log_line(1002, produce_shaped(12, "HEARTBEAT", 4))),
        log_line(1003, produce_shaped(3, "METADATA", 5)),
        log_line(1004, produce_shaped(8, None, 6)),  # OffsetCommit from a log without API names
        log_line(1005, {"requestHeader": {"clientId": "x"}}),  # names no API: the detector's dead letter
        log_line(1006, fetch),
        "[2026-11-20 10:00:00,000] INFO another logger (kafka.server)\n",
    ]
    stats = RequestLogStats()
    items = list(iter_request_log(lines, source="log", cluster=CLUSTER, node=1, stats=stats, apis=READ_APIS))

    assert all(isinstance(i, Envelope) for i in items)
    kept = [i.body for i in items if isinstance(i, Envelope)]
    assert kept == [produce, {"requestHeader": {"clientId": "x"}}, fetch]
    assert stats.unread_by_api == {"HEARTBEAT": 2, "METADATA": 1, "API key 8": 1}
    assert (stats.records, stats.unread, stats.dead_letters, stats.continuation_lines) == (3, 4, 0, 1)
    assert stats.record_lines == stats.records + stats.unread + stats.dead_letters + stats.continuation_lines
    assert stats.lines == stats.record_lines + stats.skipped_lines == 9

    everything = RequestLogStats()
    items = list(iter_request_log(lines, source="log", cluster=CLUSTER, node=1, stats=everything))
    assert len(items) == everything.records == 7 and everything.unread_by_api == {}


def test_an_entry_left_out_is_given_when_a_silence_would_cut_the_clock_evidence() -> None:
    """The detector cuts a node's clock evidence at a silence of over GAP_MS in
    its log, whatever the APIs: an entry left out that bridges such a silence
    of the read APIs is given for its time, so filtering cuts nothing more."""
    ms = [1000, 1300, 1700, 2300, 2900, 3000, 3100, 5000, 5500, 5600]
    read = {1000, 3000, 5600}
    lines = [
        log_line(t, produce_shaped(0, "PRODUCE", t) if t in read else produce_shaped(12, "HEARTBEAT", t))
        for t in ms
    ]
    stats = RequestLogStats()
    items = list(iter_request_log(lines, source="log", cluster=CLUSTER, node=1, stats=stats, apis=READ_APIS))

    given = [i.ts_ms for i in items if isinstance(i, Envelope)]
    # Greedily, the heartbeat before each entry that would come over GAP_MS after
    # the newest one given: 1700 and 2300 between the produces at 1000 and 3000,
    # 3100 and 5000 on either side of the log's own silence, none before 5600.
    assert given == [1000, 1700, 2300, 3000, 3100, 5000, 5600]
    assert (stats.records, stats.bridges, stats.unread_by_api) == (7, 4, {"HEARTBEAT": 3})

    def cuts(times: list[int]) -> list[int]:
        return [b for a, b in pairwise(times) if b - a > GAP_MS]

    assert cuts(given) == cuts(ms) == [5000]


# -- convert and replay, on a simulated cluster ---------------------------------------------


def write_request_logs(
    sim: Simulator, events: int, directory: Path, fill_ms: int | None
) -> tuple[Path, dict[int, Path], dict[int, Counter[str]]]:
    """The simulated history as each node's kafka-request.log, with entries of
    APIs no rule reads (Heartbeat, Metadata and ApiVersions in turn), and its
    other envelopes as JSONL. ``fill_ms`` None: one such entry after every
    other request, at the request's own time; else one every ``fill_ms`` of the
    node's time between its requests, so the node's log has no silence of the
    read APIs' that these do not fill. Returns the JSONL file, the logs by node,
    and the APIs added to each."""
    logs: dict[int, list[str]] = {}
    last_ms: dict[int, int] = {}
    others: list[bytes] = []
    added: dict[int, Counter[str]] = {}
    n = 0

    def add(node: int, ts_ms: int) -> None:
        nonlocal n
        n += 1
        api_key, name = UNREAD[n % len(UNREAD)]
        logs[node].append(log_line(ts_ms, produce_shaped(api_key, name, n)))
        added.setdefault(node, Counter())[name] += 1

    for i, env in enumerate(sim.events(events)):
        if env["kind"] != "request":
            others.append(orjson.dumps(env) + b"\n")
            continue
        node, ts_ms = env["node"], env["ts_ms"]
        logs.setdefault(node, [])
        if fill_ms is not None and node in last_ms:
            for gap_ms in range(last_ms[node] + fill_ms, ts_ms, fill_ms):
                add(node, gap_ms)
        logs[node].append(log_line(ts_ms, env["body"]))
        last_ms[node] = max(ts_ms, last_ms.get(node, ts_ms))
        if fill_ms is None and i % 2:
            add(node, ts_ms)
    other = directory / "other.jsonl"
    other.write_bytes(b"".join(others))
    paths = {}
    for node, lines in logs.items():
        paths[node] = directory / f"kafka-request-{node}.log"
        paths[node].write_text("".join(lines))
    return other, paths, added


def comparable(alerts_jsonl: str) -> list[dict[str, Any]]:
    """Alerts without what differs between two replays of the same events: the
    wall clock, and evidence positions (lines of the replayed files); by id,
    since judgments may be made in another order when the watermark moves
    with fewer entries."""
    alerts = []
    for line in alerts_jsonl.splitlines():
        alert = orjson.loads(line)
        alert.pop("detected_ms")
        for evidence in alert["evidence"]:
            evidence.pop("position")
        alerts.append(alert)
    return sorted(alerts, key=lambda alert: alert["alert_id"])


@pytest.mark.parametrize(
    ("events_per_second", "fill_ms", "events"),
    [(2000, None, 6000), (20, 200, 3000)],
    ids=["busy", "quiet-filled-by-heartbeats"],
)
def test_convert_keeps_the_read_apis_and_replay_raises_the_same_alerts(
    main: Any,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    events_per_second: int,
    fill_ms: int | None,
    events: int,
) -> None:
    config = SimConfig(seed=7, fault_rate=0.01, warmup_ms=1000, events_per_second=events_per_second)
    other, logs, added = write_request_logs(Simulator(config), events, tmp_path, fill_ms)
    total = Counter[str]()
    for counts in added.values():
        total += counts
    assert set(total) == {"HEARTBEAT", "METADATA", "API_VERSIONS"}

    converted: dict[str, list[Path]] = {"filtered": [], "all": []}
    bridges = 0
    for node, log in sorted(logs.items()):
        lines = log.read_text().splitlines()
        for mode, extra in (("filtered", []), ("all", ["--all-apis"])):
            argv = ["convert", "request-log", "--cluster", CLUSTER, "--node", str(node), *extra, str(log)]
            assert main(argv) == 0
            out, err = capsys.readouterr()
            heads = [orjson.loads(line)["body"]["requestHeader"] for line in out.splitlines()]
            by_api = ", ".join(
                f"{k}={n}" for k, n in sorted(Counter(h["requestApiKeyName"] for h in heads).items())
            )
            head = f"fencewatch convert request-log: 1 file(s), {len(lines)} lines: "
            head += f"{len(heads)} records ({by_api}), "
            assert err.startswith(head), err
            if mode == "all":
                assert len(heads) == len(lines)
                assert "left out" not in err
            else:
                # Every read entry, and of the others only those given for their time.
                given = Counter(h["requestApiKeyName"] for h in heads if h["requestApiKey"] not in READ_APIS)
                assert len(heads) - given.total() == len(lines) - added.get(node, Counter()).total()
                dropped = added.get(node, Counter()) - given
                by_api = sorted(dropped.items(), key=lambda kv: (-kv[1], kv[0]))
                account = []
                if dropped:
                    counts = ", ".join(f"{name}={n}" for name, n in by_api)
                    account.append(f"left out, no rule reads their API: {dropped.total()} entries ({counts})")
                if given:
                    account.append(
                        f"given for their time alone: {given.total()} (a silence over 1000 ms without them)"
                    )
                if account:
                    assert err.rstrip().endswith(f"; {'; '.join(account)}; --all-apis keeps them"), err
                else:
                    assert "--all-apis" not in err, err
                bridges += given.total()
            path = tmp_path / f"{mode}-{node}.jsonl"
            path.write_text(out)
            converted[mode].append(path)
    # The busy cluster's read APIs are never silent for a second; the quiet one's are.
    assert (bridges > 0) is (fill_ms is not None)

    replays = {}
    for mode, paths in converted.items():
        assert main(["replay", str(other), *map(str, paths)]) == 0
        replays[mode] = capsys.readouterr()
    filtered, everything = comparable(replays["filtered"].out), comparable(replays["all"].out)
    assert filtered, "the history raised no alert: nothing was compared"
    assert filtered == everything
    # The detector still counts what it does not read, when it is given it: every
    # entry but those that came too late to judge (counted apart, whatever their API).
    for mode, given in (("all", total.total()), ("filtered", bridges)):
        err = replays[mode].err
        counted = [
            int(line.split()[1]) for line in err.splitlines() if line.split()[:1] == ["request:unchecked"]
        ]
        too_late = int(err.rsplit(" too late to judge", 1)[0].rsplit(" ", 1)[1])
        if given:
            assert len(counted) == 1 and 0 <= given - counted[0] <= too_late, err
        else:
            assert counted == [], err


def test_a_log_of_unread_apis_only_gives_no_output_and_says_why(
    main: Any, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    log = tmp_path / "kafka-request.log"
    log.write_text("".join(log_line(1000 + i, produce_shaped(12, "HEARTBEAT", i)) for i in range(3)))
    assert main(["convert", "request-log", "--node", "1", str(log)]) == 0
    out, err = capsys.readouterr()
    assert out == ""
    assert err.strip() == (
        "fencewatch convert request-log: 1 file(s), 3 lines: 0 records, 0 dead letters, "
        "0 continuation lines of multi-line entries; skipped: 0 other-logger lines, 0 blank lines, "
        "0 lines before any log4j entry; left out, no rule reads their API: 3 entries "
        "(HEARTBEAT=3); --all-apis keeps them"
    )


def test_all_apis_is_for_request_logs_only(main: Any, capsys: pytest.CaptureFixture[str]) -> None:
    dump = Path(__file__).resolve().parents[1] / "data" / "metadata.dump"
    assert main(["convert", "metadata-dump", "--all-apis", str(dump)]) == 2
    assert "--all-apis applies to request-log only" in capsys.readouterr().err
