"""Where the probe's alerts go: the same sinks as the job's (SPEC section 3) -- the
console as JSON lines, the alerts topic (keyed by cluster, with the alert id in the
``fencewatch-id`` header), the webhook outbox. A deviation met again in a later
round has the same alert id (detectors.probe_rules) and is delivered once per
process; the outbox and the topic's readers de-duplicate across restarts."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, TextIO

import orjson

from detectors.alerts import Alert

if TYPE_CHECKING:
    from webhooks import Dispatcher


class AlertTopic(Protocol):
    """The alerts topic as streaming.sinks.TopicSink writes it; the command passes one
    in (the probe does not import the job)."""

    def undelivered(self, rows: Iterable[Any]) -> list[Any]: ...

    def publish(self, rows: list[Any], batch_id: int) -> None: ...

    def close(self) -> None: ...


@dataclass(frozen=True, slots=True)
class _Row:
    """What streaming.sinks.TopicSink publishes: an id, a key and a payload."""

    id: str
    cluster: str
    payload: str


class AlertSinks:
    """Delivers alerts to each sink given (None: not used)."""

    def __init__(
        self,
        console: TextIO | None,
        topic: AlertTopic | None = None,
        webhooks: Dispatcher | None = None,
    ):
        self.console = console
        self.topic = topic
        self.webhooks = webhooks
        self._printed: set[str] = set()

    def deliver(self, alerts: list[Alert], round_number: int) -> None:
        """Into the webhook outbox first (durable), then the topic, then the console.
        DeliveryFailed (streaming.sinks) propagates when the topic does not take them."""
        if not alerts:
            return
        dicts = [a.to_dict() for a in alerts]
        if self.webhooks is not None:
            self.webhooks.enqueue(dicts)
        rows = [
            _Row(a.alert_id, a.cluster, orjson.dumps(d).decode()) for a, d in zip(alerts, dicts, strict=True)
        ]
        if self.topic is not None:
            self.topic.publish(self.topic.undelivered(rows), round_number)
        if self.console is not None:
            for row in rows:
                if row.id not in self._printed:
                    self._printed.add(row.id)
                    print(row.payload, file=self.console, flush=True)

    def close(self) -> None:
        if self.topic is not None:
            self.topic.close()
