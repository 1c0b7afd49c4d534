"""Replay's block path (issue 25): files are read a block of bytes at a time
(:func:`read_envelope_blocks`), records reach the detector a block at a time
(:func:`ingest_block`), and the data-plane requests among them (Produce,
Fetch, ListOffsets, OffsetForLeaderEpoch: most of a request log) are decoded
once, in one pass over each body, into the typed facts the rules judge.

Everything stateful still runs in :meth:`Detector.ingest`, record by record
and in the same order, so progress, due times, late records, re-delivery and
clock evidence are the per-record path's own: the block path only hands the
detector a request's header, ``acks`` and partition outcomes already decoded
(:class:`DataPlane`) instead of letting it walk the body. The one-pass decoder
accepts exactly the bodies the per-record readers accept without complaint
and gives the same values; any other body (a malformed field, a quorum
fetch, another API) gets no facts and is read by the per-record path, whose
dead letters it then gets.

The judgments themselves stay per record: the watermark moves with every
record, and a judgment must see the view and the clock evidence of the moment
it becomes due, so the judgments due at once are few (about 8 per watermark
step on a simulated history, docs/performance.md) -- too few for a vectorized
lookup to pay for building its columns.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import orjson

from detectors.alerts import Alert
from detectors.engine import Detector
from detectors.envelope import (
    DeadLetter,
    Envelope,
    _plain_envelope,
    envelope_or_dead_letter,
    parse_envelope,
)
from detectors.lines import DEFAULT_MAX_RECORD_BYTES, EXCERPT_BYTES, LongLine

# _SHAPES: the per-record reader's table of where each API keeps its partitions, one for both.
from detectors.requests import (
    _SHAPES,
    FETCH,
    LIST_OFFSETS,
    OFFSET_FOR_LEADER_EPOCH,
    PRODUCE,
    DataPlane,
    Header,
    PartitionOutcome,
    _Shape,
    is_quorum_fetch,
)
from detectors.sources import EnvelopeLineStats

# The envelopes replay hands the detector at a time.
BLOCK_ITEMS = 4096
# The bytes read at a time; a line longer than the record size limit is never held whole.
READ_BYTES = 1 << 20

_UNNAMED = object()
_DATA_PLANE_APIS = (PRODUCE, FETCH, LIST_OFFSETS, OFFSET_FOR_LEADER_EPOCH)
_INT16_MIN, _INT16_MAX = -(2**15), 2**15 - 1
_INT32_MIN, _INT32_MAX = -(2**31), 2**31 - 1


def decode_data_plane(body: dict[str, Any]) -> DataPlane | None:
    """A data-plane request's facts, exactly as ``requests.header``, Produce's
    ``acks`` and ``requests.partition_outcomes`` read them; None for any body
    they would not all read without complaint, for a quorum fetch, and for
    other APIs (the per-record path reads those)."""
    h = body.get("requestHeader")
    if type(h) is not dict:
        return None
    api_key = h.get("requestApiKey")
    version = h.get("requestApiVersion")
    correlation_id = h.get("correlationId")
    client_id = h.get("clientId")
    if (
        type(api_key) is not int  # first: True == 1 would pass for FETCH
        or api_key not in _DATA_PLANE_APIS
        or type(version) is not int
        or not _INT16_MIN <= version <= _INT16_MAX
        or type(correlation_id) is not int
        or not _INT32_MIN <= correlation_id <= _INT32_MAX
        or (client_id is not None and type(client_id) is not str)
    ):
        return None
    acks = None
    if api_key == PRODUCE:
        request = body.get("request")
        if type(request) is not dict:
            return None
        acks = request.get("acks")
        if type(acks) is not int or not _INT16_MIN <= acks <= _INT16_MAX:
            return None
    elif api_key == FETCH and is_quorum_fetch(body):
        return None
    outcomes = _outcomes(_SHAPES[api_key], body)
    if outcomes is None:
        return None
    return DataPlane(Header(api_key, version, correlation_id, client_id), acks, outcomes)


def _outcomes(shape: _Shape, body: dict[str, Any]) -> list[PartitionOutcome] | None:
    """``requests.partition_outcomes`` of a body its plain reader accepts
    (``requests._plain_outcomes``: the same checks, written out in one pass
    without generators or helper calls); None for any other body."""
    response = body.get("response")
    answered: dict[tuple[str | None, int], int] = {}
    if response is not None:
        if type(response) is not dict:
            return None
        top_error = response.get("errorCode", 0)
        if type(top_error) is not int or not _INT16_MIN <= top_error <= _INT16_MAX:
            return None
        topics = response.get(shape.resp_topics)
        if topics is not None:
            if type(topics) is not list:
                return None
            parts_key, index_key = shape.resp_parts, shape.resp_index
            for topic in topics:
                named = _named(topic, parts_key)
                if named is None:
                    return None
                ref, parts = named
                for part in parts:
                    if type(part) is not dict:
                        return None
                    index = part.get(index_key)
                    error = part.get("errorCode", top_error)
                    if (
                        type(index) is not int
                        or not _INT32_MIN <= index <= _INT32_MAX
                        or type(error) is not int
                        or not _INT16_MIN <= error <= _INT16_MAX
                    ):
                        return None
                    answered[(ref[1] or ref[0], index)] = error
    request = body.get("request")
    if type(request) is not dict:
        return None
    topics = request.get(shape.req_topics)
    if type(topics) is not list:
        return None
    parts_key, index_key = shape.req_parts, shape.req_index
    outcomes = []
    for topic in topics:
        named = _named(topic, parts_key)
        if named is None:
            return None
        (name, topic_id), parts = named
        for part in parts:
            if type(part) is not dict:
                return None
            index = part.get(index_key)
            epoch = part.get("currentLeaderEpoch", -1)
            if (
                type(index) is not int
                or not _INT32_MIN <= index <= _INT32_MAX
                or type(epoch) is not int
                or not _INT32_MIN <= epoch <= _INT32_MAX
            ):
                return None
            error = answered.get((topic_id or name, index))
            outcomes.append(PartitionOutcome(name, topic_id, index, epoch, error))
    return outcomes


def _named(topic: Any, parts_key: str) -> tuple[tuple[str | None, str | None], list[Any]] | None:
    """((name, topic id), partition entries) of a topic entry, as
    ``requests._plain_partitions`` accepts it; None for anything else."""
    if type(topic) is not dict:
        return None
    # requests._TOPIC_NAME_KEYS in order: the first present names the topic.
    if "name" in topic:
        name = topic["name"]
    elif "topic" in topic:
        name = topic["topic"]
    elif "topicName" in topic:
        name = topic["topicName"]
    else:
        name = _UNNAMED
    if name is _UNNAMED:
        name = None
    elif type(name) is not str:
        return None
    topic_id = topic.get("topicId")
    if (topic_id is not None and type(topic_id) is not str) or (name is None and topic_id is None):
        return None
    parts = topic.get(parts_key)
    if type(parts) is not list:
        return None
    return (name, topic_id), parts


@dataclass
class BlockOutcome:
    """What a block gave, in the order the per-record loop gives it:
    ``letters``: each dead letter with True if the detector made it (False: the
    input's own, counted by the detector here); ``alerts``: as :meth:`Detector.drain`
    would have returned them after each record."""

    letters: list[tuple[DeadLetter, bool]] = field(default_factory=list)
    alerts: list[Alert] = field(default_factory=list)
    items: int = 0  # how many the block held


def ingest_block(detector: Detector, items: Iterable[Envelope | DeadLetter]) -> BlockOutcome:
    """Feed one block of replay's merged input to ``detector``: what the
    per-record loop (``dead_letter`` or ``ingest``, then ``drain``, per item)
    does, with data-plane requests decoded once (:func:`decode_data_plane`).
    ``items`` is best an iterator: a block held whole keeps thousands of bodies
    alive at once, which the garbage collector then walks again and again."""
    out = BlockOutcome()
    letters, alerts = out.letters, out.alerts
    ingest = detector.ingest
    clusters = detector.clusters
    for item in items:
        out.items += 1
        if isinstance(item, DeadLetter):
            detector.dead_letter(item)
            letters.append((item, False))
            continue
        decoded = decode_data_plane(item.body) if item.kind == "request" else None
        for letter in ingest(item, decoded=decoded):
            letters.append((letter, True))
        # A record changes its own cluster's state only, so only its alerts can be new.
        cs = clusters[item.cluster]
        if cs.out:
            alerts.extend(cs.out)
            cs.out.clear()
    return out


def read_envelope_blocks(
    stream: Any,
    source: str,
    on_bytes: Callable[[int], None] | None = None,
    max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES,
    stats: EnvelopeLineStats | None = None,
) -> Iterator[Envelope | DeadLetter]:
    """What ``detectors.sources.read_envelopes`` gives for the same stream (the
    same items, positions and counts), read a block of bytes at a time
    (``on_bytes`` is told per block) and split into lines there instead of a
    ``readline`` per line. Lines are cut where ``lines.read_lines`` cuts them:
    one whose terminator falls more than two bytes past ``max_record_bytes`` is
    a LongLine of its first bytes, size unknown, and the rest of it is
    dropped as it is read, so no more than the limit and a block is held."""
    counts = stats if stats is not None else EnvelopeLineStats()
    limit = max_record_bytes
    if limit < 1:
        raise ValueError(f"the line limit must be at least 1 byte, got {limit}")
    cut_at = limit + 2  # what read_lines reads of a line before it calls the line too long
    line_no = 0
    carry = b""  # the start of a line whose end is not read yet
    skipping = False  # dropping the rest of a too-long line, up to its terminator
    while block := stream.read(READ_BYTES):
        if on_bytes is not None:
            on_bytes(len(block))
        if skipping:
            end = block.find(b"\n")
            if end < 0:
                continue
            skipping = False
            block = block[end + 1 :]
        lines = (carry + block).split(b"\n")
        carry = lines.pop()
        for line in lines:
            line_no += 1
            counts.lines += 1
            position = f"{source}:{line_no}"
            if len(line) + 1 > cut_at:
                long = LongLine(line[: min(cut_at, EXCERPT_BYTES)], limit)
            else:
                size = len(line) - 1 if line.endswith(b"\r") else len(line)
                if size <= limit:
                    stripped = line.strip()
                    if stripped:
                        yield _counted(_envelope(stripped, position, line_no), counts)
                    else:
                        counts.blank_lines += 1
                    continue
                long = LongLine(line[: min(size, EXCERPT_BYTES)], limit, size)
            counts.dead_letters += 1
            yield long.dead_letter(position, f"line {line_no}")
        if len(carry) >= cut_at:
            line_no += 1
            counts.lines += 1
            counts.dead_letters += 1
            yield LongLine(carry[: min(cut_at, EXCERPT_BYTES)], limit).dead_letter(
                f"{source}:{line_no}", f"line {line_no}"
            )
            carry = b""
            skipping = True
    if carry:
        # The last line, without a terminator: read_lines keeps a trailing \r in its size.
        line_no += 1
        counts.lines += 1
        position = f"{source}:{line_no}"
        if len(carry) > limit:
            counts.dead_letters += 1
            yield LongLine(carry[: min(len(carry), EXCERPT_BYTES)], limit, len(carry)).dead_letter(
                position, f"line {line_no}"
            )
        elif stripped := carry.strip():
            yield _counted(_envelope(stripped, position, line_no), counts)
        else:
            counts.blank_lines += 1


def _envelope(line: bytes, position: str, line_no: int) -> Envelope | DeadLetter:
    """``envelope.parse_envelope``, its everyday case written out."""
    try:
        obj = orjson.loads(line)
    except orjson.JSONDecodeError:
        return parse_envelope(line, position, line_no)  # says why, as it says it
    env = _plain_envelope(obj, position, line_no) if type(obj) is dict else None
    return env if env is not None else envelope_or_dead_letter(obj, position, line_no, line)


def _counted(item: Envelope | DeadLetter, counts: EnvelopeLineStats) -> Envelope | DeadLetter:
    if type(item) is Envelope:
        counts.envelopes += 1
    else:
        counts.dead_letters += 1
    return item
