"""The embedded broker that carries a local command's event, alerts and
dead-letter topics (``fencewatch demo``, ``fencewatch kafka-lab``): started for
the command's life, and one that cannot start ends the command in one line."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from fencewatch.options import fail

if TYPE_CHECKING:
    from streaming.broker import EmbeddedBroker


@contextmanager
def embedded_broker(prog: str, todo: str) -> Iterator[EmbeddedBroker]:
    """A started embedded broker, stopped on the way out; ``todo`` says what the
    user does when it does not start."""
    from streaming.broker import BrokerError, EmbeddedBroker

    broker = EmbeddedBroker()
    try:
        broker.start()
    except BrokerError as exc:
        fail(prog, f"the embedded broker did not start: {exc}", todo)
    try:
        yield broker
    finally:
        broker.stop()
