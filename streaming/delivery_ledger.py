"""Where each micro-batch started publishing, kept with Spark's checkpoint.

Spark commits a micro-batch only after ``foreachBatch`` returns. A crash in
between leaves records of a batch in the alerts and dead-letter topics that
Spark will run again, and only of that batch: the first one a restarted job
runs. To skip what that batch already published without reading whole topics
back, the sinks write a *publish mark* before a batch publishes its first
record: the batch id and the end offsets of the topics at that moment. On
restart they read the topics back from the newest mark of a batch not after
the first one Spark runs, to the current end.

Why that is enough, crash by crash (B: the first batch the restarted job runs):

- crash after B published, before Spark committed it: B runs again, and all
  it published lies past mark B. A re-run keeps B's first mark (marks are
  never overwritten), which precedes every attempt's records.
- crash before B's mark was written: B published nothing. The newest mark is
  an earlier batch's; reading from it covers more than needed, never less.
- crash after Spark committed B - 1: the newest mark is B - 1's or older, and
  reading from it costs that batch's records at most.
- no mark (a fresh checkpoint, or one an older fencewatch wrote), or only
  marks of later batches (the checkpoint's logs were cut by hand): the sinks
  read from the log start, once.
- a topic recreated, truncated or aged out by retention since the mark (the
  mark is outside the log's offsets now): the sinks read from the log start.

Marks are files written through Hadoop's FileSystem API, like Spark's own
checkpoint files, so they work wherever the checkpoint does (local disk, HDFS,
S3). Only the newest mark is kept.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

import orjson
from py4j.protocol import Py4JJavaError

from streaming.hadoop_directory import HadoopDirectory

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)

MARKS_DIRECTORY = "fencewatch-publish-marks"


@dataclass(frozen=True)
class PublishMark:
    """Before batch ``batch_id`` published: each topic's end offset per partition."""

    batch_id: int
    ends: Mapping[str, Mapping[int, int]]

    def to_json(self) -> bytes:
        return orjson.dumps(
            {
                "batch_id": self.batch_id,
                "ends": {t: {str(p): off for p, off in ends.items()} for t, ends in self.ends.items()},
            }
        )

    @classmethod
    def from_json(cls, data: bytes) -> PublishMark:
        """Parse a mark; ``ValueError`` if it is not one."""
        try:
            raw = orjson.loads(data)
            return cls(
                batch_id=int(raw["batch_id"]),
                ends={
                    str(t): {int(p): int(off) for p, off in ends.items()} for t, ends in raw["ends"].items()
                },
            )
        except (orjson.JSONDecodeError, KeyError, TypeError, AttributeError, ValueError) as exc:
            raise ValueError(f"not a publish mark: {exc}") from None


def newest_usable(batch_ids: list[int], first_batch: int) -> list[int]:
    """The marks to try for a restart whose first batch is ``first_batch``:
    those not after it, newest first."""
    return sorted((b for b in batch_ids if b <= first_batch), reverse=True)


class DeliveryLedger:
    """Publish marks in ``<checkpoint>/fencewatch-publish-marks/<batch id>``."""

    def __init__(self, spark: SparkSession, checkpoint: str):
        self.location = f"{checkpoint.rstrip('/')}/{MARKS_DIRECTORY}"
        self._directory = HadoopDirectory(spark, self.location)

    def newest(self, first_batch: int) -> PublishMark | None:
        """The newest readable mark of a batch not after ``first_batch``; None if there is none."""
        names = self._directory.names()
        for batch_id in newest_usable([int(n) for n in names if n.isdigit()], first_batch):
            try:
                return PublishMark.from_json(self._directory.read(str(batch_id)))
            except (ValueError, Py4JJavaError) as exc:
                # Damaged (marks are renamed into place whole, so not by a crash):
                # an older mark is a lower bound too, so fall back to it.
                log.warning("skipping unreadable publish mark %s/%d: %s", self.location, batch_id, exc)
        return None

    def record(self, mark: PublishMark) -> None:
        """Write ``mark`` unless its batch has one already (a re-run keeps the
        first), then drop the older marks."""
        self._directory.create(str(mark.batch_id), mark.to_json())
        for name in self._directory.names():
            if name.isdigit() and int(name) < mark.batch_id:
                self._directory.delete(name)
