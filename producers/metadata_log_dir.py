"""What a ``__cluster_metadata-0`` directory holds: segments and snapshots by offset.

Kafka's ``UnifiedLog``/``LocalLog`` name a segment by its base offset
(``00000000000000012345.log``, 20 digits) and ``Snapshots`` name a snapshot by
its end offset and epoch (``00000000000000012345-0000000003.checkpoint``: the
snapshot holds the state of every record below offset 12345, and the log goes
on at 12345). Files Kafka has not finished or is removing are not listed:
``.checkpoint.part`` (a snapshot being written), ``.deleted`` (a segment or
snapshot renamed before its asynchronous deletion), ``.cleaned``/``.swap``.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

_SEGMENT = re.compile(r"^(\d{20})\.log$")
_SNAPSHOT = re.compile(r"^(\d{20})-(\d{10})\.checkpoint$")


@dataclass(frozen=True, order=True)
class SegmentFile:
    base_offset: int
    path: str


@dataclass(frozen=True, order=True)
class SnapshotFile:
    end_offset: int
    epoch: int
    path: str


def segments(directory: str) -> list[SegmentFile]:
    """The directory's segments, lowest base offset first."""
    found = []
    for name in os.listdir(directory):
        match = _SEGMENT.match(name)
        if match:
            found.append(SegmentFile(int(match.group(1)), os.path.join(directory, name)))
    return sorted(found)


def newest_snapshot(directory: str) -> SnapshotFile | None:
    """The snapshot with the highest end offset (then epoch), or None."""
    found = []
    for name in os.listdir(directory):
        match = _SNAPSHOT.match(name)
        if match:
            end_offset, epoch = int(match.group(1)), int(match.group(2))
            found.append(SnapshotFile(end_offset, epoch, os.path.join(directory, name)))
    return max(found, default=None)


def segment_holding(found: list[SegmentFile], offset: int) -> SegmentFile | None:
    """The segment ``offset`` is in or would be appended to: the last whose base
    offset is at most ``offset``; None if every segment starts after it."""
    holding = None
    for segment in found:
        if segment.base_offset <= offset:
            holding = segment
    return holding
