"""Bad input is data (STYLE.md practice 5): the parsers and envelope validation
never raise on hostile input, and every input record is accounted for, as an
envelope or as a dead letter with a reason and its position."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

import orjson
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from detectors.envelope import KINDS, DeadLetter, DeadLetterClass, Envelope, dumps, parse_envelope
from detectors.lines import EXCERPT_BYTES
from detectors.parse_metadata_dump import MetadataDumpStats, iter_metadata_dump
from detectors.parse_request_log import RequestLogStats, iter_request_log

FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
INT64_MAX = 2**63 - 1
MAX_TS_MS = 253402300799999  # 9999-12-31T23:59:59.999Z, the envelope schema's limit
SUFFIX = " (kafka.request.logger)"

# Values for JSON bodies. Strings avoid the characters that could make a body
# look like log syntax ("[" starting a continuation, "(...)" a logger suffix),
# so each generated entry has one known correct outcome.
_text = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="[]()"), max_size=12)
_numbers = st.one_of(
    st.integers(-(2**63), 2**64 - 1),  # huge numbers, as Kafka epochs and offsets can be
    st.floats(allow_nan=False, allow_infinity=False),
    st.booleans(),
    st.none(),
)
_json = st.recursive(
    st.one_of(_numbers, _text),
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(_text, inner, max_size=4)),
    max_leaves=12,
)
_bodies = st.dictionaries(_text, _json, max_size=5)


@dataclass
class Entry:
    """Some input lines and what they must become: "envelope", "dead" or "skip"."""

    lines: list[bytes]
    outcome: str


# --- the request log ----------------------------------------------------------


@st.composite
def _stamps(draw) -> tuple[str, bool]:
    """A log4j timestamp and whether it is usable (valid and not before 1970)."""
    year = draw(st.integers(1900, 9999))
    month, day = draw(st.integers(1, 12)), draw(st.integers(1, 28))
    clock = f"{draw(st.integers(0, 23)):02}:{draw(st.integers(0, 59)):02}:00,{draw(st.integers(0, 999)):03}"
    return f"{year:04}-{month:02}-{day:02} {clock}", year >= 1970


@st.composite
def _request_entries(draw) -> Entry:
    stamp, stamp_ok = draw(_stamps())
    level = draw(st.sampled_from(["DEBUG", "INFO", "TRACE", "WARN"]))
    head = f"[{stamp}] {level} Completed request:".encode()
    body = orjson.dumps(draw(_bodies))
    kind = draw(
        st.sampled_from(["good", "wrapped", "truncated", "malformed", "not_utf8", "bad_stamp", "not_object"])
    )
    tail = SUFFIX.encode()
    if kind == "good":
        return Entry([head + body + tail], "envelope" if stamp_ok else "dead")
    if kind == "wrapped":
        line = head + body + tail
        cuts = sorted(draw(st.sets(st.integers(len(head) + 1, len(line) - 1), max_size=6)))
        pieces = [line[a:b] for a, b in zip([0, *cuts], [*cuts, len(line)], strict=True)]
        return Entry(pieces, "envelope" if stamp_ok else "dead")
    if kind == "truncated":
        cut = draw(st.integers(0, len(body) - 1))
        return Entry([head + body[:cut]], "dead")
    if kind == "malformed":
        return Entry([head + b"{,," + body[1:] + tail], "dead")
    if kind == "not_utf8":
        at = draw(st.integers(0, len(body)))
        return Entry([head + body[:at] + b"\xff" + body[at:] + tail], "dead")
    if kind == "bad_stamp":
        bad = draw(st.sampled_from(["2026-13-01 00:00:00,000", "2026-02-30 10:00:00,000", "x"]))
        return Entry([f"[{bad}] DEBUG Completed request:".encode() + body + tail], "dead")
    wrong = draw(st.sampled_from([b"[1,2]", b'"s"', b"null", b"42", b"true"]))
    return Entry([head + wrong + tail], "dead")


@st.composite
def _other_logger_entries(draw) -> Entry:
    stamp, _ = draw(_stamps())
    message = draw(st.binary(max_size=40)).replace(b"\n", b" ").replace(b"\r", b" ")
    lines = [f"[{stamp}] INFO ".encode() + message + b" (kafka.server.KafkaServer)"]
    # Continuation lines of another logger's entry (a stack trace), possibly not UTF-8.
    for _ in range(draw(st.integers(0, 2))):
        lines.append(b"\tat org.apache.kafka.X.y(X.java:1) " + draw(st.binary(max_size=8)))
    return Entry([line.replace(b"\n", b" ").replace(b"\r", b" ") for line in lines], "skip")


def _run_request_log(lines: list[bytes]) -> tuple[list[Envelope | DeadLetter], RequestLogStats]:
    stats = RequestLogStats()
    items = list(iter_request_log(lines, source="f", cluster="c", node=1, stats=stats))
    return items, stats


@FUZZ
@given(st.lists(st.one_of(_request_entries(), _other_logger_entries()), max_size=12))
def test_request_log_every_entry_has_exactly_its_outcome(entries):
    lines = [line for entry in entries for line in entry.lines]
    starts, expected, number = [], [], 1
    for entry in entries:
        if entry.outcome != "skip":
            starts.append(f"f:{number}")
            expected.append(entry.outcome)
        number += len(entry.lines)

    items, stats = _run_request_log(lines)

    outcomes = ["envelope" if isinstance(i, Envelope) else "dead" for i in items]
    assert outcomes == expected
    assert [i.position for i in items] == starts
    assert all(i.reason for i in items if isinstance(i, DeadLetter))
    envelopes = [i for i in items if isinstance(i, Envelope)]
    assert [e.seq for e in envelopes] == list(range(len(envelopes)))
    assert stats.records == len(envelopes) and stats.dead_letters == len(items) - len(envelopes)
    skipped = sum(len(e.lines) for e in entries if e.outcome == "skip")
    assert stats.skipped_lines == skipped
    assert stats.lines == len(lines) == stats.record_lines + stats.skipped_lines
    assert stats.continuation_lines >= 0  # every envelope and dead letter has a line of its own


_RECORD_START = re.compile(r"\[[^\]]*\] \S+ Completed request:")


@st.composite
def _chaos_lines(draw) -> bytes:
    """Anything: slices of real lines, random bytes, random text, header look-alikes."""
    real = f'[2026-11-20 10:15:02,345] DEBUG Completed request:{{"a":[1,{{}}]}}{SUFFIX}'
    return draw(
        st.one_of(
            st.binary(max_size=60),
            st.text(max_size=60).map(lambda s: s.encode("utf-8", "surrogatepass")),
            st.integers(0, len(real)).map(lambda k: real[:k].encode()),
            st.integers(0, len(real)).map(lambda k: real[k:].encode()),
            st.just(b"[2026-11-20 10:15:02,345] DEBUG Completed request:"),
            st.just(SUFFIX.encode()),
            st.just(b""),
        )
    ).replace(b"\n", b" ")


@FUZZ
@given(st.lists(_chaos_lines(), max_size=30))
def test_request_log_survives_arbitrary_lines_and_accounts_for_them(lines):
    items, stats = _run_request_log(lines)

    assert stats.lines == len(lines) == stats.record_lines + stats.skipped_lines
    assert stats.continuation_lines >= 0  # every envelope and dead letter has a line of its own
    assert stats.records + stats.dead_letters == len(items)
    # Every line that starts a request entry becomes exactly one item, at that line.
    text = [line.decode("utf-8", "replace").removeprefix("\ufeff") for line in lines]
    start_positions = [f"f:{n}" for n, t in enumerate(text, 1) if _RECORD_START.match(t)]
    assert [i.position for i in items] == start_positions
    for item in items:
        if isinstance(item, DeadLetter):
            assert item.reason
        else:
            assert isinstance(parse_envelope(dumps(item.to_dict())), Envelope)


@FUZZ
@given(st.lists(_chaos_lines(), max_size=30), st.integers(1, 80))
def test_request_log_with_any_record_limit_accounts_for_every_line(lines, limit):
    stats = RequestLogStats()
    items = list(
        iter_request_log(lines, source="f", cluster="c", node=1, stats=stats, max_record_bytes=limit)
    )
    assert stats.lines == len(lines) == stats.record_lines + stats.skipped_lines
    assert stats.continuation_lines >= 0  # every envelope and dead letter has a line of its own
    assert stats.records + stats.dead_letters == len(items)
    for item in items:
        if isinstance(item, DeadLetter):
            assert item.reason and len(item.raw) <= EXCERPT_BYTES
            if item.kind == DeadLetterClass.TOO_LARGE:
                assert f"limit of {limit} bytes" in item.reason


@FUZZ
@given(st.lists(_chaos_lines(), max_size=30))
def test_a_record_limit_above_the_whole_input_changes_nothing(lines):
    unlimited, _ = _run_request_log(lines)
    limit = sum(len(line) for line in lines) + 1
    limited = list(iter_request_log(lines, source="f", cluster="c", node=1, max_record_bytes=limit))
    assert limited == unlimited


# --- the metadata dump --------------------------------------------------------

_RECORD_TYPES = st.sampled_from(
    ["REGISTER_BROKER_RECORD", "PARTITION_CHANGE_RECORD", "TOPIC_RECORD", "SOME_FUTURE_RECORD"]
)
_CONTROL = {
    "LEADER_CHANGE": ' LeaderChange: {"version":0,"leaderId":1,"voters":[],"grantingVoters":[]}',
    "SNAPSHOT_HEADER": ' SnapshotHeader {"version":0,"lastContainedLogTimestamp":0}',
    "SNAPSHOT_FOOTER": ' SnapshotFooter {"version":0}',
    "KRAFT_VERSION": ' KRaftVersion {"version":0,"kRaftVersion":1}',
    "KRAFT_VOTERS": ' KRaftVoters {"version":0,"voters":[]}',
    "COMMIT": " endTxnMarker: COMMIT coordinatorEpoch: 0",
    "LEADER_CHANGE_OLD": " controlType: LEADER_CHANGE(2)",
}


def _batch_line(base: int, count: int, control: bool) -> bytes:
    return (
        f"baseOffset: {base} lastOffset: {base + count - 1} count: {count} baseSequence: -1 "
        f"lastSequence: -1 producerId: -1 producerEpoch: -1 partitionLeaderEpoch: 1 "
        f"isTransactional: false isControl: {str(control).lower()} deleteHorizonMs: "
        f"OptionalLong.empty position: 0 CreateTime: 1795168800000 size: 91 magic: 2 "
        f"compresscodec: none crc: 1 isvalid: true"
    ).encode()


@st.composite
def _batches(draw) -> tuple[list[Entry], dict[str, int]]:
    """One batch: its header line (skipped) and its record lines, with outcomes."""
    base = draw(st.integers(0, 2**62))
    count = draw(st.integers(1, 3))
    control = draw(st.booleans())
    entries = [Entry([_batch_line(base, count, control)], "skip")]
    controls: dict[str, int] = {}
    for index in range(count):
        offset = base + index
        if control:
            name = draw(st.sampled_from(sorted(_CONTROL)))
            tail = _CONTROL[name]
            kind = name.removesuffix("_OLD")
            line = (
                f"| offset: {offset} CreateTime: 1 keySize: 4 valueSize: 9 sequence: -1 headerKeys: []{tail}"
            )
            # Quorum facts (a leader and its voters, a voter set), with their batch's epoch: envelopes.
            if kind in ("LEADER_CHANGE", "KRAFT_VOTERS"):
                entries.append(Entry([line.encode()], "envelope"))
                continue
            controls[kind] = controls.get(kind, 0) + 1
            entries.append(Entry([line.encode()], "skip"))
            continue
        ts = draw(st.integers(-1, 2**64))
        if draw(st.booleans()):  # now and then an offset beyond int64
            offset = draw(st.integers(0, 2**65))
        payload = orjson.dumps(
            {"type": draw(_RECORD_TYPES), "version": draw(st.integers(0, 20)), "data": draw(_bodies)}
        )
        usable = 0 <= ts <= MAX_TS_MS and offset <= INT64_MAX
        head = (
            f"| offset: {offset} CreateTime: {ts} keySize: -1 valueSize: 9 sequence: -1 "
            "headerKeys: [] payload: "
        ).encode()
        kind = draw(st.sampled_from(["good", "truncated", "error", "not_utf8"]))
        if kind == "good":
            entries.append(Entry([head + payload], "envelope" if usable else "dead"))
        elif kind == "truncated":
            entries.append(Entry([head + payload[: draw(st.integers(0, len(payload) - 1))]], "dead"))
        elif kind == "error":
            entries.append(Entry([head + b"Error at 5, skipping. boom"], "dead"))
        else:
            entries.append(Entry([head + payload[:-1] + b"\xc3" + payload[-1:]], "dead"))
    return entries, controls


_DUMP_NOISE = st.sampled_from(
    [
        b"Dumping /k/__cluster_metadata-0/00000000000000000000.log",
        b"Log starting offset: 0",
        b"",
        b"Found 12 invalid bytes at the end of 00000000000000000000.log",
    ]
)


@FUZZ
@given(st.lists(st.one_of(_batches(), _DUMP_NOISE), max_size=8))
def test_metadata_dump_every_line_has_exactly_its_outcome(parts):
    entries: list[Entry] = []
    controls: dict[str, int] = {}
    for part in parts:
        if isinstance(part, bytes):
            entries.append(Entry([part], "skip"))
            continue
        batch_entries, batch_controls = part
        entries.extend(batch_entries)
        for kind, n in batch_controls.items():
            controls[kind] = controls.get(kind, 0) + n
    lines = [entry.lines[0] for entry in entries]
    expected = [(f"m:{n}", e.outcome) for n, e in enumerate(entries, 1) if e.outcome != "skip"]

    stats = MetadataDumpStats()
    items = list(iter_metadata_dump(lines, source="m", cluster="c", stats=stats))

    got = [(i.position, "envelope" if isinstance(i, Envelope) else "dead") for i in items]
    assert got == expected
    assert all(i.reason for i in items if isinstance(i, DeadLetter))
    assert stats.control_records_by_type == controls
    assert stats.records + stats.dead_letters == len(items)
    assert stats.lines == len(lines)
    assert stats.lines == stats.records + stats.dead_letters + stats.control_records + stats.other_lines


@FUZZ
@given(st.lists(_chaos_lines() | st.binary(max_size=80).map(lambda b: b"| " + b), max_size=30))
def test_metadata_dump_survives_arbitrary_lines_and_accounts_for_them(lines):
    stats = MetadataDumpStats()
    items = list(iter_metadata_dump(lines, source="m", cluster="c", stats=stats))
    assert stats.lines == len(lines)
    assert stats.lines == stats.records + stats.dead_letters + stats.control_records + stats.other_lines
    assert stats.records + stats.dead_letters == len(items)
    for item in items:
        n = int(item.position.removeprefix("m:"))
        assert 1 <= n <= len(lines)
        if isinstance(item, DeadLetter):
            assert item.reason


@FUZZ
@given(
    st.lists(_chaos_lines() | st.binary(max_size=80).map(lambda b: b"| " + b), max_size=30),
    st.integers(1, 80),
)
def test_metadata_dump_with_any_record_limit_accounts_for_every_line(lines, limit):
    stats = MetadataDumpStats()
    items = list(iter_metadata_dump(lines, source="m", cluster="c", stats=stats, max_record_bytes=limit))
    assert stats.lines == len(lines)
    assert stats.lines == stats.records + stats.dead_letters + stats.control_records + stats.other_lines
    assert stats.records + stats.dead_letters == len(items)
    too_large = [i for i in items if isinstance(i, DeadLetter) and i.kind == DeadLetterClass.TOO_LARGE]
    # The limit counts a line's bytes without its terminator.
    unterminated = [line[:-2] if line.endswith(b"\r\n") else line.removesuffix(b"\n") for line in lines]
    long_lines = [n for n, line in enumerate(unterminated, 1) if len(line) > limit]
    assert [i.position for i in too_large] == [f"m:{n}" for n in long_lines]


# --- the envelope itself --------------------------------------------------------

_VALID = {"cluster": "c", "node": 1, "ts_ms": 1, "kind": "request", "offset": None, "body": {}}


@FUZZ
@given(st.one_of(st.binary(max_size=200), _json.map(orjson.dumps)))
def test_parse_envelope_never_raises_on_bytes_or_any_json(raw):
    item = parse_envelope(raw, "p:1", 3)
    if isinstance(item, DeadLetter):
        assert item.reason and item.position == "p:1"
    else:
        assert isinstance(item, Envelope) and item.position == "p:1" and item.seq == 3


@FUZZ
@given(
    st.sampled_from(sorted(_VALID)),
    st.one_of(
        _text,
        st.sampled_from(KINDS),
        st.integers(-(2**70), 2**70),
        st.booleans(),
        st.lists(st.integers(), max_size=2),
    ),
)
def test_parse_envelope_accepts_exactly_the_valid_values_of_each_field(key, value):
    # The stdlib encoder: orjson refuses integers beyond 64 bits, the wire does not.
    item = parse_envelope(json.dumps({**_VALID, key: value}))
    is_int = type(value) is int
    valid = {
        "cluster": isinstance(value, str) and 1 <= len(value) <= 249,
        "node": is_int and -1 <= value <= 2**31 - 1,
        "ts_ms": is_int and 0 <= value <= MAX_TS_MS,
        "kind": value in KINDS,  # node is set, so every kind is complete
        "offset": is_int and -1 <= value <= INT64_MAX,
        "body": False,  # none of the drawn values is an object
    }[key]
    if valid:
        assert isinstance(item, Envelope) and getattr(item, key) == value
    else:
        assert isinstance(item, DeadLetter) and key in item.reason


def test_float_ts_ms_is_rejected():
    # JSON Schema counts 1.0 as an integer; the envelope must not (epochs and offsets are exact).
    item = parse_envelope(b'{"cluster":"c","node":1,"ts_ms":1.0,"kind":"request","body":{}}')
    assert isinstance(item, DeadLetter)
    assert "ts_ms" in item.reason
