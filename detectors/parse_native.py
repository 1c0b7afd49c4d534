"""One native Kafka text input (request log, metadata dump, quorum state, remote log
metadata) read by its format's parser into envelopes and dead letters; the format
is told by the stats object it is counted in."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import IO

from detectors.envelope import DeadLetter, Envelope
from detectors.parse_metadata_dump import MetadataDumpStats, iter_metadata_dump
from detectors.parse_quorum_state import QuorumStateStats, parse_quorum_state
from detectors.parse_remote_log_metadata import RemoteLogMetadataStats, iter_remote_log_metadata
from detectors.parse_request_log import RequestLogStats, iter_request_log
from detectors.rules import READ_APIS

Stats = RequestLogStats | MetadataDumpStats | QuorumStateStats | RemoteLogMetadataStats


def parse_input(
    stream: IO[bytes],
    stats: Stats,
    *,
    source: str,
    cluster: str,
    node: int | None,
    max_record_bytes: int,
    tz: str = "UTC",
    ts_ms: int | None = None,
    all_apis: bool = False,
) -> Iterator[Envelope | DeadLetter]:
    """The envelopes and dead letters of one input, read with the parser of the
    format whose stats ``stats`` is (``fencewatch convert``, ``fencewatch ship``'s
    dump-like inputs, the Kafka lab's replay of its files).

    node: the writer, for the formats that do not name it (ignored for
    remote-log-metadata, whose records do); required for request-log and
    quorum-state (ValueError). tz: request-log only. ts_ms: quorum-state only,
    when the state was seen, epoch ms (default: the file's modification time).
    all_apis: request-log only, keep the entries of the APIs no rule reads
    (detectors.rules.READ_APIS), which are otherwise counted in the stats.
    """
    if isinstance(stats, RemoteLogMetadataStats):
        return iter_remote_log_metadata(
            stream, source=source, cluster=cluster, stats=stats, max_record_bytes=max_record_bytes
        )
    if isinstance(stats, QuorumStateStats):
        if node is None:
            raise ValueError("quorum-state needs the node whose file it is (the file names none)")
        if ts_ms is None:
            ts_ms = os.fstat(stream.fileno()).st_mtime_ns // 1_000_000
        item = parse_quorum_state(
            stream,
            source=source,
            cluster=cluster,
            node=node,
            ts_ms=ts_ms,
            stats=stats,
            max_record_bytes=max_record_bytes,
        )
        return iter((item,))
    if isinstance(stats, RequestLogStats):
        if node is None:
            raise ValueError("request-log needs the node that wrote it")
        return iter_request_log(
            stream,
            source=source,
            cluster=cluster,
            node=node,
            tz=tz,
            stats=stats,
            max_record_bytes=max_record_bytes,
            apis=None if all_apis else READ_APIS,
        )
    return iter_metadata_dump(
        stream, source=source, cluster=cluster, node=node, stats=stats, max_record_bytes=max_record_bytes
    )
