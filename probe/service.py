"""Probe rounds as a service: each round's metrics counted and its alerts delivered,
once (``fencewatch probe --once``) or every few seconds as a canary (``--interval``,
``fencewatch run --probe-interval``)."""

from __future__ import annotations

import threading
import time
from typing import TextIO

from probe.client import ClusterRefused, Unanswered
from probe.report import ProbeMetrics, record
from probe.round import Prober, RoundReport
from probe.sinks import AlertSinks


class ProbeService:
    """Rounds of ``prober``: each round's metrics counted and alerts delivered.
    ``delivery_failed``: what the sinks raise when the alerts topic does not take a
    round's alerts (streaming.sinks.DeliveryFailed); a canary says it and goes on."""

    def __init__(
        self,
        prober: Prober,
        sinks: AlertSinks,
        metrics: ProbeMetrics | None,
        delivery_failed: type[Exception],
    ):
        self.prober = prober
        self.sinks = sinks
        self.metrics = metrics
        self.delivery_failed = delivery_failed
        self.rounds = 0

    def once(self) -> RoundReport:
        report = self.prober.round()
        self.rounds += 1
        if self.metrics is not None:
            record(self.metrics, report, time.time())
        self.sinks.deliver(report.alerts, self.rounds)
        return report

    def every(self, interval_seconds: float, stop: threading.Event, say: TextIO) -> None:
        """A round every ``interval_seconds`` until ``stop``; a failed round is said in
        one line and the next one tries again."""
        while not stop.is_set():
            try:
                report = self.once()
                if report.alerts:
                    counts = ", ".join(f"{r} {n}" for r, n in sorted(report.rule_counts().items()))
                    print(f"fencewatch probe: round {self.rounds}: {counts}", file=say, flush=True)
            except (Unanswered, ClusterRefused, self.delivery_failed) as exc:
                print(f"fencewatch probe: round {self.rounds + 1} failed: {exc}", file=say, flush=True)
            stop.wait(interval_seconds)
