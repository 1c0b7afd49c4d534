"""A query whose source's Python process misses Spark's 10 s connect-back wait
is started again, and only then (streaming/query_start.py).

Real Spark, real broker. Spark launches a Python data source's processes with
the Python the source was registered with (pyspark's ``SparkContext.pythonExec``
at ``spark.dataSource.register``). These tests register ours through a wrapper
that holds the stream's source process (`python_streaming_source_runner`) past
Spark's wait for its first starts, as a busy machine does, and then exits.
"""

from __future__ import annotations

import logging
import sys
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from streaming.broker import EmbeddedBroker
from streaming.kafka_source import read_events
from streaming.query_start import SOURCE_WORKER_LATE, start_query

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming import DataStreamWriter

pytestmark = pytest.mark.integration

Produced = list[tuple[int, int, str, bytes]]
WAIT_SECONDS = 180.0
# Longer than Spark's wait (PythonWorkerFactory.createSimpleWorker: 10 s).
HOLD_SECONDS = 13


def _launcher(path: Path, on_source_start: str) -> Path:
    """A Python launcher that runs the shell lines ``on_source_start`` when Spark
    starts the stream's source process with it; every other process runs this
    interpreter at once."""
    path.write_text(
        "#!/bin/sh\n"
        'case " $* " in\n'
        '*" pyspark.sql.streaming.python_streaming_source_runner "*)\n'
        f"{on_source_start}\n"
        ";;\n"
        "esac\n"
        f'exec {sys.executable} "$@"\n'
    )
    path.chmod(0o755)
    return path


def _late_source_python(directory: Path, held_starts: int) -> Path:
    """Its first ``held_starts`` starts of the source process wait past Spark's
    connect-back wait and exit, each leaving a file in ``directory``."""
    directory.mkdir()
    return _launcher(
        directory.parent / "late-source-python",
        f'if [ "$(ls {directory} | wc -l)" -lt {held_starts} ]; then\n'
        f"    touch {directory}/$$; sleep {HOLD_SECONDS}; exit 1\n"
        "fi",
    )


def _broken_source_python(directory: Path) -> Path:
    """Its source process connects back at once, then cannot import our source
    (as in a Python environment without fencewatch)."""
    run_source = (
        "import runpy, sys; sys.modules['streaming.kafka_source'] = None; "
        "runpy.run_module('pyspark.sql.streaming.python_streaming_source_runner', run_name='__main__')"
    )
    return _launcher(directory / "broken-source-python", f'exec {sys.executable} -c "{run_source}"')


@contextmanager
def _registered_with(spark: SparkSession, python: Path) -> Iterator[None]:
    """Data sources registered inside run their processes with ``python``."""
    context = spark.sparkContext
    kept = context.pythonExec
    context.pythonExec = str(python)
    try:
        yield
    finally:
        context.pythonExec = kept


def _events(spark: SparkSession, broker: EmbeddedBroker, topic: str, python: Path) -> DataFrame:
    with _registered_with(spark, python):
        return read_events(
            spark,
            {
                "kafka.bootstrap.servers": broker.bootstrap_servers,
                "subscribe": topic,
                "startingOffsets": "earliest",
            },
        )


def _to_memory(df: DataFrame) -> tuple[str, DataStreamWriter]:
    name = f"q_{uuid.uuid4().hex[:10]}"
    return name, df.writeStream.format("memory").queryName(name).trigger(availableNow=True)


def test_a_source_late_at_its_first_start_is_started_again_and_reads_every_record(
    spark: SparkSession,
    broker: EmbeddedBroker,
    make_topic: Callable[..., str],
    produce: Callable[..., Produced],
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    topic = make_topic(3)
    produced = produce(topic, 300, partitions=3)
    held = tmp_path / "held"
    name, writer = _to_memory(_events(spark, broker, topic, _late_source_python(held, held_starts=1)))
    with caplog.at_level(logging.WARNING, logger="streaming.query_start"):
        query = start_query(writer)
    assert query.awaitTermination(WAIT_SECONDS), "the availableNow query did not finish"
    assert query.exception() is None, query.exception()
    assert len(list(held.iterdir())) == 1, "the first start was not held"
    assert [r.getMessage() for r in caplog.records] == [
        f"the query {name} failed at its start: its source's Python process did not connect back "
        "within Spark's 10 s (a busy machine); starting it again (start 2 of 3)"
    ]
    got = sorted((r.partition, r.offset, r.key, bytes(r.value)) for r in spark.table(name).collect())
    assert got == sorted(produced)


def test_a_source_late_at_every_start_ends_with_sparks_error_after_the_last(
    spark: SparkSession,
    broker: EmbeddedBroker,
    make_topic: Callable[..., str],
    produce: Callable[..., Produced],
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    topic = make_topic(1)
    produce(topic, 10, partitions=1)
    held = tmp_path / "held"
    _, writer = _to_memory(_events(spark, broker, topic, _late_source_python(held, held_starts=99)))
    with caplog.at_level(logging.WARNING, logger="streaming.query_start"):
        query = start_query(writer, attempts=2)
    assert not query.isActive
    assert SOURCE_WORKER_LATE in str(query.exception())
    assert len(list(held.iterdir())) == 2
    assert len(caplog.records) == 1


def test_a_query_failing_at_its_start_for_another_reason_is_not_started_again(
    spark: SparkSession,
    broker: EmbeddedBroker,
    make_topic: Callable[..., str],
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    topic = make_topic(1)
    _, writer = _to_memory(_events(spark, broker, topic, _broken_source_python(tmp_path)))
    with caplog.at_level(logging.WARNING, logger="streaming.query_start"):
        query = start_query(writer)
    assert not query.isActive
    error = str(query.exception())
    assert "streaming.kafka_source" in error, error
    assert SOURCE_WORKER_LATE not in error
    assert caplog.records == []
