"""LeaderChange control records of the metadata log fed to the KIP-595 quorum
rules (issue 11, item 2): detectors/parse_metadata_dump.py reads both forms
``kafka-dump-log.sh --cluster-metadata-decoder`` prints, and
detectors/rules/quorum.py judges them.

``tests/data/native/metadata-leader-change.dump`` is the log as a Kafka 4.1+
tool prints it (``LeaderChange: {json}``); :func:`as_printed_before_4_1`
rewrites it as a tool up to Kafka 4.0 prints it (``controlType:
LEADER_CHANGE(2)``, no leader). Its story, controllers 3000, 3001, 3002:

- offset 0, epoch 1: 3000 leads; offsets 1-2: metadata records;
- offset 3, epoch 2: 3001 leads (epochs rising: fine); offset 4: a record;
- offset 5, epoch 2: 3002 claims epoch 2 too: QUORUM_TWO_LEADERS_IN_EPOCH, and
  3002 is among the granting voters of both 3001 (offset 3) and itself:
  QUORUM_DOUBLE_VOTE;
- offset 6, epoch 3: 3000 leads; offset 7: a record;
- offset 8, epoch 2: 3001 again, after epoch 3: QUORUM_EPOCH_REGRESSION (1 s
  after epoch 3 began, within the grace window, so no zombie-leader alert).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import orjson
import pytest

from detectors.buckets import Bucket, buckets_of
from detectors.engine import Detector
from detectors.envelope import DeadLetter, DeadLetterClass, Envelope, envelope_from_obj
from detectors.parse_metadata_dump import MetadataDumpStats, iter_metadata_dump
from producers import shapes as s
from tests.unit.test_end_to_end_native import fencewatch

NATIVE = Path(__file__).resolve().parents[1] / "data" / "native"
DUMP = NATIVE / "metadata-leader-change.dump"
QUORUM_STATE_V0 = NATIVE / "quorum-state-v0.json"  # controller 1 as leader of epoch 7
CLUSTER = "prod-eu-1"
T0 = 1795169580000  # 2026-11-20T10:13:00Z, the dump's first record
VOTERS = [1, 2, 3]

# (rule, node, ts_ms) of the dump's violations, as each form can show them.
JSON_FORM_ALERTS = [
    ("QUORUM_TWO_LEADERS_IN_EPOCH", 3002, T0 + 70_000),
    ("QUORUM_DOUBLE_VOTE", 3002, T0 + 70_000),
    ("QUORUM_EPOCH_REGRESSION", 3001, T0 + 121_000),
]
TYPE_ONLY_ALERTS = [("QUORUM_EPOCH_REGRESSION", None, T0 + 121_000)]


def as_printed_before_4_1(text: str) -> str:
    """The dump as DumpLogSegments.scala (Kafka 4.0 and before) prints it: the
    default case of its control-record match, type name and id only."""
    return re.sub(r" LeaderChange: \{.*\}$", " controlType: LEADER_CHANGE(2)", text, flags=re.M)


def parse(text: str, stats: MetadataDumpStats | None = None) -> list[Envelope | DeadLetter]:
    return list(iter_metadata_dump(text.encode().splitlines(), source="d", cluster=CLUSTER, stats=stats))


def batch(base: int, epoch: int, ts_ms: int, count: int = 1, control: bool = True) -> str:
    return (
        f"baseOffset: {base} lastOffset: {base + count - 1} count: {count} baseSequence: -1 lastSequence: -1 "
        f"producerId: -1 producerEpoch: -1 partitionLeaderEpoch: {epoch} isTransactional: false "
        f"isControl: {str(control).lower()} deleteHorizonMs: OptionalLong.empty position: 0 "
        f"CreateTime: {ts_ms} size: 118 magic: 2 compresscodec: none crc: 1 isvalid: true"
    )


def record(offset: int, ts_ms: int, tail: str) -> str:
    return (
        f"| offset: {offset} CreateTime: {ts_ms} keySize: 4 valueSize: 33 sequence: -1 headerKeys: []{tail}"
    )


def printed(leader: int) -> str:
    """A LeaderChange as Kafka 4.1+ prints it (LeaderChangeMessageJsonConverter)."""
    voters = [{"voterId": v} for v in VOTERS]
    message = {"version": 0, "leaderId": leader, "voters": voters, "grantingVoters": voters[:2]}
    return " LeaderChange: " + orjson.dumps(message).decode()


def leader_change(offset: int, ts_ms: int, epoch: int, leader: int | None) -> dict[str, Any]:
    """A LeaderChange envelope as the parser makes it (leader None: the pre-4.1 form)."""
    data: dict[str, Any] = {}
    if leader is not None:
        voters = [{"voterId": v} for v in VOTERS]
        # Its own vote only: two leaders of an epoch then need no voter to vote twice.
        data = {"version": 0, "leaderId": leader, "voters": voters, "grantingVoters": [{"voterId": leader}]}
    body = {"type": "LEADER_CHANGE", "partitionLeaderEpoch": epoch, "data": data}
    return s.envelope(CLUSTER, "metadata", ts_ms, body, offset=offset)


def keys(detector: Detector) -> list[tuple[str, int | None, int]]:
    return [(a.rule, a.node, a.ts_ms) for a in detector.drain()]


def parse_envelopes(raws: list[dict[str, Any]], first: int = 0) -> list[Envelope]:
    return [envelope_from_obj(raw, f"t:{first + n}", first + n) for n, raw in enumerate(raws)]


def run(raws: list[dict[str, Any]]) -> Detector:
    """A fresh detector fed ``raws`` in order and flushed; none may be dead-lettered."""
    detector = Detector(now_ms=lambda: 0)
    for env in parse_envelopes(raws):
        assert detector.ingest(env) == []
    assert detector.flush() == []
    return detector


# ---- parsing both printed forms ---------------------------------------------------------------


def test_kafka_4_1_form_becomes_an_envelope_with_leader_voters_and_the_batch_epoch():
    stats = MetadataDumpStats()
    items = parse(DUMP.read_text(), stats)

    envelopes = [i for i in items if isinstance(i, Envelope)]
    assert len(envelopes) == len(items)
    changes = [e for e in envelopes if e.body["type"] == "LEADER_CHANGE"]
    assert [(e.offset, e.body["partitionLeaderEpoch"], e.body["data"]["leaderId"]) for e in changes] == [
        (0, 1, 3000),
        (3, 2, 3001),
        (5, 2, 3002),
        (6, 3, 3000),
        (8, 2, 3001),
    ]
    first = changes[0]
    assert first.to_dict() == {
        "cluster": CLUSTER,
        "node": None,
        "ts_ms": T0,
        "kind": "metadata",
        "offset": 0,
        "body": {
            "type": "LEADER_CHANGE",
            "partitionLeaderEpoch": 1,
            "data": {
                "version": 0,
                "leaderId": 3000,
                "voters": [{"voterId": 3000}, {"voterId": 3001}, {"voterId": 3002}],
                "grantingVoters": [{"voterId": 3000}, {"voterId": 3001}],
            },
        },
    }
    # Every record of the log is an envelope now; nothing is skipped as a control record.
    assert [e.offset for e in envelopes] == list(range(9))
    assert (stats.records, stats.dead_letters, stats.control_records) == (9, 0, 0)
    assert stats.lines == stats.records + stats.dead_letters + stats.control_records + stats.other_lines


def test_pre_4_1_form_carries_the_epoch_and_no_leader():
    items = parse(as_printed_before_4_1(DUMP.read_text()))

    changes = [i for i in items if isinstance(i, Envelope) and i.body["type"] == "LEADER_CHANGE"]
    assert [(e.offset, e.ts_ms, e.body) for e in changes[:1]] == [
        (0, T0, {"type": "LEADER_CHANGE", "partitionLeaderEpoch": 1, "data": {}})
    ]
    assert [e.body["partitionLeaderEpoch"] for e in changes] == [1, 2, 2, 3, 2]


def test_other_control_records_are_still_counted_and_skipped():
    stats = MetadataDumpStats()
    lines = [
        batch(0, 1, T0, count=3),
        record(0, T0, printed(1)),
        record(1, T0, ' KRaftVersion {"version":0,"kRaftVersion":1}'),
        record(2, T0, " controlType: SOMETHING_NEW(9)"),
    ]
    items = parse("\n".join(lines), stats)
    assert [i.body["type"] for i in items if isinstance(i, Envelope)] == ["LEADER_CHANGE"]
    assert stats.control_records_by_type == {"KRAFT_VERSION": 1, "SOMETHING_NEW": 1}


def test_a_leader_change_in_a_snapshot_has_no_log_offset_and_is_skipped():
    stats = MetadataDumpStats()
    lines = [
        "Dumping /k/__cluster_metadata-0/00000000000000000010-0000000001.checkpoint",
        "Snapshot end offset: 10, epoch: 1",
        batch(0, 1, T0),
        record(0, T0, printed(1)),
    ]
    assert parse("\n".join(lines), stats) == []
    assert stats.control_records_by_type == {"LEADER_CHANGE": 1}


@pytest.mark.parametrize(
    ("lines", "kind", "reason"),
    [
        ([record(0, T0, printed(1))], DeadLetterClass.INVALID, "partitionLeaderEpoch"),
        (
            [batch(0, 1, T0), record(0, T0, ' LeaderChange: {"version":0,')],
            DeadLetterClass.MALFORMED_JSON,
            "JSON",
        ),
        ([batch(0, 1, T0), record(0, T0, " LeaderChange: [1]")], DeadLetterClass.WRONG_TYPE, "object"),
    ],
    ids=["no batch header", "truncated JSON", "not an object"],
)
def test_an_unusable_leader_change_is_a_dead_letter(lines, kind, reason):
    (letter,) = parse("\n".join(lines))
    assert isinstance(letter, DeadLetter) and letter.kind is kind and reason in letter.reason


# ---- the rules ------------------------------------------------------------------------------------


@pytest.mark.violation("QUORUM_TWO_LEADERS_IN_EPOCH")
def test_a_second_leader_claimed_for_an_epoch_is_flagged():
    detector = run([leader_change(10, 1000, 5, 1), leader_change(11, 1500, 5, 2)])
    assert keys(detector) == [("QUORUM_TWO_LEADERS_IN_EPOCH", 2, 1500)]


@pytest.mark.violation("QUORUM_TWO_LEADERS_IN_EPOCH")
def test_a_quorum_state_contradicting_the_leader_change_is_flagged():
    other = s.envelope(CLUSTER, "quorum_state", 1500, s.quorum_state(2, 5, 2, VOTERS), node=2)
    detector = run([leader_change(10, 1000, 5, 1), other])
    assert keys(detector) == [("QUORUM_TWO_LEADERS_IN_EPOCH", 2, 1500)]


@pytest.mark.violation("QUORUM_EPOCH_REGRESSION")
@pytest.mark.parametrize(("leader", "node"), [(2, 2), (None, None)], ids=["kafka-4.1-form", "type-only-form"])
def test_an_epoch_going_backwards_in_the_log_is_flagged(leader, node):
    detector = run([leader_change(10, 1000, 5, 1), leader_change(11, 1200, 4, leader)])
    alerts = detector.drain()
    assert [(a.rule, a.node, a.ts_ms) for a in alerts] == [("QUORUM_EPOCH_REGRESSION", node, 1200)]
    assert [e.offset for e in alerts[0].evidence] == [10, 11]


def test_every_leader_change_below_the_highest_epoch_is_a_regression():
    changes = [leader_change(10, 1000, 5, 1), leader_change(11, 1100, 3, 2), leader_change(12, 1200, 4, 2)]
    detector = run(changes)
    assert keys(detector) == [("QUORUM_EPOCH_REGRESSION", 2, 1100), ("QUORUM_EPOCH_REGRESSION", 2, 1200)]


def test_rising_epochs_and_the_same_leader_announced_again_raise_nothing():
    followers = [
        s.envelope(CLUSTER, "quorum_state", 1100, s.quorum_state(1, 5, 1, VOTERS), node=n) for n in VOTERS
    ]
    changes = [
        leader_change(10, 1000, 5, 1),
        leader_change(11, 1050, 5, 1),  # the same leader again in its epoch
        leader_change(20, 9000, 6, 2),
        leader_change(30, 20000, 8, 3),  # an epoch may be skipped (an election nobody won)
    ]
    detector = run([*changes[:2], *followers, *changes[2:]])
    assert keys(detector) == []


def test_type_only_leader_changes_raise_nothing_false():
    """Before Kafka 4.1 the dump names no leader: two LeaderChanges in one epoch,
    or one beside any quorum state, prove nothing."""
    states = [
        s.envelope(CLUSTER, "quorum_state", 1100, s.quorum_state(1, 5, 1, VOTERS), node=1),
        s.envelope(CLUSTER, "quorum_state", 9100, s.quorum_state(2, 6, 2, VOTERS), node=2),
    ]
    changes = [
        leader_change(10, 1000, 5, None),
        leader_change(11, 1050, 5, None),
        leader_change(20, 9000, 6, None),
    ]
    detector = run([changes[0], changes[1], states[0], changes[2], states[1]])
    assert keys(detector) == []


def test_the_log_is_judged_in_offset_order_whatever_the_arrival_order():
    changes = parse_envelopes([leader_change(10, 1000, 5, 1), leader_change(11, 1200, 4, 2)])
    for order in (changes, changes[::-1]):
        detector = Detector(now_ms=lambda: 0)
        for env in order:
            detector.ingest(env)
        detector.flush()
        assert keys(detector) == [("QUORUM_EPOCH_REGRESSION", 2, 1200)]


def test_a_redelivered_leader_change_is_a_duplicate_and_judged_once():
    raws = [leader_change(10, 1000, 5, 1), leader_change(11, 1500, 5, 2), leader_change(12, 1600, 4, 2)]
    first = parse_envelopes(raws)
    again = parse_envelopes(raws, first=len(raws))  # the same records, read again elsewhere
    detector = Detector(now_ms=lambda: 0)
    for env in [first[0], again[0], first[1], first[2], again[1], again[2]]:
        assert detector.ingest(env) == []
    detector.flush()
    assert keys(detector) == [
        ("QUORUM_EPOCH_REGRESSION", 2, 1600),
        ("QUORUM_TWO_LEADERS_IN_EPOCH", 2, 1500),
    ]
    assert detector.counters.duplicates == 3


def test_buckets_judge_a_leader_change_once_in_bucket_0():
    """It is fanned out like every cluster-wide metadata record: each bucket
    takes its offset, only its home, bucket 0, judges it."""
    envs = parse_envelopes([leader_change(10, 1000, 5, 1), leader_change(11, 1500, 5, 2)])
    count = 4
    assert {buckets_of(env, count) for env in envs} == {(0, 1, 2, 3)}
    detectors = [Detector(now_ms=lambda: 0, bucket=Bucket(i, count)) for i in range(count)]
    for env in envs:
        for b in buckets_of(env, count):
            assert detectors[b].ingest(env, home=b == 0) == []
    alerts = []
    for detector in detectors:
        detector.flush()
        alerts.append(keys(detector))
    assert alerts == [[("QUORUM_TWO_LEADERS_IN_EPOCH", 2, 1500)], [], [], []]
    assert [d.counters.events.get("metadata", 0) for d in detectors] == [2, 0, 0, 0]


# ---- convert, then replay -------------------------------------------------------------------------


def convert_and_replay(dump: Path, tmp_path: Path, *extra: Path) -> list[dict[str, Any]]:
    converted = fencewatch("convert", "metadata-dump", "--cluster", CLUSTER, dump, cwd=tmp_path)
    assert converted.returncode == 0, converted.stderr
    assert " 0 dead letters" in converted.stderr
    (tmp_path / "metadata.jsonl").write_text(converted.stdout)
    replayed = fencewatch("replay", "--no-progress", "metadata.jsonl", *extra, cwd=tmp_path)
    assert replayed.returncode == 0, replayed.stderr
    return [orjson.loads(line) for line in replayed.stdout.splitlines()]


@pytest.mark.parametrize(
    ("form", "expected"),
    [("kafka-4.1", JSON_FORM_ALERTS), ("before-4.1", TYPE_ONLY_ALERTS)],
)
def test_converted_dump_replays_to_the_violations_its_form_shows(tmp_path, form, expected):
    dump = DUMP
    if form == "before-4.1":
        dump = tmp_path / "old.dump"
        dump.write_text(as_printed_before_4_1(DUMP.read_text()))
    alerts = convert_and_replay(dump, tmp_path)
    assert [(a["rule"], a["node"], a["ts_ms"]) for a in alerts] == expected
    assert {(a["cluster"], a["severity"], a["status"]) for a in alerts} == {(CLUSTER, "critical", "firing")}


def test_converted_leader_change_and_quorum_state_file_agreeing_raise_nothing(tmp_path):
    """Controller 1's LeaderChange for epoch 7, then its quorum-state file
    (tests/data/native/quorum-state-v0.json) saying the same."""
    ts = 1795168800000
    dump = tmp_path / "epoch7.dump"
    dump.write_text("\n".join(["Log starting offset: 40", batch(40, 7, ts), record(40, ts, printed(1))]))
    state = fencewatch(
        "convert",
        "quorum-state",
        "--cluster",
        CLUSTER,
        "--node",
        "1",
        "--ts-ms",
        str(ts + 500),
        QUORUM_STATE_V0,
        cwd=tmp_path,
    )
    assert state.returncode == 0, state.stderr
    (tmp_path / "state.jsonl").write_text(state.stdout)
    assert convert_and_replay(dump, tmp_path, Path("state.jsonl")) == []


# ---- the voter set and the granting voters (issue 24, item 5) ---------------------------------


def granting(
    offset: int, ts_ms: int, epoch: int, leader: int, voters: list[int], granted: list[int]
) -> dict[str, Any]:
    """A LeaderChange naming its voter set and the voters that elected ``leader``."""
    data = {
        "version": 0,
        "leaderId": leader,
        "voters": [{"voterId": v} for v in voters],
        "grantingVoters": [{"voterId": v} for v in granted],
    }
    body = {"type": "LEADER_CHANGE", "partitionLeaderEpoch": epoch, "data": data}
    return s.envelope(CLUSTER, "metadata", ts_ms, body, offset=offset)


def vote(ts_ms: int, voter: int, candidate: int, epoch: int, *, pre_vote: bool = False) -> dict[str, Any]:
    return s.envelope(
        CLUSTER, "request", ts_ms, s.vote(candidate, epoch, True, pre_vote=pre_vote), node=voter
    )


@pytest.mark.violation("QUORUM_DOUBLE_VOTE")
def test_a_granting_voter_of_two_leaders_in_one_epoch_voted_twice():
    detector = run([granting(10, 1000, 5, 1, VOTERS, [1, 2]), granting(11, 1500, 5, 3, VOTERS, [2, 3])])
    assert sorted(keys(detector)) == [
        ("QUORUM_DOUBLE_VOTE", 2, 1500),
        ("QUORUM_TWO_LEADERS_IN_EPOCH", 3, 1500),
    ]


@pytest.mark.violation("QUORUM_DOUBLE_VOTE")
def test_a_granting_voter_that_also_granted_a_vote_request_to_another_candidate_voted_twice():
    detector = run([vote(900, 2, 3, 5), granting(10, 1000, 5, 1, VOTERS, [1, 2])])
    assert keys(detector) == [("QUORUM_DOUBLE_VOTE", 2, 1000)]


@pytest.mark.parametrize(
    "raws",
    [
        pytest.param(
            [granting(10, 1000, 5, 1, VOTERS, [1, 2]), granting(11, 5000, 6, 3, VOTERS, [2, 3])],
            id="the-same-voter-in-different-epochs",
        ),
        pytest.param(
            [vote(900, 2, 1, 5), granting(10, 1000, 5, 1, VOTERS, [1, 2])], id="its-vote-request-agreeing"
        ),
        pytest.param(
            [vote(900, 2, 3, 5, pre_vote=True), granting(10, 1000, 5, 1, VOTERS, [1, 2])],
            id="a-pre-vote-to-another-candidate",
        ),
    ],
)
def test_granting_voters_that_voted_once_per_epoch_raise_nothing(raws):
    assert keys(run(raws)) == []


def test_the_leader_changes_voter_set_is_the_quorums():
    detector = run([granting(10, 1000, 5, 1, [1, 2, 4], [1, 2])])
    assert detector.cluster(CLUSTER).quorum.voters == (1, 2, 4)
