"""The query's progress as metrics: a StreamingQueryListener on the driver.

Spark reports, after each micro-batch, its duration, input and processing
rates, and per source the offsets it read to (``endOffset``) and the newest
offsets available (``latestOffset``). Source lag in records is their
difference. Lag in seconds is estimated the way Kafka lag exporters do it:
from the history of when each offset became available, how long ago the
oldest unread record did.

The source's loss rows arrive as an observed metric (``LOST_OFFSETS_METRIC``):
each range of offsets that vanished before it was read is logged and counted.

Each report reaches the listener as its JSON, read from the JVM in one call
(:class:`_ProgressAsJson`), not through pyspark's own conversion, which asks
the JVM for every field apart and, for a report with observed metrics (every
report of this job), looks a JVM class up by name: py4j tries names that do
not exist first, and each miss searches every jar of Spark's class path
(docs/performance.md, "The fixed cost of a batch").
"""

from __future__ import annotations

import bisect
import json
import logging
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from pyspark.sql.streaming import StreamingQueryListener
from pyspark.sql.streaming.listener import (
    JStreamingQueryListener,
    QueryProgressEvent,
)

from streaming.kafka_source import LOST_OFFSETS_METRIC, partition_offsets
from streaming.metrics import Metrics

log = logging.getLogger(__name__)

# Progress samples kept for the time-lag estimate: about an hour at one batch a second.
LAG_SAMPLES = 4_096


def offsets_total(offsets: str | None) -> int | None:
    """The sum of a source offset JSON's per-partition offsets.

    fencewatch's source writes ``{"0": 12, ...}`` (and its idle tick count,
    which is not an offset); Spark's Kafka connector
    ``{"topic": {"0": 12, ...}}``. None when the source reported nothing."""
    if not offsets:
        return None
    parsed = json.loads(offsets)
    if not isinstance(parsed, dict):
        return None
    total = 0
    for value in partition_offsets(parsed).values():
        if isinstance(value, dict):
            total += sum(int(v) for v in value.values() if int(v) >= 0)
        else:
            total += int(value)
    return total


class LagEstimator:
    """Time lag from (wall time, newest available offset total) samples."""

    def __init__(self, max_samples: int = LAG_SAMPLES):
        self._times: deque[float] = deque(maxlen=max_samples)
        self._latest: deque[int] = deque(maxlen=max_samples)

    def observe(self, now_seconds: float, latest_total: int, end_total: int) -> tuple[int, float]:
        """Record a sample; return (lag in records, lag in seconds)."""
        if self._latest and latest_total < self._latest[-1]:
            # Offsets went back (topic re-created): the history no longer applies.
            self._times.clear()
            self._latest.clear()
        self._times.append(now_seconds)
        self._latest.append(latest_total)
        lag_events = max(0, latest_total - end_total)
        if lag_events == 0:
            return 0, 0.0
        # The first sample at which the record at end_total (the oldest unread)
        # was available: latest_total > end_total.
        first = bisect.bisect_right(self._latest, end_total)
        became_available = self._times[first] if first < len(self._times) else now_seconds
        return lag_events, max(0.0, now_seconds - became_available)


class JobListener(StreamingQueryListener):
    """Feeds :class:`Metrics` from one query's events (others are ignored) and
    calls ``on_terminated`` once that query stops."""

    def __init__(
        self,
        metrics: Metrics,
        query_name: str,
        topic: str,
        on_terminated: Callable[[], None] = lambda: None,
        clock: Callable[[], float] = time.time,
    ):
        self.metrics = metrics
        self.query_name = query_name
        self.topic = topic
        self.on_terminated = on_terminated
        self.clock = clock
        self.lag = LagEstimator()
        self.query_id: Any = None  # Idle and terminated events carry only the id
        self._java: Any = None  # the JVM's handle on this listener, made when it is added
        # Exported at 0 from the start, so that increase() sees the first loss.
        metrics.source_offsets_lost.labels(topic=topic)

    @property
    def _jlistener(self) -> Any:
        # What StreamingQueryManager.addListener registers with the JVM: pyspark's
        # wrapper around an object that converts the JVM's events, here ours.
        if self._java is None:
            from pyspark import SparkContext

            assert SparkContext._jvm is not None, "a listener is added to a running session"
            self._java = SparkContext._jvm.PythonStreamingQueryListenerWrapper(_ProgressAsJson(self))
        return self._java

    def onQueryStarted(self, event: Any) -> None:
        if event.name == self.query_name:
            self.query_id = event.id
            self.metrics.query_running.set(1)
            # No batch yet: staleness is measured from the start, not from 1970.
            self.metrics.last_batch.set(self.clock())

    def onQueryProgress(self, event: Any) -> None:
        progress = event.progress
        if progress.name != self.query_name:
            return
        try:
            self._progress(progress)
        except Exception:  # a listener error must never reach the query
            log.exception("could not turn query progress into metrics")

    def onQueryIdle(self, event: Any) -> None:
        if event.id == self.query_id:
            self.metrics.last_batch.set(self.clock())

    def onQueryTerminated(self, event: Any) -> None:
        if event.id != self.query_id:
            return
        self.metrics.query_running.set(0)
        if event.exception:
            self.metrics.query_failures.inc()
        try:
            self.on_terminated()
        except Exception:
            log.exception("could not clean up after the query stopped")

    def _progress(self, progress: Any) -> None:
        m = self.metrics
        now = self.clock()
        m.batches.inc()
        m.batch_duration.observe(progress.batchDuration / 1000)
        m.last_batch.set(now)
        m.input_rate.set(_rate(progress.inputRowsPerSecond))
        m.processing_rate.set(_rate(progress.processedRowsPerSecond))
        lost = progress.observedMetrics.get(LOST_OFFSETS_METRIC)
        lost_ranges = list(lost.ranges) if lost is not None else []
        # Spark counts the source's loss rows as input rows; they are not records.
        m.source_events.labels(topic=self.topic).inc(progress.numInputRows - len(lost_ranges))
        for lost_range in lost_ranges:
            # A Row here (pyspark's conversion, the tests) or a dict (a report read as JSON).
            self._report_lost(lost_range["partition"], lost_range["first"], lost_range["offsets"])
        for source in progress.sources:
            latest = offsets_total(source.latestOffset)
            end = offsets_total(source.endOffset)
            if latest is None or end is None:
                continue
            lag_events, lag_seconds = self.lag.observe(now, latest, end)
            m.source_lag_events.labels(topic=self.topic).set(lag_events)
            m.source_lag_seconds.labels(topic=self.topic).set(lag_seconds)

    def _report_lost(self, partition: int, first: int, count: int) -> None:
        log.warning(
            "topic %s partition %d: %d offsets [%d, %d) vanished before the job read them (retention, "
            "truncation, or the topic was deleted and recreated); their records were not judged",
            self.topic,
            partition,
            count,
            first,
            first + count,
        )
        self.metrics.source_offsets_lost.labels(topic=self.topic).inc(count)


class _ProgressAsJson(JStreamingQueryListener):
    """The JVM's side of a listener, as pyspark's, except that a progress
    report is read as its JSON in one call and built with pyspark's
    ``fromJson`` (the form ``StreamingQuery.lastProgress`` returns)."""

    def onQueryProgress(self, jevent: Any) -> None:
        try:
            event = QueryProgressEvent.fromJson({"progress": json.loads(jevent.progress().json())})
        except KeyError:
            # Spark leaves a rate that is not a number out of the JSON, which
            # pyspark's fromJson requires of a source: convert that report its way.
            super().onQueryProgress(jevent)
            return
        self.pylistener.onQueryProgress(event)


def _rate(value: float | None) -> float:
    # Spark reports NaN for a batch with no input.
    return 0.0 if value is None or value != value else float(value)
