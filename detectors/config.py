"""Detector settings: typed, validated once, shared by replay and the streaming job."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class DetectorConfig:
    """How much the detector tolerates before it calls an outcome a violation.

    grace_ms: how long after a change of the authoritative view a broker may
        still act on the previous view (brokers apply metadata asynchronously),
        and how far one source's clock may run behind another's. Rules that
        compare a broker's behaviour with the view accept any state the view
        held within ``[ts_ms - grace_ms, ts_ms + grace_ms]``.
    lateness_ms: how far out of ``ts_ms`` order events may arrive. Judgments wait
        until the event-time watermark (newest ``ts_ms`` seen minus this) has
        passed ``ts_ms + grace_ms``, so every event that can change a verdict is
        in before the verdict is made. Replay of merged files needs none; a
        streaming job reading several shippers needs their worst skew.
    quorum_fetch_timeout_ms: Kafka's ``quorum.fetch.timeout.ms`` (KIP-595); a
        quorum leader that keeps acting as leader 1.5x this long without fetches
        from a majority is a zombie.
    """

    grace_ms: int = 2000
    lateness_ms: int = 1000
    quorum_fetch_timeout_ms: int = 2000

    def __post_init__(self) -> None:
        for name in ("grace_ms", "lateness_ms", "quorum_fetch_timeout_ms"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 0:
                raise ValueError(f"{name} must be a non-negative integer of milliseconds, got {value!r}")

    @property
    def judge_delay_ms(self) -> int:
        """How long after its ``ts_ms`` an event is judged, in event time."""
        return self.grace_ms + self.lateness_ms

    @property
    def retention_ms(self) -> int:
        """How much view history is kept behind the watermark for judgments."""
        return 2 * self.grace_ms + self.lateness_ms
