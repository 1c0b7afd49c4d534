"""One cluster judged as the streaming job judges it with several buckets, in
one process: each envelope goes to the detectors of the buckets
:func:`detectors.buckets.buckets_of` names, the first as its home, as the job's
routing does before its shuffle (streaming/routing.py is held to
``buckets_of``). Tests and benchmarks use it to compare a layout with the
whole cluster's detector without Spark."""

from __future__ import annotations

from collections.abc import Callable

from detectors import clock_exchange
from detectors.alerts import Alert
from detectors.buckets import Bucket, buckets_of
from detectors.config import DetectorConfig
from detectors.engine import Detector
from detectors.envelope import DeadLetter, Envelope
from detectors.stats import merge_buckets


class Split:
    """One cluster's detectors, one per bucket, fed as the streaming job feeds them."""

    def __init__(
        self,
        count: int,
        config: DetectorConfig,
        now_ms: Callable[[], int] = lambda: 0,
        share_clocks: bool = False,
    ):
        """``share_clocks``: the buckets share their clock evidence at each
        :meth:`exchange`, as the job's do after each micro-batch (detectors.clock_exchange)."""
        self.count = count
        self.detectors = [Detector(config, now_ms=now_ms, bucket=Bucket(i, count)) for i in range(count)]
        self.dead_letters: list[DeadLetter] = []
        self.own_records = [0] * count  # records a bucket received and not every bucket did
        self.share_clocks = share_clocks
        self._exchanged = 0

    def exchange(self, cluster: str) -> list[Envelope]:
        """Share what each bucket measured of ``cluster``'s clocks since the last
        exchange: the clock evidence records the job publishes after a
        micro-batch, ingested by every bucket as the job's topic delivers them
        (returned, for a test to deliver again)."""
        bodies = []
        for detector in self.detectors:
            if cluster in detector.clusters:
                body = clock_exchange.take_shared(detector.cluster(cluster))
                if body is not None:
                    bodies.append(body)
        out = []
        for body in clock_exchange.merge(bodies):
            self._exchanged += 1
            env = Envelope(
                cluster,
                None,
                clock_exchange.envelope_body_time(body),
                clock_exchange.CLOCK_EVIDENCE,
                None,
                body,
                f"clock-exchange:{self._exchanged}",
            )
            self.ingest(env)
            out.append(env)
        return out

    def ingest(self, env: Envelope) -> None:
        if self.share_clocks and env.cluster not in self.detectors[0].clusters:
            for detector in self.detectors:
                clock_exchange.share(detector.cluster(env.cluster))
        targets = buckets_of(env, self.count)
        if len(targets) < self.count:
            for b in targets:
                self.own_records[b] += 1
        for b in targets:
            self.dead_letters.extend(self.detectors[b].ingest(env, home=b == targets[0]))

    def finish(self) -> list[Alert]:
        """Flush every bucket: the alerts of all, in bucket order."""
        for detector in self.detectors:
            self.dead_letters.extend(detector.flush())
        return [a for d in self.detectors for a in d.drain()]

    def snapshot(self, cluster: str) -> dict[str, object]:
        """The cluster's snapshot as the job's metrics see it (stats.merge_buckets)."""
        return merge_buckets([d.snapshot(cluster) for d in self.detectors if cluster in d.clusters])
