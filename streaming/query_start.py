"""Starting a streaming query again when its source's Python process started too slowly.

At a query's start Spark launches the Python process that serves a Python data
source's stream (`PythonStreamingSourceRunner`, through
`PythonWorkerFactory.createSimpleWorker`) and waits 10 s for it to connect back:
a constant in spark-core 4.x (`Selector.select(10000)`), not a setting. Every
other Python step forks from Spark's daemon, whose wait is 60 s. Launched from
the wheel's own Spark home that process compiled pyspark from a zip (7-8 CPU-s)
and missed the 10 s often; streaming/spark_home.py removed that cause, and a
busy machine can still delay it past the wait. It then fails with "Python
worker failed to connect back" while still initializing its sources.
Nothing of the stream was read or committed then, so starting the query again
from the same checkpoint is the same as Spark's own restart after a failure.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Callable

    from pyspark.sql.streaming import DataStreamWriter, StreamingQuery

log = logging.getLogger(__name__)

SOURCE_WORKER_LATE = "Python worker failed to connect back"
# StreamExecution's status messages until its sources exist.
_INITIALIZING = "Initializing"
ATTEMPTS = 3


def start_query(
    writer: DataStreamWriter,
    attempts: int = ATTEMPTS,
    poll_seconds: float = 0.5,
    on_started: Callable[[], None] | None = None,
) -> StreamingQuery:
    """``writer.start()``, waiting until the query's sources are initialized; if
    it failed there because its source's Python process connected back too
    late, start it again, up to ``attempts`` starts in all. Returns the query:
    a failed one if its last start failed, or if it failed for another reason.
    ``on_started`` is called once, as soon as the first start returns."""
    query = _started(writer, poll_seconds, on_started)
    for attempt in range(2, attempts + 1):
        if not _source_worker_late(query):
            return query
        log.warning(
            "the query %s failed at its start: its source's Python process did not connect back "
            "within Spark's 10 s (a busy machine); starting it again (start %d of %d)",
            query.name,
            attempt,
            attempts,
        )
        query = _started(writer, poll_seconds)
    return query


def _started(
    writer: DataStreamWriter, poll_seconds: float, on_started: Callable[[], None] | None = None
) -> StreamingQuery:
    """A started query once it is past its sources' initialization (or ended)."""
    query = writer.start()
    try:
        if on_started is not None:
            on_started()
        while query.isActive and query.status["message"].startswith(_INITIALIZING):
            time.sleep(poll_seconds)
    except BaseException:
        query.stop()
        raise
    return query


def _source_worker_late(query: StreamingQuery) -> bool:
    error = None if query.isActive else query.exception()
    return error is not None and SOURCE_WORKER_LATE in str(error)
