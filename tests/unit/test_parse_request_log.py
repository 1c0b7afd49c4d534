"""Kafka request log -> request envelopes (SPEC 1.2), detectors/parse_request_log.py."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from detectors.envelope import DeadLetter, Envelope
from detectors.parse_request_log import RequestLogStats, iter_request_log

DATA = Path(__file__).resolve().parents[1] / "data"
SUFFIX = " (kafka.request.logger)"
# 2026-11-20 10:15:02.345 UTC, computed with `date -u -d ... +%s%3N`.
PRODUCE_TS_MS = 1795169702345


def parse(lines, *, node=1, tz="UTC", stats=None):
    return list(iter_request_log(lines, source="t.log", cluster="prod-eu-1", node=node, tz=tz, stats=stats))


def entry(body: str, stamp: str = "2026-11-20 10:15:02,345", level: str = "DEBUG") -> str:
    return f"[{stamp}] {level} Completed request:{body}{SUFFIX}"


def fixture_lines() -> list[bytes]:
    return (DATA / "request.log").read_bytes().splitlines(keepends=True)


def test_fixture_yields_every_request_in_order_with_positions_and_counts():
    stats = RequestLogStats()
    items = parse(fixture_lines(), stats=stats)

    assert all(isinstance(item, Envelope) for item in items)
    names = [item.body["requestHeader"]["requestApiKeyName"] for item in items]
    assert names == ["PRODUCE", "STOP_REPLICA", "ALTER_PARTITION", "FETCH"]
    assert [item.position for item in items] == ["t.log:2", "t.log:3", "t.log:7", "t.log:8"]
    assert [item.seq for item in items] == [0, 1, 2, 3]
    # 4 entries, 10 continuation lines of the wrapped FETCH, 3 other loggers' entries and 2 stack-trace lines.
    assert stats == RequestLogStats(
        lines=19, records=4, dead_letters=0, record_lines=14, other_logger_lines=5
    )
    assert stats.continuation_lines == 10


def test_envelope_fields_and_body_unchanged():
    lines = fixture_lines()
    produce = parse(lines)[0]
    # The body is exactly the JSON between the marker and the logger suffix.
    line = lines[1].decode()
    expected_body = orjson.loads(line.split("Completed request:", 1)[1].rsplit(SUFFIX, 1)[0])

    assert produce.body == expected_body
    assert produce.to_dict() == {
        "cluster": "prod-eu-1",
        "node": 1,
        "ts_ms": PRODUCE_TS_MS,
        "kind": "request",
        "offset": None,
        "body": expected_body,
    }
    partitions = produce.body["request"]["topicData"][0]["partitionData"]
    assert [p["currentLeaderEpoch"] for p in partitions] == [7, 4]
    responses = produce.body["response"]["responses"][0]["partitionResponses"]
    assert [(r["index"], r["errorCode"]) for r in responses] == [(0, 0), (1, 74)]


def test_record_wrapped_over_many_lines_is_joined_back():
    fetch = parse(fixture_lines())[3]
    assert fetch.body["requestHeader"] == {
        "requestApiKey": 1,
        "requestApiVersion": 16,
        "correlationId": 5519,
        "clientId": "consumer-billing-1",
        "requestApiKeyName": "FETCH",
    }
    assert fetch.body["response"]["responses"][0]["partitions"][0]["highWatermark"] == 48213
    assert fetch.body["clientInformation"]["softwareVersion"] == "4.1.0"


def test_wrap_may_split_the_logger_suffix_itself():
    line = entry('{"requestHeader":{"requestApiKey":5}}')
    cut = line.index("request.logger")
    items = parse([line[:cut], line[cut:], entry("{}", "2026-11-20 10:15:03,000")])
    assert [type(i) for i in items] == [Envelope, Envelope]
    assert items[0].body == {"requestHeader": {"requestApiKey": 5}}
    assert [i.position for i in items] == ["t.log:1", "t.log:3"]


def test_spec_sample_form_and_other_levels():
    spec_line = (
        '[2026-11-20 10:15:02,345] DEBUG Completed request:{"isForwarded":false,"requestHeader":'
        '{"requestApiKey":0,"requestApiVersion":13,"correlationId":283,"clientId":"p1",'
        '"requestApiKeyName":"PRODUCE"},"request":{},"response":{},"connection":"c",'
        '"totalTimeMs":4.67} (kafka.request.logger)'
    )
    items = parse([spec_line, entry("{}", level="INFO"), entry("{}", level="TRACE")])
    assert [type(i) for i in items] == [Envelope, Envelope, Envelope]
    assert items[0].body["requestHeader"]["correlationId"] == 283
    assert items[0].body["totalTimeMs"] == 4.67


def test_time_zone_of_the_broker_is_applied():
    winter = entry("{}", "2026-11-20 10:15:02,345")  # CET, UTC+1
    summer = entry("{}", "2026-07-01 12:00:00,000")  # CEST, UTC+2
    items = parse([winter, summer], tz="Europe/Berlin")
    assert [i.ts_ms for i in items] == [PRODUCE_TS_MS - 3_600_000, 1782900000000]


def test_bad_arguments_fail_at_call_time_not_later():
    for bad_zone in ("Mars/Olympus", "Europe", ""):
        with pytest.raises(ValueError, match="time zone"):
            iter_request_log([], source="s", cluster="c", node=1, tz=bad_zone)
    with pytest.raises(ValueError, match="node"):
        iter_request_log([], source="s", cluster="c", node=-1)
    with pytest.raises(ValueError, match="cluster"):
        iter_request_log([], source="s", cluster="", node=1)


def test_malformed_json_is_a_dead_letter_and_parsing_recovers():
    bad = entry('{"requestHeader":{"requestApiKey":0,,}}')
    items = parse([bad, entry("{}", "2026-11-20 10:15:03,000")])
    dead, good = items
    assert isinstance(dead, DeadLetter)
    assert dead.position == "t.log:1"
    assert "malformed request JSON" in dead.reason
    assert dead.raw == bad
    assert isinstance(good, Envelope) and good.position == "t.log:2" and good.seq == 0


def test_truncated_record_is_ended_by_the_next_log_entry():
    truncated = '[2026-11-20 10:15:02,345] DEBUG Completed request:{"requestHeader":{"requestAp'
    other = "[2026-11-20 10:15:02,400] INFO [Broker id=1] something (kafka.server.X)"
    stats = RequestLogStats()
    items = parse([truncated, other, entry("{}", "2026-11-20 10:15:03,000")], stats=stats)
    dead, good = items
    assert isinstance(dead, DeadLetter) and dead.position == "t.log:1"
    assert "truncated" in dead.reason and "line 2" in dead.reason
    assert isinstance(good, Envelope) and good.position == "t.log:3"
    assert (stats.records, stats.dead_letters, stats.other_logger_lines) == (1, 1, 1)


def test_truncated_record_at_end_of_input():
    items = parse([entry("{}"), '[2026-11-20 10:15:03,000] DEBUG Completed request:{"a":[1,'])
    assert isinstance(items[0], Envelope)
    assert isinstance(items[1], DeadLetter)
    assert "truncated" in items[1].reason and "input ended" in items[1].reason


def test_line_cut_inside_the_json_but_ending_with_the_suffix_does_not_swallow_what_follows():
    cut = entry('{"requestHeader":{"requestApiKey":0')
    stack_trace = "\tat org.apache.kafka.Foo.bar(Foo.java:1)"
    stats = RequestLogStats()
    items = parse([cut, stack_trace], stats=stats)
    assert len(items) == 1 and isinstance(items[0], DeadLetter)
    assert "truncated" in items[0].reason
    assert stats.other_logger_lines == 1 and stats.record_lines == 1


def test_non_utf8_bytes_in_a_record_make_a_dead_letter_but_not_in_other_lines():
    bad_record = entry('{"clientId":"p\xff"}').encode("latin-1")
    bad_other = b"[2026-11-20 10:15:02,500] INFO caf\xe9 (kafka.server.X)\n"
    stats = RequestLogStats()
    items = parse([bad_record, bad_other, entry("{}").encode()], stats=stats)
    assert isinstance(items[0], DeadLetter)
    assert "not UTF-8" in items[0].reason and "0xff" in items[0].reason
    assert isinstance(items[1], Envelope)
    assert (stats.dead_letters, stats.other_logger_lines) == (1, 1)


def test_bad_timestamps_are_dead_letters_not_skipped_lines():
    items = parse(
        [
            entry("{}", "2026-02-30 10:00:00,000"),
            entry("{}", "yesterday"),
            entry("{}", "1969-12-31 23:59:59,000"),
        ]
    )
    assert all(isinstance(i, DeadLetter) for i in items)
    assert "bad timestamp" in items[0].reason and "day is out of range" in items[0].reason
    assert "bad timestamp 'yesterday'" in items[1].reason
    assert "ts_ms" in items[2].reason  # before the epoch: the envelope schema refuses it


def test_body_that_is_not_an_object():
    items = parse([entry("[1,2]"), entry('"x"')])
    assert [i.reason for i in items] == [
        "request body must be a JSON object, got list",
        "request body must be a JSON object, got str",
    ]


def test_other_logger_and_blank_lines_are_counted_not_yielded():
    stats = RequestLogStats()
    lines = [
        "[2026-11-20 10:15:01,002] INFO [BrokerServer id=1] started (kafka.server.BrokerServer)",
        "",
        "java.lang.IllegalStateException: boom",
        entry("{}"),
    ]
    items = parse(lines, stats=stats)
    assert len(items) == 1 and items[0].position == "t.log:4"
    assert (stats.other_logger_lines, stats.blank_lines) == (2, 1)
    assert stats.lines == stats.record_lines + stats.skipped_lines


def test_text_before_any_log4j_entry_is_counted_as_unrecognised():
    stats = RequestLogStats()
    items = parse(["#!/bin/sh", "", "echo hello", entry("{}"), "\tat stack.trace(X.java:1)"], stats=stats)
    assert len(items) == 1
    assert (stats.unrecognised_lines, stats.blank_lines, stats.other_logger_lines) == (2, 1, 1)
    assert stats.lines == stats.record_lines + stats.skipped_lines == 5


def test_str_lines_and_crlf_endings_work_like_bytes():
    text = entry('{"a":1}') + "\r\n"
    from_str = parse([text])
    from_bytes = parse([text.encode()])
    assert from_str[0].body == from_bytes[0].body == {"a": 1}


def test_log_pattern_without_logger_name_still_converts_complete_records():
    # A log4j pattern without "(%c)": the record ends where the next entry starts.
    plain = '[2026-11-20 10:15:02,345] DEBUG Completed request:{"a":1}'
    items = parse([plain, plain.replace("02,345", "03,000")])
    assert [i.body for i in items if isinstance(i, Envelope)] == [{"a": 1}, {"a": 1}]


def test_stats_accumulate_over_several_files():
    stats = RequestLogStats()
    parse(fixture_lines(), stats=stats)
    parse([entry("{}")], stats=stats)
    assert (stats.lines, stats.records) == (20, 5)


def test_wrap_inside_a_multibyte_character_is_joined_back():
    line = entry('{"clientId":"caf\u00e9"}').encode()
    cut = line.index(b"\xc3") + 1  # between the two bytes of "é"
    items = parse([line[:cut], line[cut:]])
    assert len(items) == 1 and isinstance(items[0], Envelope)
    assert items[0].body == {"clientId": "caf\u00e9"}


# --- the record size limit -------------------------------------------------------------


def limited(lines, limit, stats=None):
    return list(
        iter_request_log(lines, source="t.log", cluster="c", node=1, stats=stats, max_record_bytes=limit)
    )


def test_an_entry_that_grows_past_the_limit_is_one_too_large_dead_letter_and_its_rest_is_skipped():
    head = '[2026-11-20 10:15:02,345] DEBUG Completed request:{"pad":['
    continuation = ['"0123456789",'] * 40  # 520 bytes of body, never closed
    stats = RequestLogStats()
    items = limited([head, *continuation, entry("{}", "2026-11-20 10:15:03,000")], 200, stats)

    dead, good = items
    assert isinstance(dead, DeadLetter) and dead.kind == "too_large" and dead.position == "t.log:1"
    # It is cut off where the limit was passed (line 16: 8 + 15 x 13 bytes > 200), not at its end.
    assert "request entry of lines 1-16 is longer than the record size limit of 200 bytes" in dead.reason
    assert "--max-record-bytes" in dead.reason
    assert dead.raw.startswith(head) and dead.raw.count("\n") == 15
    assert isinstance(good, Envelope) and good.position == "t.log:42" and good.seq == 0
    assert stats == RequestLogStats(
        lines=42, records=1, dead_letters=1, record_lines=42, other_logger_lines=0
    )
    assert stats.continuation_lines == 40


def test_an_entry_over_the_limit_that_ends_stops_the_skipping_at_its_end():
    big = entry('{"pad":"' + "p" * 300 + '"}')
    wrapped = [big[i : i + 120] for i in range(0, len(big), 120)]  # 4 lines, each within the limit
    stats = RequestLogStats()
    items = limited([*wrapped, "\tat stack.trace(X.java:1)", entry("{}")], 200, stats)
    assert [(type(i), i.position) for i in items] == [(DeadLetter, "t.log:1"), (Envelope, "t.log:6")]
    assert "request entry of lines 1-3" in items[0].reason
    # Its last line (4) ends the entry, so the stack trace after it is another logger's again.
    assert (stats.record_lines, stats.other_logger_lines) == (5, 1)


def test_a_line_over_the_limit_is_a_dead_letter_whether_or_not_it_starts_an_entry():
    huge_entry = entry('{"pad":"' + "p" * 500 + '"}')
    garbage = "\0" * 500
    stats = RequestLogStats()
    later = entry("{}", "2026-11-20 10:15:03,000")
    items = limited([huge_entry, '"continued",', entry("{}"), garbage, later], 200, stats)

    assert [(type(i), i.position) for i in items] == [
        (DeadLetter, "t.log:1"),
        (Envelope, "t.log:3"),
        (DeadLetter, "t.log:4"),
        (Envelope, "t.log:5"),
    ]
    assert "line 1 is 583 bytes, over the record size limit of 200 bytes" in items[0].reason
    assert "line 4 is 500 bytes" in items[2].reason
    assert {items[0].kind, items[2].kind} == {"too_large"}
    # The over-long entry's continuation (line 2) is part of it, the garbage line a record of its own.
    assert (stats.record_lines, stats.other_logger_lines, stats.dead_letters) == (5, 0, 2)


def test_an_over_long_line_inside_an_entry_makes_the_entry_too_large():
    head = '[2026-11-20 10:15:02,345] DEBUG Completed request:{"a":'
    items = limited([head, "9" * 500, "}" + SUFFIX, entry("{}")], 200)
    assert [(type(i), i.position) for i in items] == [(DeadLetter, "t.log:1"), (Envelope, "t.log:4")]
    assert "request entry of lines 1-2" in items[0].reason


def test_a_binary_stream_is_read_in_bounded_lines(tmp_path):
    log = tmp_path / "r.log"
    log.write_bytes(b"\0" * 100_000 + b"\n" + entry("{}").encode() + b"\n")
    with open(log, "rb") as f:
        items = limited(f, 1000)
    assert [(type(i), i.position) for i in items] == [(DeadLetter, "t.log:1"), (Envelope, "t.log:2")]
    assert len(items[0].raw) <= 2000
    assert "line 1 is longer than the record size limit of 1000 bytes" in items[0].reason


def test_the_limit_must_be_positive():
    with pytest.raises(ValueError, match="max_record_bytes"):
        iter_request_log([], source="s", cluster="c", node=1, max_record_bytes=0)
