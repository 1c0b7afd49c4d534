"""The event envelope (SPEC 1.1): validation at the edge.

Every input record becomes either an :class:`Envelope` or a :class:`DeadLetter`
that names the record's position and what is wrong with it. Nothing is dropped
silently (STYLE.md practice 5).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from enum import StrEnum
from hashlib import blake2b
from importlib import resources
from typing import Any

import fastjsonschema
import orjson

from detectors.fast_init import fast_init
from detectors.pickling import fast_pickle

# clock_evidence: bounds the buckets of a split cluster share (detectors.clock_exchange),
# published by the streaming job into its event topic.
KINDS = ("request", "metadata", "quorum_state", "remote_log_metadata", "clock_evidence")
NODE_REQUIRED = ("request", "quorum_state")
MAX_CLUSTER_LENGTH = 249
MAX_TS_MS = 253402300799999  # 9999-12-31T23:59:59.999Z
INT32_MAX = 2**31 - 1
INT64_MAX = 2**63 - 1


def load_schema() -> dict[str, Any]:
    """The envelope JSON Schema shipped in ``detectors/schema``."""
    text = resources.files("detectors").joinpath("schema/envelope.schema.json").read_text()
    schema: dict[str, Any] = json.loads(text)
    return schema


_validate = fastjsonschema.compile(load_schema())


class DeadLetterClass(StrEnum):
    """What kind of problem made a record unusable. The place that rejects a
    record names its class, because the class labels a metric (a small fixed
    set: bounded cardinality) while the free-text reason is for people and may
    be reworded."""

    NOT_UTF8 = "not_utf8"
    MALFORMED_JSON = "malformed_json"
    CLUSTER_MISMATCH = "cluster_mismatch"  # record key and envelope name different clusters
    MISSING_FIELD = "missing_field"
    OUT_OF_RANGE = "out_of_range"
    WRONG_TYPE = "wrong_type"  # including a name outside a closed set (an enum)
    NO_TIMESTAMP = "no_timestamp"  # none, or none usable
    OUT_OF_ORDER = "out_of_order"  # an offset-ordered log's record after later offsets were applied
    INVALID = "invalid"  # anything else
    TOO_LARGE = "too_large"  # a line or entry over the record size limit: not read

    @classmethod
    def of_bad_number(cls, value: Any) -> DeadLetterClass:
        """An integer that failed a bounds check is out of range; anything
        else where an integer belongs is the wrong type (bool is not an int here)."""
        return cls.OUT_OF_RANGE if type(value) is int else cls.WRONG_TYPE


class BadRecord(ValueError):
    """A record that cannot be used; ``reason`` names the field and the problem,
    ``kind`` its class."""

    def __init__(self, reason: str, kind: DeadLetterClass):
        super().__init__(reason)
        self.reason = reason
        self.kind = kind

    def __reduce__(self) -> tuple[Any, ...]:
        # The default pickles only the message, which __init__ cannot be called with.
        return (BadRecord, (self.reason, self.kind))

    def dead_letter(self, position: str, raw: str = "") -> DeadLetter:
        return DeadLetter(position, self.reason, raw, kind=self.kind)


@fast_pickle
@fast_init
@dataclass(frozen=True, slots=True)
class Envelope:
    """One validated event. ``position`` says where it came from (``file:line``
    or ``topic/partition@offset``); ``seq`` is its arrival order within that
    source and breaks ``ts_ms`` ties deterministically. ``read_digest``: a
    digest of the record's bytes where it was read from JSON (parse_envelope),
    its identity for recognising a re-delivery (detectors.redelivery); None for
    an envelope built in memory."""

    cluster: str
    node: int | None
    ts_ms: int
    kind: str
    offset: int | None
    body: dict[str, Any]
    position: str = ""
    seq: int = 0
    read_digest: bytes | None = field(default=None, compare=False, repr=False)

    def to_dict(self) -> dict[str, Any]:
        return {
            "cluster": self.cluster,
            "node": self.node,
            "ts_ms": self.ts_ms,
            "kind": self.kind,
            "offset": self.offset,
            "body": self.body,
        }


def without_body(env: Envelope) -> Envelope:
    """``env`` with an empty body: what state that outlives the record keeps of
    it (its time, node and position make evidence; its body is read only while
    the record is ingested). A request log line keeps its ``totalTimeMs``: its
    arrival is its time minus that (detectors.clocks)."""
    total = env.body.get("totalTimeMs")
    body = {} if total is None else {"totalTimeMs": total}
    # Spelled out: dataclasses.replace costs several times more on this hot path.
    return Envelope(env.cluster, env.node, env.ts_ms, env.kind, env.offset, body, env.position, env.seq)


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """A record that was not used, with why and where. ``kind`` has no default
    so that every place making a dead letter says which class it is."""

    position: str
    reason: str
    raw: str = field(default="", repr=False)
    kind: DeadLetterClass = field(kw_only=True)

    def to_dict(self) -> dict[str, Any]:
        return {"position": self.position, "reason": self.reason, "raw": self.raw[:2000]}


# The class of a schema failure, by the JSON Schema keyword the value broke
# (fastjsonschema's ``rule``); these are all the keywords envelope.schema.json uses.
_SCHEMA_RULE_CLASSES = {
    "required": DeadLetterClass.MISSING_FIELD,
    "type": DeadLetterClass.WRONG_TYPE,
    "enum": DeadLetterClass.WRONG_TYPE,
    "minimum": DeadLetterClass.OUT_OF_RANGE,
    "maximum": DeadLetterClass.OUT_OF_RANGE,
    "minLength": DeadLetterClass.OUT_OF_RANGE,
    "maxLength": DeadLetterClass.OUT_OF_RANGE,
}


def _schema_reason(exc: fastjsonschema.JsonSchemaValueException) -> str:
    # fastjsonschema says "data.ts_ms must be integer"; strip its "data." prefix so
    # the message names the envelope field the way the SPEC does.
    message = str(exc.message)
    missing = re.fullmatch(r"data(?:\.(\S+))? must contain \[(.*)\] properties", message)
    if missing:
        where = f" in {missing.group(1)}" if missing.group(1) else ""
        return f"missing required field(s){where}: {missing.group(2).replace(chr(39), '')}"
    return message.replace("data.", "", 1) if message.startswith("data.") else message


def _plain_envelope(
    obj: dict[str, Any], position: str, seq: int, digest: bytes | None = None
) -> Envelope | None:
    """The schema's checks written out for the hot path: millions of envelopes
    pass here without the compiled validator, which only explains failures.
    None if any check fails."""
    cluster = obj.get("cluster")
    ts_ms = obj.get("ts_ms")
    kind = obj.get("kind")
    node = obj.get("node")
    offset = obj.get("offset")
    body = obj.get("body")
    # Integers are exact ints: JSON Schema counts 1.0 as an integer, fencewatch
    # does not (epochs and offsets are exact).
    if (
        type(cluster) is str
        and 0 < len(cluster) <= MAX_CLUSTER_LENGTH
        and type(ts_ms) is int
        and 0 <= ts_ms <= MAX_TS_MS
        and kind in KINDS
        and type(body) is dict
        and ((node is None and kind not in NODE_REQUIRED) or (type(node) is int and -1 <= node <= INT32_MAX))
        and (offset is None or (type(offset) is int and -1 <= offset <= INT64_MAX))
    ):
        return Envelope(cluster, node, ts_ms, kind, offset, body, position, seq, digest)
    return None


def envelope_from_obj(obj: Any, position: str = "", seq: int = 0, digest: bytes | None = None) -> Envelope:
    """Validate a decoded JSON value as an envelope; raise :class:`BadRecord`.
    ``digest``: the read record's (Envelope.read_digest)."""
    if not isinstance(obj, dict):
        raise BadRecord(
            f"envelope must be a JSON object, got {type(obj).__name__}", DeadLetterClass.WRONG_TYPE
        )
    env = _plain_envelope(obj, position, seq, digest)
    if env is not None:
        return env
    try:
        _validate(obj)
    except fastjsonschema.JsonSchemaValueException as exc:
        kind = _SCHEMA_RULE_CLASSES.get(exc.rule or "", DeadLetterClass.INVALID)
        raise BadRecord(_schema_reason(exc), kind) from None
    for name in ("ts_ms", "node", "offset"):
        if isinstance(obj.get(name), float):
            raise BadRecord(f"{name} must be an integer, got a float", DeadLetterClass.WRONG_TYPE)
    raise BadRecord("envelope rejected by detectors/schema/envelope.schema.json", DeadLetterClass.INVALID)


def envelope_or_dead_letter(
    obj: Any, position: str, seq: int, raw: bytes | str, digest: bytes | None = None
) -> Envelope | DeadLetter:
    """Validate ``obj`` as an envelope, or say why not with the raw text kept."""
    try:
        return envelope_from_obj(obj, position, seq, digest)
    except BadRecord as exc:
        return exc.dead_letter(position, _as_text(raw))  # decoded only when kept


def parse_envelope(raw: bytes | str, position: str = "", seq: int = 0) -> Envelope | DeadLetter:
    """Decode one JSON line into an envelope, or a dead letter saying why not.
    A record without an offset gets the digest of ``raw`` (Envelope.read_digest):
    a re-delivery carries the same bytes, and hashing them costs a third of
    re-serializing the decoded body (docs/performance.md)."""
    try:
        obj = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        reason = f"malformed JSON: {exc}"
        return DeadLetter(position, reason, _as_text(raw), kind=DeadLetterClass.MALFORMED_JSON)
    digest = None
    if type(obj) is dict and obj.get("offset") is None:
        digest = read_digest(raw if isinstance(raw, bytes) else raw.encode())
    return envelope_or_dead_letter(obj, position, seq, raw, digest)


def read_digest(raw: bytes) -> bytes:
    """The identity of a record read as ``raw`` (Envelope.read_digest)."""
    return blake2b(raw.strip(), digest_size=16, person=b"fencewatch-read").digest()


def _as_text(raw: bytes | str) -> str:
    return raw if isinstance(raw, str) else raw.decode("utf-8", errors="replace")


def dumps(obj: Any) -> str:
    """Compact, key-sorted JSON: byte-identical output for identical input."""
    return orjson.dumps(obj, option=orjson.OPT_SORT_KEYS).decode()


class Unverified(Exception):
    """An event about a partition, topic or broker the view has not seen: it is
    counted by ``reason``, never alerted (SPEC section 2)."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason
