"""What the rules read of a data-plane request, decoded once where the record
is first read (issue 25, item 1).

Produce, Fetch, ListOffsets and OffsetForLeaderEpoch are most of a request
log, and of their body the rules read only the header, Produce's ``acks`` and
each partition's outcome (:class:`DataRequest`). The streaming job's Kafka
source already decodes every record's JSON to route it; there it also reads
these facts and hands them on packed (:func:`pack_record`), so that the
stateful operator builds the envelope and the outcomes from a few tuples
instead of parsing the JSON again (:func:`unpack`). Everything else, and any
record whose envelope or body a reader rejects, travels as its raw value
through the per-record path, which explains what is wrong.

The packed form is :mod:`marshal`'s, of plain tuples: it is read only by the
same interpreter that wrote it, a moment later, in another worker of the same
job (it is never stored: a restarted job reads the records again), and it
costs a fraction of a JSON parse to read.
"""

from __future__ import annotations

import marshal
from dataclasses import dataclass
from typing import Any

from detectors.envelope import BadRecord, Envelope, envelope_from_obj, read_digest
from detectors.fields import INT16, get_int, get_obj
from detectors.requests import (
    FETCH,
    LIST_OFFSETS,
    OFFSET_FOR_LEADER_EPOCH,
    PRODUCE,
    Header,
    PartitionOutcome,
    header,
    is_quorum_fetch,
    partition_outcomes,
)

_OUTCOME_APIS = (FETCH, LIST_OFFSETS, OFFSET_FOR_LEADER_EPOCH)
# The packed form's layout; a reader meeting another refuses it (ValueError).
_LAYOUT = 1


@dataclass(frozen=True, slots=True)
class DataRequest:
    """The facts the rules read of one data-plane request. ``acks`` is
    Produce's (None for the others)."""

    header: Header
    acks: int | None
    outcomes: list[PartitionOutcome]


def data_request(h: Header, body: dict[str, Any]) -> DataRequest | None:
    """The facts of a Produce, Fetch (but a quorum fetch, which the quorum
    rules read whole), ListOffsets or OffsetForLeaderEpoch with header ``h``;
    None for any other request. Raises :class:`BadRecord` as the readers do."""
    api = h.api_key
    if api == PRODUCE:
        acks = get_int(get_obj(body, "request", "body"), "acks", "body.request", bounds=INT16)
        return DataRequest(h, acks, partition_outcomes(PRODUCE, body))
    if api in _OUTCOME_APIS and not (api == FETCH and is_quorum_fetch(body)):
        return DataRequest(h, None, partition_outcomes(api, body))
    return None


def pack_record(document: Any, raw: bytes, cluster: str) -> bytes | None:
    """The packed envelope and facts of a record read as ``raw`` and decoded
    to ``document``, routed to ``cluster``; None where the record must take the
    per-record path: not a data-plane request, an envelope or body a reader
    rejects, another cluster than the envelope's (a dead letter), or an
    ``offset`` (its identity is then its content, not its bytes:
    detectors.redelivery)."""
    if type(document) is not dict or document.get("kind") != "request" or document.get("offset") is not None:
        return None
    try:
        env = envelope_from_obj(document)
        h = header(env.body)
        data = data_request(h, env.body)
    except BadRecord:
        return None
    if data is None or env.cluster != cluster:
        return None
    return marshal.dumps(
        (
            _LAYOUT,
            env.cluster,
            env.node,
            env.ts_ms,
            env.body.get("totalTimeMs"),
            read_digest(raw),
            (h.api_key, h.api_version, h.correlation_id, h.client_id),
            data.acks,
            [(o.topic, o.topic_id, o.partition, o.epoch, o.error) for o in data.outcomes],
        )
    )


def unpack(packed: bytes, position: str, seq: int) -> tuple[Envelope, DataRequest]:
    """The envelope (its body as :func:`detectors.envelope.without_body` keeps
    it) and facts :func:`pack_record` packed, read at ``position``."""
    layout, cluster, node, ts_ms, total, digest, head, acks, outcomes = marshal.loads(packed)
    if layout != _LAYOUT:
        raise ValueError(f"packed request of layout {layout}, this reader knows {_LAYOUT}")
    body = {} if total is None else {"totalTimeMs": total}
    env = Envelope(cluster, node, ts_ms, "request", None, body, position, seq, digest)
    return env, DataRequest(Header(*head), acks, [PartitionOutcome(*o) for o in outcomes])
