"""Stopping a command from outside: SIGTERM (``timeout``, ``kill``, an
orchestrator) is taken as Ctrl-C, so the command can say how far it got
instead of vanishing without a word."""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Iterator
from typing import Any


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


@contextlib.contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """Inside the block SIGTERM raises KeyboardInterrupt; the old handler comes back after."""
    try:
        previous = signal.signal(signal.SIGTERM, _interrupt)
    except ValueError:  # not the main thread: signals are not ours to set
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
