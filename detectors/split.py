"""One cluster judged as the streaming job judges it with several buckets, in
one process: each envelope goes to the detectors of the buckets
:func:`detectors.buckets.buckets_of` names, the first as its home, as the job's
routing does before its shuffle (streaming/routing.py is held to
``buckets_of``). Tests and benchmarks use it to compare a layout with the
whole cluster's detector without Spark."""

from __future__ import annotations

from collections.abc import Callable

from detectors.alerts import Alert
from detectors.buckets import Bucket, buckets_of
from detectors.config import DetectorConfig
from detectors.engine import Detector
from detectors.envelope import DeadLetter, Envelope
from detectors.stats import merge_buckets


class Split:
    """One cluster's detectors, one per bucket, fed as the streaming job feeds them."""

    def __init__(self, count: int, config: DetectorConfig, now_ms: Callable[[], int] = lambda: 0):
        self.count = count
        self.detectors = [Detector(config, now_ms=now_ms, bucket=Bucket(i, count)) for i in range(count)]
        self.dead_letters: list[DeadLetter] = []
        self.own_records = [0] * count  # records a bucket received and not every bucket did

    def ingest(self, env: Envelope) -> None:
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
