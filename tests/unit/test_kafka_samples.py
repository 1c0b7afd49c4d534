"""The samples are Kafka's own: what a real Apache Kafka 4.4.0 cluster wrote
(``tests/data/native/kafka-4.4.0-cluster/``, by tests/data/make_kafka_samples.py)
is read without a dead letter, and every hand-made sample that holds
deliberate violations has the shape of Kafka's file of the same kind: the same
line forms, and no key Kafka does not write (tests/data/README.md says which
file is checked against which).
"""

from __future__ import annotations

import gzip
import json
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from detectors.envelope import Envelope
from detectors.parse_request_log import RequestLogStats, iter_request_log

DATA = Path(__file__).resolve().parents[1] / "data"
REAL = DATA / "native" / "kafka-4.4.0-cluster"
REAL_LOGS = sorted((REAL / "request-logs").glob("*.log"))
HAND_REQUEST_LOGS = [DATA / "request.log", DATA / "e2e" / "broker-1-request.log"]
HAND_DUMPS = [
    DATA / "metadata.dump",
    DATA / "e2e" / "metadata.dump",
    DATA / "native" / "metadata-leader-change.dump",
]
REAL_DUMPS = [
    REAL / "metadata" / "00000000000000000000.log.dump.gz",
    DATA / "native" / "kafka-4.4.0" / "00000000000000000000.log.dump.gz",
    DATA / "native" / "kafka-4.4.0" / "00000000000000000000-0000000000.checkpoint.dump",
    *sorted((REAL / "metadata").glob("*.checkpoint.dump.gz")),
]

# Kafka's request-log line (RequestChannel's "Completed request:" at DEBUG,
# with the log4j pattern Kafka ships, "[%d] %p %m (%c)%n").
REQUEST_LINE = re.compile(
    r"\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3})\] DEBUG Completed request:(\{.*\}) \(kafka\.request\.logger\)"
)
# Keys the hand-made samples carry on purpose though no released Kafka writes
# them: KIP-359 (a proposal) puts the leader epoch in Produce, and the rules
# judge it where a broker logs it (detectors/rules/produce.py).
PROPOSAL_KEYS = {("PRODUCE", "request.topicData[].partitionData[].currentLeaderEpoch")}
# APIs of ZooKeeper-era clusters: a KRaft broker of 4.x neither sends nor serves them.
ZK_ERA_APIS = {"LEADER_AND_ISR", "STOP_REPLICA", "UPDATE_METADATA", "CONTROLLED_SHUTDOWN"}


def node_of(path: Path) -> int:
    return int(path.stem.rsplit("-", 1)[1])


def request_texts(path: Path) -> list[str]:
    """The request entries of a log, each as one line: an entry wrapped over
    several physical lines (``request.log`` wraps one on purpose, which
    Kafka's one-line JSON never does) is joined up to its logger suffix."""
    entries: list[str] = []
    wrapped: list[str] | None = None
    for line in path.read_text().splitlines():
        if wrapped is not None:
            wrapped.append(line)
        elif "Completed request:" in line:
            wrapped = [line]
        if wrapped is not None and line.endswith("(kafka.request.logger)"):
            entries.append("".join(wrapped))
            wrapped = None
    return entries


def request_entries(path: Path) -> Iterator[dict[str, Any]]:
    for text in request_texts(path):
        match = REQUEST_LINE.fullmatch(text)
        if match is not None:
            yield json.loads(match.group(2))


def key_paths(obj: Any, prefix: str = "") -> set[str]:
    """Every key path of a JSON value (``request.topicData[].partitionData[].index``)."""
    if isinstance(obj, dict):
        out = set()
        for key, value in obj.items():
            out.add(prefix + key)
            out |= key_paths(value, f"{prefix}{key}.")
        return out
    if isinstance(obj, list):
        return set().union(*(key_paths(item, prefix.rstrip(".") + "[].") for item in obj)) if obj else set()
    return set()


def api(entry: dict[str, Any]) -> tuple[str, int]:
    return entry["requestHeader"]["requestApiKeyName"], entry["requestHeader"]["requestApiVersion"]


def test_the_real_samples_are_there():
    assert len(REAL_LOGS) == 6, "three controllers and three brokers"
    assert (REAL / "remote-log-metadata.jsonl").exists() and (REAL / "remote-log-metadata.txt").exists()


# -- the real request logs: every entry a record, every API accounted for -----------


@pytest.mark.parametrize("path", REAL_LOGS, ids=lambda p: p.stem)
def test_every_entry_of_a_real_request_log_is_a_record(path: Path):
    stats = RequestLogStats()
    items = list(
        iter_request_log(
            path.read_bytes().splitlines(), source=path.name, cluster="real", node=node_of(path), stats=stats
        )
    )
    assert stats.dead_letters == 0, [i for i in items if not isinstance(i, Envelope)][:2]
    assert stats.records == stats.lines == len(items)
    assert sum(stats.records_by_api.values()) == stats.records
    # The trimmed file keeps every API the node logged in the whole run.
    served = json.loads((REAL / "request-apis.json").read_text())[path.stem]
    assert set(stats.records_by_api) == set(served)


def test_convert_all_apis_accounts_for_every_line_of_every_node_by_api():
    """`fencewatch convert request-log --all-apis` as an operator runs it, per node."""
    for path in REAL_LOGS:
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "fencewatch",
                "convert",
                "request-log",
                "--all-apis",
                "--cluster",
                "real",
                "--node",
                str(node_of(path)),
                str(path),
            ],
            capture_output=True,
            text=True,
            check=False,
            timeout=120,
        )
        assert done.returncode == 0, done.stderr
        lines = len(path.read_text().splitlines())
        summary = done.stderr.strip().splitlines()[-1]
        match = re.search(r"(\d+) lines: (\d+) records \(([^)]*)\), (\d+) dead letters", summary)
        assert match is not None, summary
        total, records, by_api, dead = match.groups()
        counts = dict(pair.split("=") for pair in by_api.split(", "))
        assert int(total) == int(records) == lines and int(dead) == 0, summary
        assert sum(int(n) for n in counts.values()) == lines
        assert len(done.stdout.splitlines()) == lines


def test_the_run_served_the_apis_of_producers_groups_transactions_admin_and_the_quorum():
    served = set().union(*json.loads((REAL / "request-apis.json").read_text()).values())
    for wanted in (
        "PRODUCE",
        "FETCH",
        "LIST_OFFSETS",
        "METADATA",
        "OFFSET_COMMIT",
        "OFFSET_FETCH",
        "FIND_COORDINATOR",
        "JOIN_GROUP",
        "SYNC_GROUP",
        "HEARTBEAT",
        "LEAVE_GROUP",
        "CONSUMER_GROUP_HEARTBEAT",
        "SHARE_GROUP_HEARTBEAT",
        "SHARE_FETCH",
        "SHARE_ACKNOWLEDGE",
        "INIT_PRODUCER_ID",
        "ADD_PARTITIONS_TO_TXN",
        "ADD_OFFSETS_TO_TXN",
        "TXN_OFFSET_COMMIT",
        "END_TXN",
        "WRITE_TXN_MARKERS",
        "CREATE_TOPICS",
        "DELETE_TOPICS",
        "CREATE_PARTITIONS",
        "DESCRIBE_CONFIGS",
        "INCREMENTAL_ALTER_CONFIGS",
        "ALTER_PARTITION_REASSIGNMENTS",
        "LIST_PARTITION_REASSIGNMENTS",
        "ELECT_LEADERS",
        "DELETE_RECORDS",
        "OFFSET_FOR_LEADER_EPOCH",
        "ALTER_PARTITION",
        "BROKER_REGISTRATION",
        "BROKER_HEARTBEAT",
        "VOTE",
        "BEGIN_QUORUM_EPOCH",
        "DESCRIBE_QUORUM",
    ):
        assert wanted in served, wanted


# -- hand-made samples in Kafka's shape ------------------------------------------------


def real_request_paths() -> dict[str, set[str]]:
    """Per API name, every key path Kafka wrote in its entries of the real run."""
    by_name: dict[str, set[str]] = {}
    for path in REAL_LOGS:
        for entry in request_entries(path):
            by_name.setdefault(api(entry)[0], set()).update(key_paths(entry))
    return by_name


@pytest.mark.parametrize("path", REAL_LOGS + HAND_REQUEST_LOGS, ids=lambda p: p.name)
def test_every_request_entry_has_kafkas_line_form(path: Path):
    entries = request_texts(path)
    assert entries
    bad = [text for text in entries if not REQUEST_LINE.fullmatch(text)]
    assert not bad, bad[0][:300]
    if path in REAL_LOGS:  # Kafka writes each entry on one line
        assert len(entries) == len(path.read_text().splitlines())


@pytest.mark.parametrize("path", HAND_REQUEST_LOGS, ids=lambda p: p.name)
def test_hand_made_request_entries_use_only_keys_kafka_writes(path: Path):
    by_name = real_request_paths()
    checked = 0
    for entry in request_entries(path):
        name, version = api(entry)
        if name in ZK_ERA_APIS:
            assert name not in by_name, f"Kafka 4.4 served {name}: check its shape too"
            continue
        # Kafka wrote the same API at the versions its clients chose: the
        # keys of all of them (a replica fetch here may use another version).
        real = by_name.get(name)
        assert real is not None, f"{path.name}: no real {name} entry to check against"
        extra = key_paths(entry) - real - {key for api_name, key in PROPOSAL_KEYS if api_name == name}
        assert not extra, f"{path.name}: {name} v{version} has keys Kafka 4.4 does not write: {sorted(extra)}"
        checked += 1
    assert checked


def dump_lines(path: Path) -> list[str]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as fh:
        return fh.read().splitlines()


def keys_of(line: str) -> list[str]:
    """The ``name:`` keys of a DumpLogSegments batch or record line, in order, up to the record itself."""
    head = line.split(" headerKeys: ")[0] if line.startswith("| ") else line
    return re.findall(r"(\w+): ", head)


def dump_forms(paths: list[Path]) -> tuple[set[tuple[str, ...]], set[str], dict[str, set[str]]]:
    """(batch and record line key sequences, control record prefixes, payload key paths by record type)."""
    forms: set[tuple[str, ...]] = set()
    controls: set[str] = set()
    payloads: dict[str, set[str]] = {}
    for path in paths:
        for line in dump_lines(path):
            if line.startswith(("baseOffset: ", "| offset: ")):
                forms.add(tuple(keys_of(line)))
            if line.startswith("| offset: "):
                rest = line.split(" headerKeys: [] ", 1)[1]
                if rest.startswith("payload: "):
                    body = json.loads(rest[len("payload: ") :])
                    payloads.setdefault(body["type"], set()).update(key_paths(body))
                else:
                    controls.add(rest.split("{", 1)[0])
    return forms, controls, payloads


@pytest.mark.parametrize("path", HAND_DUMPS, ids=lambda p: p.name)
def test_hand_made_dumps_have_the_line_forms_of_kafkas_dump_tool(path: Path):
    real_forms, real_controls, real_payloads = dump_forms(REAL_DUMPS)
    forms, controls, payloads = dump_forms([path])
    assert forms and forms <= real_forms, forms - real_forms
    assert controls <= real_controls, controls - real_controls
    for record_type, paths in payloads.items():
        assert record_type in real_payloads, f"no real {record_type} to check against"
        extra = paths - real_payloads[record_type]
        assert not extra, f"{path.name}: {record_type} has keys Kafka 4.4 does not write: {sorted(extra)}"
    for line in dump_lines(path):
        assert line.startswith(
            ("Dumping ", "Log starting offset: ", "Snapshot end offset: ", "baseOffset: ", "| offset: ")
        ), line


def real_quorum_states() -> dict[int, set[str]]:
    out: dict[int, set[str]] = {}
    for path in sorted(REAL.glob("quorum-state-*")):
        state = json.loads(path.read_text())
        out.setdefault(state["data_version"], set()).update(key_paths(state))
    return out


@pytest.mark.parametrize("name", ["quorum-state-v0.json", "quorum-state-v1.json"])
def test_hand_made_quorum_states_have_the_keys_kafka_writes(name: str):
    state = json.loads((DATA / "native" / name).read_text())
    real = real_quorum_states()
    version = state["data_version"]
    if version not in real:
        pytest.skip(f"Kafka 4.4.0's controllers here wrote data_version {sorted(real)} only")
    assert key_paths(state) <= real[version]
    # A file of one JSON object and no newline, as FileQuorumStateStore writes it.
    assert not (DATA / "native" / name).read_bytes().endswith(b"\n")


def remote_forms(path: Path) -> dict[str, tuple[str, ...]]:
    """Per value form (RemoteLogSegmentMetadata...), its field names in order."""
    forms: dict[str, tuple[str, ...]] = {}
    for line in path.read_text().splitlines():
        match = re.fullmatch(r"partition: \d+, offset: \d+, value: (\w+)\{(.*)\}", line)
        if match is None:
            continue
        names = tuple(
            re.findall(
                r"(?:^|, )(\w+)=", re.sub(r"\{[^{}]*\}", "{}", re.sub(r"\{[^{}]*\}", "{}", match.group(2)))
            )
        )
        assert forms.setdefault(match.group(1), names) == names, line
    return forms


@pytest.mark.parametrize("name", ["remote-log-metadata.txt", "remote-log-metadata-lifecycle.txt"])
def test_hand_made_remote_log_metadata_has_the_formatters_forms(name: str):
    real = remote_forms(REAL / "remote-log-metadata.txt")
    hand = remote_forms(DATA / "native" / name)
    for form, names in hand.items():
        if form not in real:
            assert form == "RemotePartitionDeleteMetadata", form
            continue
        assert names == real[form], form


def test_replay_of_every_real_sample_gives_no_alert_and_no_dead_letter(tmp_path: Path):
    """Kafka's own files of one run, converted as an operator converts them and
    replayed together: fencing worked, so nothing is raised, and nothing is
    unreadable."""

    def convert(fmt: str, *args: str) -> Path:
        out = tmp_path / f"{len(list(tmp_path.iterdir()))}.jsonl"
        with open(out, "wb") as fh:
            done = subprocess.run(
                [sys.executable, "-m", "fencewatch", "convert", fmt, "--cluster", "real", *args],
                stdout=fh,
                stderr=subprocess.PIPE,
                text=False,
                check=False,
                timeout=120,
            )
        assert done.returncode == 0, done.stderr
        assert b" 0 dead letters" in done.stderr, done.stderr
        return out

    segment = tmp_path / "00000000000000000000.log"
    segment.write_bytes(gzip.decompress((REAL / "metadata" / "00000000000000000000.log.gz").read_bytes()))
    files = [convert("metadata-log", str(segment))]
    files += [convert("request-log", "--all-apis", "--node", str(node_of(p)), str(p)) for p in REAL_LOGS]
    files += [
        convert("quorum-state", "--node", p.name.rsplit("-", 1)[1], str(p))
        for p in REAL.glob("quorum-state-*")
    ]
    files.append(convert("remote-log-metadata", str(REAL / "remote-log-metadata.txt")))
    done = subprocess.run(
        [sys.executable, "-m", "fencewatch", "replay", "--no-progress", *map(str, files)],
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == "", done.stdout[:2000]
    assert "0 dead letters" in done.stderr.splitlines()[-1]
    assert re.search(r"alerts: 0 violations and 0 resolutions", done.stderr)
