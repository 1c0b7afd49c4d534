"""detectors.file_kinds: what kind of input a file is, from its first lines;
and detectors.lines.peek_lines, which hands those lines out and reads the
stream again from its start."""

from __future__ import annotations

import io
import os
from pathlib import Path

import pytest

from detectors.envelope import Envelope, dumps
from detectors.file_kinds import SNIFF_BYTES, SNIFF_LINES, FileKind, sniff
from detectors.lines import LongLine, peek_lines

DATA = Path(__file__).resolve().parents[1] / "data"
NATIVE = DATA / "native"
LOG4J_LINE = (
    b"[2026-11-20 10:15:01,002] INFO [BrokerServer id=1] Transition to STARTED (kafka.server.BrokerServer)\n"
)
REQUEST_LINE = b'[2026-11-20 10:15:02,345] DEBUG Completed request:{"a":1} (kafka.request.logger)\n'
ENVELOPE_LINE = (
    dumps(Envelope("prod", 1, 1795169702345, "request", None, {"requestHeader": {}}).to_dict()).encode()
    + b"\n"
)
# The start of an ELF executable (/bin/ls): magic, class, then NUL padding.
ELF_HEAD = b"\x7fELF\x02\x01\x01" + b"\0" * 9 + b"\x03\x00>\x00\x01\x00\x00\x00" + bytes(range(256)) * 4


def lines_of(path: Path) -> list[bytes]:
    return path.read_bytes().splitlines(keepends=True)


@pytest.mark.parametrize(
    ("path", "kind"),
    [
        (DATA / "request.log", FileKind.REQUEST_LOG),
        (DATA / "e2e" / "broker-1-request.log", FileKind.REQUEST_LOG),
        (DATA / "metadata.dump", FileKind.METADATA_DUMP),
        (NATIVE / "metadata-leader-change.dump", FileKind.METADATA_DUMP),
        (NATIVE / "quorum-state-v0.json", FileKind.QUORUM_STATE),
        (NATIVE / "quorum-state-v1.json", FileKind.QUORUM_STATE),
        (NATIVE / "remote-log-metadata.txt", FileKind.REMOTE_LOG_METADATA),
        (NATIVE / "remote-log-metadata-lifecycle.txt", FileKind.REMOTE_LOG_METADATA),
        (NATIVE / "README.md", FileKind.UNKNOWN),
    ],
)
def test_each_sample_file_is_recognised_by_its_content(path, kind):
    assert sniff(lines_of(path)) is kind


@pytest.mark.parametrize(
    ("lines", "kind"),
    [
        ([ENVELOPE_LINE, b"\n", ENVELOPE_LINE], FileKind.ENVELOPES),
        ([ELF_HEAD], FileKind.BINARY),
        ([b"\0" * 100], FileKind.BINARY),
        ([LOG4J_LINE, b"java.lang.IllegalStateException: boom\n", LOG4J_LINE], FileKind.LOG4J),
        ([b"hello\n", b"world\n"], FileKind.UNKNOWN),
        ([b'{"some": "json"}\n'], FileKind.UNKNOWN),
        ([], FileKind.EMPTY),
        ([b"\n", b"  \r\n"], FileKind.EMPTY),
    ],
    ids=["envelopes", "elf", "zeros", "log4j", "text", "other-json", "nothing", "blank"],
)
def test_kinds_without_a_sample_file(lines, kind):
    assert sniff(lines) is kind


def test_other_loggers_before_the_first_request_entry_do_not_outvote_it():
    assert sniff([LOG4J_LINE] * 20 + [REQUEST_LINE]) is FileKind.REQUEST_LOG


def test_the_kind_most_lines_vote_for_wins():
    dump = lines_of(DATA / "metadata.dump")
    assert sniff([REQUEST_LINE, *dump]) is FileKind.METADATA_DUMP


def test_a_few_bad_bytes_do_not_make_a_text_file_binary():
    assert sniff([REQUEST_LINE, b"caf\xe9 latin-1\n", REQUEST_LINE]) is FileKind.REQUEST_LOG
    assert sniff([b"\xff\xfe\n", b"\x80\x81\n", REQUEST_LINE]) is FileKind.BINARY


def test_only_the_first_lines_are_read():
    later_request = [b"hello\n"] * SNIFF_LINES + [REQUEST_LINE]
    assert sniff(later_request) is FileKind.UNKNOWN


def test_a_byte_order_mark_and_a_line_cut_short_are_read_as_parsers_read_them():
    assert sniff([b"\xef\xbb\xbf" + REQUEST_LINE]) is FileKind.REQUEST_LOG
    long = LongLine(REQUEST_LINE[:60], limit=60)
    assert sniff([long]) is FileKind.REQUEST_LOG


def test_peek_lines_hands_out_the_head_and_reads_everything_again():
    data = b"".join([LOG4J_LINE] * 10_000)  # 1 MB, more than the head
    with io.BufferedReader(io.BytesIO(data)) as stream:
        head, again = peek_lines(stream, SNIFF_LINES, SNIFF_BYTES)
        assert head == [LOG4J_LINE] * SNIFF_LINES
        assert again.read() == data


def test_peek_lines_of_a_pipe_reads_it_once_and_keeps_its_file_descriptor(tmp_path):
    read_end, write_end = os.pipe()
    data = REQUEST_LINE * 3
    os.write(write_end, data)
    os.close(write_end)
    with open(read_end, "rb") as pipe:
        head, again = peek_lines(pipe, 2, SNIFF_BYTES)
        assert head == [REQUEST_LINE, REQUEST_LINE]
        assert again.fileno() == read_end
        assert again.read() == data
        again.close()
        assert not pipe.closed  # the caller's (stdin, say) to close


def test_peek_lines_stops_at_its_byte_budget_on_a_line_that_never_ends():
    with io.BufferedReader(io.BytesIO(b"x" * (3 * SNIFF_BYTES))) as stream:
        head, again = peek_lines(stream, SNIFF_LINES, SNIFF_BYTES)
        assert [len(line) for line in head] == [SNIFF_BYTES]
        assert len(again.read()) == 3 * SNIFF_BYTES
