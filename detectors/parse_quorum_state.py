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

from detectors.envelope import BadRecord, DeadLetter, DeadLetterClass, Envelope, envelope_or_dead_letter
from detectors.fields import INT16, INT32, INT64, get_list, get_str, json_object, objects
from detectors.lines import DEFAULT_MAX_RECORD_BYTES, EXCERPT_BYTES, LongLine, decode_line

FILE_NAME = "quorum-state"  # FileQuorumStateStore.DEFAULT_FILE_NAME
DATA_VERSION = "data_version"
_PATH = "quorum-state"  # how reasons name the file's fields: quorum-state.leaderId
_NODE_ID = (-1, INT32[1])  # -1: no leader / no vote
_EPOCH = (0, INT32[1])  # Kafka starts at epoch 0 and only counts up
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


def is_quorum_state_object(obj: dict[str, Any]) -> bool:
    """Whether a JSON object has the shape FileQuorumStateStore writes (its
    ``data_version`` and ``leaderEpoch``), valid or not."""
    return DATA_VERSION in obj and "leaderEpoch" in obj


def _int(obj: dict[str, Any], key: str, path: object, bounds: tuple[int, int]) -> int:
    # Not fields.get_int: these bounds are Kafka's meaning (epochs from 0, -1 for
    # "none"), not a type width, and the reason says which.
    value = obj.get(key, ...)
    if type(value) is int and bounds[0] <= value <= bounds[1]:
        return value
    if value is ...:
        raise BadRecord(f"missing field {path}.{key}", DeadLetterClass.MISSING_FIELD)
    wanted = f"an integer from {bounds[0]} to {bounds[1]}"
    # A number too large for 64 bits arrives as a float: still a value out of range.
    huge = isinstance(value, float) and value.is_integer()
    kind = DeadLetterClass.OUT_OF_RANGE if huge else DeadLetterClass.of_bad_number(value)
    raise BadRecord(f"{path}.{key} must be {wanted}, got {value!r}", kind)


def _voters(body: dict[str, Any]) -> None:
    if "currentVoters" not in body:  # required, though it may be null (nullable in version 0)
        raise BadRecord(f"missing field {_PATH}.currentVoters", DeadLetterClass.MISSING_FIELD)
    voters = get_list(body, "currentVoters", _PATH, default=[])
    for path, voter in objects(voters, f"{_PATH}.currentVoters"):
        _int(voter, "voterId", path, (0, INT32[1]))


def _directory_id(body: dict[str, Any]) -> None:
    text = get_str(body, "votedDirectoryId", _PATH) or ""  # never None: the field is required
    try:
        # Kafka's Uuid.toString: URL-safe base64 of 16 bytes, without padding.
        raw = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    except (binascii.Error, ValueError):
        raw = b""
    if len(raw) != _UUID_BYTES or len(text) != 22:
        raise BadRecord(
            f"{_PATH}.votedDirectoryId must be a Kafka Uuid (22 base64 characters), got {text[:40]!r}",
            DeadLetterClass.INVALID,
        )


def _check_v0(body: dict[str, Any]) -> None:
    get_str(body, "clusterId", _PATH)
    _int(body, "appliedOffset", _PATH, INT64)
    _voters(body)


def _check_v1(body: dict[str, Any]) -> None:
    _directory_id(body)
    if "currentVoters" in body:  # Kafka writes none in version 1; rules must not trip on one
        _voters(body)


# data_version -> the checks of the fields only that version has.
_VERSIONS: dict[int, Callable[[dict[str, Any]], None]] = {0: _check_v0, 1: _check_v1}


def quorum_state_body(text: str) -> dict[str, Any]:
    """The file's object, checked; raise :class:`BadRecord` saying why it cannot be used."""
    if not text.strip():
        raise BadRecord(
            "empty quorum-state file (Kafka writes it whole and renames it into place)",
            DeadLetterClass.INVALID,
        )
    body = json_object(text, "quorum-state")
    version = _int(body, DATA_VERSION, _PATH, (0, INT16[1]))
    check = _VERSIONS.get(version)
    if check is None:
        raise BadRecord(
            f"data_version {version} is not one fencewatch reads (Kafka's FileQuorumStateStore writes "
            f"{' and '.join(map(str, _VERSIONS))}): a newer Kafka? fencewatch needs an update",
            DeadLetterClass.OUT_OF_RANGE,
        )
    _int(body, "leaderId", _PATH, _NODE_ID)
    _int(body, "leaderEpoch", _PATH, _EPOCH)
    _int(body, "votedId", _PATH, _NODE_ID)
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
    data = source_data if isinstance(source_data, bytes) else source_data.read(max_record_bytes + 1)
    item = _item(data, f"{source}:1", cluster, node, ts_ms, max_record_bytes)
    if isinstance(item, Envelope):
        counts.records += 1
        version = item.body[DATA_VERSION]
        counts.records_by_version[version] = counts.records_by_version.get(version, 0) + 1
    else:
        counts.dead_letters += 1
    return item


def _item(
    data: bytes, position: str, cluster: str, node: int, ts_ms: int, limit: int
) -> Envelope | DeadLetter:
    if len(data) > limit:
        # Only limit + 1 bytes were read: the file's size is not known.
        return LongLine(data[:EXCERPT_BYTES], limit).dead_letter(position, "quorum-state file")
    text, utf8_error = decode_line(data)
    if utf8_error is not None:
        return DeadLetter(position, f"not UTF-8: {utf8_error}", text, kind=DeadLetterClass.NOT_UTF8)
    try:
        body = quorum_state_body(text)
    except BadRecord as exc:
        return exc.dead_letter(position, text)
    obj = {
        "cluster": cluster,
        "node": node,
        "ts_ms": ts_ms,
        "kind": "quorum_state",
        "offset": None,
        "body": body,
    }
    return envelope_or_dead_letter(obj, position, 0, text)
