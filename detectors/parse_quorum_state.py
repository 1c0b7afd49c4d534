"""A KRaft controller's ``quorum-state`` file to a ``kind: quorum_state``
envelope (SPEC 1.4).

Kafka keeps the file in the metadata log directory (``__cluster_metadata-0``).
Its writer is ``org.apache.kafka.raft.FileQuorumStateStore``
(raft/src/main/java/org/apache/kafka/raft/FileQuorumStateStore.java): one line
of ``QuorumStateData`` JSON (raft/src/main/resources/common/message/QuorumStateData.json)
plus a ``data_version`` field, written to ``quorum-state.tmp`` and renamed over
the file. What each version holds (``ElectionState.toQuorumStateData``):

* ``data_version`` 0: ``clusterId``, ``leaderId``, ``leaderEpoch``, ``votedId``,
  ``appliedOffset``, ``currentVoters`` (``[{"voterId": N}]``, nullable);
* ``data_version`` 1 (KIP-853, ``kraft.version`` 1): ``leaderId``,
  ``leaderEpoch``, ``votedId``, ``votedDirectoryId`` (a base64 Uuid, all zeros
  when the vote names no directory), and no voters: the voter set lives in the
  log (``KRaftVoters`` control records) instead.

``leaderId`` and ``votedId`` are -1 when there is no leader or vote. The
fields a version requires are required here as Kafka's reader requires them;
fields it does not know are kept. The body is the file's object unchanged,
``data_version`` included, so that the same state read twice is the same body.

The file carries neither a time nor the id of the node that wrote it: the
caller passes ``ts_ms`` (when the state was seen, or the file's modification
time) and ``node``.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import IO, Any

import orjson

from detectors.envelope import BadRecord, DeadLetter, DeadLetterClass, Envelope, envelope_or_dead_letter
from detectors.lines import DEFAULT_MAX_RECORD_BYTES, EXCERPT_BYTES, too_large_reason

FILE_NAME = "quorum-state"  # FileQuorumStateStore.DEFAULT_FILE_NAME
DATA_VERSION = "data_version"
_INT32_MAX = 2**31 - 1
_INT64 = (-(2**63), 2**63 - 1)
_NODE_ID = (-1, _INT32_MAX)  # -1: no leader / no vote
_EPOCH = (0, _INT32_MAX)  # Kafka starts at epoch 0 and only counts up
_UUID_BYTES = 16


@dataclass
class QuorumStateStats:
    """Counters over one or more files. Every file is exactly one record or one
    dead letter: ``files == records + dead_letters``; ``records_by_version``
    splits ``records`` by ``data_version``."""

    files: int = 0
    records: int = 0
    dead_letters: int = 0
    records_by_version: dict[int, int] = field(default_factory=dict)


def _int(body: dict[str, Any], key: str, bounds: tuple[int, int], path: str = "") -> int:
    value = body.get(key, ...)
    if type(value) is int and bounds[0] <= value <= bounds[1]:
        return value
    if value is ...:
        raise BadRecord(f"missing field {path}{key}", DeadLetterClass.MISSING_FIELD)
    wanted = f"an integer from {bounds[0]} to {bounds[1]}"
    # A number too large for 64 bits arrives as a float: still a value out of range.
    huge = isinstance(value, float) and value.is_integer()
    kind = DeadLetterClass.OUT_OF_RANGE if huge else DeadLetterClass.of_bad_number(value)
    raise BadRecord(f"{path}{key} must be {wanted}, got {value!r}", kind)


def _string(body: dict[str, Any], key: str) -> str:
    value = body.get(key, ...)
    if value is ...:
        raise BadRecord(f"missing field {key}", DeadLetterClass.MISSING_FIELD)
    if not isinstance(value, str):
        raise BadRecord(f"{key} must be a string, got {type(value).__name__}", DeadLetterClass.WRONG_TYPE)
    return value


def _voters(body: dict[str, Any]) -> None:
    if "currentVoters" not in body:
        raise BadRecord("missing field currentVoters", DeadLetterClass.MISSING_FIELD)
    voters = body["currentVoters"]
    if voters is None:  # nullable in version 0
        return
    if not isinstance(voters, list):
        raise BadRecord(
            f"currentVoters must be a list, got {type(voters).__name__}", DeadLetterClass.WRONG_TYPE
        )
    for i, voter in enumerate(voters):
        if not isinstance(voter, dict):
            raise BadRecord(
                f"currentVoters[{i}] must be an object, got {type(voter).__name__}",
                DeadLetterClass.WRONG_TYPE,
            )
        _int(voter, "voterId", (0, _INT32_MAX), f"currentVoters[{i}].")


def _directory_id(body: dict[str, Any]) -> None:
    text = _string(body, "votedDirectoryId")
    try:
        # Kafka's Uuid.toString: URL-safe base64 of 16 bytes, without padding.
        raw = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    except (binascii.Error, ValueError):
        raw = b""
    if len(raw) != _UUID_BYTES or len(text) != 22:
        raise BadRecord(
            f"votedDirectoryId must be a Kafka Uuid (22 base64 characters), got {text[:40]!r}",
            DeadLetterClass.INVALID,
        )


def _check_v0(body: dict[str, Any]) -> None:
    _string(body, "clusterId")
    _int(body, "appliedOffset", _INT64)
    _voters(body)


def _check_v1(body: dict[str, Any]) -> None:
    _directory_id(body)
    if "currentVoters" in body:  # Kafka writes none in version 1; rules must not trip on one
        _voters(body)


# data_version -> the checks of the fields only that version has.
_VERSIONS: dict[int, Callable[[dict[str, Any]], None]] = {0: _check_v0, 1: _check_v1}


def quorum_state_body(data: bytes) -> dict[str, Any]:
    """The file's object, checked; raise :class:`BadRecord` saying why it cannot be used."""
    if not data.strip():
        raise BadRecord(
            "empty quorum-state file (Kafka writes it whole and renames it into place)",
            DeadLetterClass.INVALID,
        )
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise BadRecord(
            f"not UTF-8: invalid byte 0x{data[exc.start]:02x} at byte {exc.start + 1}",
            DeadLetterClass.NOT_UTF8,
        ) from None
    try:
        body = orjson.loads(text)
    except orjson.JSONDecodeError as exc:
        raise BadRecord(f"malformed quorum-state JSON: {exc}", DeadLetterClass.MALFORMED_JSON) from None
    if not isinstance(body, dict):
        raise BadRecord(
            f"quorum-state must be a JSON object, got {type(body).__name__}", DeadLetterClass.WRONG_TYPE
        )
    version = _int(body, DATA_VERSION, (0, 2**15 - 1))  # an int16 in Kafka
    check = _VERSIONS.get(version)
    if check is None:
        raise BadRecord(
            f"data_version {version} is not one fencewatch reads (Kafka's FileQuorumStateStore writes "
            f"{' and '.join(map(str, _VERSIONS))}): a newer Kafka? fencewatch needs an update",
            DeadLetterClass.OUT_OF_RANGE,
        )
    _int(body, "leaderId", _NODE_ID)
    _int(body, "leaderEpoch", _EPOCH)
    _int(body, "votedId", _NODE_ID)
    check(body)
    return body


def parse_quorum_state(
    source_data: bytes | IO[bytes],
    *,
    source: str,
    cluster: str,
    node: int,
    ts_ms: int,
    stats: QuorumStateStats | None = None,
    max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES,
) -> Envelope | DeadLetter:
    """One quorum-state file's content (bytes, or a binary stream read up to
    the limit) as an envelope, or a dead letter saying why not.

    source: names the file in ``position`` (``f"{source}:1"``: the file is one line).
    node: the controller whose file it is; ts_ms: when its state was observed.
    A version-1 body has no ``currentVoters``: detectors.rules.quorum keeps the
    voters it knew (or none), and without voters the fetch-timeout half of
    QUORUM_ZOMBIE_LEADER is not judged, never guessed.
    """
    counts = stats if stats is not None else QuorumStateStats()
    counts.files += 1
    position = f"{source}:1"
    data = source_data if isinstance(source_data, bytes) else source_data.read(max_record_bytes + 1)
    if len(data) > max_record_bytes:
        counts.dead_letters += 1
        reason = too_large_reason("quorum-state file", max_record_bytes) + "; only its start is kept"
        raw = data[:EXCERPT_BYTES].decode("utf-8", errors="replace")
        return DeadLetter(position, reason, raw, kind=DeadLetterClass.TOO_LARGE)
    raw_text = data.decode("utf-8", errors="replace").rstrip("\r\n")
    try:
        body = quorum_state_body(data)
    except BadRecord as exc:
        counts.dead_letters += 1
        return exc.dead_letter(position, raw_text)
    obj = {
        "cluster": cluster,
        "node": node,
        "ts_ms": ts_ms,
        "kind": "quorum_state",
        "offset": None,
        "body": body,
    }
    item = envelope_or_dead_letter(obj, position, 0, raw_text)
    if isinstance(item, Envelope):
        counts.records += 1
        version = body[DATA_VERSION]
        counts.records_by_version[version] = counts.records_by_version.get(version, 0) + 1
    else:
        counts.dead_letters += 1
    return item
