"""Kafka's own files of a lab run (tests/data/kafka-lab) turned into envelope
files, one JSON line each, as ``fencewatch convert`` and the metadata-log
shipper would publish them."""

from __future__ import annotations

import gzip
import shutil
from pathlib import Path

from detectors.envelope import Envelope, dumps
from detectors.parse_native import parse_input
from detectors.parse_request_log import RequestLogStats
from producers.metadata_log import MetadataLogStats, iter_metadata_log_file

DATA = Path(__file__).resolve().parent / "data" / "kafka-lab"


def request_log_envelopes(
    log_gz: Path, out: Path, *, source: str, cluster: str, node: int
) -> RequestLogStats:
    """Write the envelopes of a gzipped request log of ``node`` to ``out``; its stats."""
    stats = RequestLogStats()
    with gzip.open(log_gz, "rb") as stream, open(out, "w") as dst:
        for item in parse_input(
            stream, stats, source=source, cluster=cluster, node=node, max_record_bytes=1 << 24
        ):
            assert isinstance(item, Envelope), item
            dst.write(dumps(item.to_dict()) + "\n")
    return stats


def metadata_log_envelopes(snapshot: Path, segment_gz: Path, out: Path, *, cluster: str, node: int) -> None:
    """Write the envelopes of ``node``'s bootstrap snapshot and first metadata
    segment (gzipped, unpacked beside ``out`` under Kafka's name) to ``out``."""
    segment = out.parent / "00000000000000000000.log"
    with gzip.open(segment_gz, "rb") as src, open(segment, "wb") as dst:
        shutil.copyfileobj(src, dst)
    with open(out, "w") as dst:
        for name in (snapshot, segment):
            for item in iter_metadata_log_file(
                str(name), cluster=cluster, node=node, stats=MetadataLogStats()
            ):
                assert isinstance(item, Envelope), item
                dst.write(dumps(item.to_dict()) + "\n")
