"""How many buckets a checkpoint's state is split into, kept with the checkpoint.

The stateful operator keys its state by (cluster, bucket) (streaming/routing.py),
so a checkpoint's state is only usable with the bucket count it was written
with: with another count every partition would look for its history under
another key and find none. The count is written into the checkpoint when a
job first starts on it, and a later start with a different ``--buckets`` is
refused. A checkpoint written before buckets existed (fencewatch up to
67519df, which keyed state by cluster alone) is exactly the one-bucket
layout: it runs on with one bucket.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import orjson

from streaming.hadoop_directory import HadoopDirectory

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

LAYOUT_FILE = "fencewatch-layout.json"
# Enough keys for Spark to spread a cluster over a few executors' cores; each
# key costs a few state-store calls per micro-batch (docs/performance.md).
DEFAULT_BUCKETS = 8
MAX_BUCKETS = 4096


class LayoutMismatch(ValueError):
    """The checkpoint was written with another bucket count."""


def check_buckets(buckets: int) -> int:
    if not 1 <= buckets <= MAX_BUCKETS:
        raise ValueError(f"--buckets must be between 1 and {MAX_BUCKETS}, not {buckets}")
    return buckets


def resolve_buckets(spark: SparkSession, checkpoint: str, requested: int | None) -> int:
    """The bucket count to run with on ``checkpoint``: the one it was written
    with, else ``requested`` (default DEFAULT_BUCKETS) for a new checkpoint,
    recorded there. Raises LayoutMismatch when ``requested`` differs from the
    checkpoint's."""
    if requested is not None:
        check_buckets(requested)
    directory = HadoopDirectory(spark, checkpoint)
    names = directory.names()
    if LAYOUT_FILE in names:
        stored = int(orjson.loads(directory.read(LAYOUT_FILE))["buckets"])
        origin = "was written with"
    elif "offsets" in names:
        stored = 1  # written before buckets: state keyed by cluster alone
        origin = "predates buckets and runs with"
    else:
        stored = requested or DEFAULT_BUCKETS
        directory.create(LAYOUT_FILE, orjson.dumps({"buckets": stored}))
        return stored
    if requested is not None and requested != stored:
        raise LayoutMismatch(
            f"the checkpoint {checkpoint} {origin} --buckets {stored}, not {requested}: its state is "
            f"keyed by bucket. Run with --buckets {stored}, or start a new checkpoint"
        )
    if LAYOUT_FILE not in names:
        directory.create(LAYOUT_FILE, orjson.dumps({"buckets": stored}))
    return stored
