"""Stopping a command from outside: SIGTERM (``timeout``, ``kill``, an
orchestrator) is taken as Ctrl-C, so the command can say how far it got
instead of vanishing without a word."""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Callable, Iterator
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


@contextlib.contextmanager
def signals_set(stop: threading.Event) -> Iterator[None]:
    """Inside the block SIGINT and SIGTERM set ``stop`` instead of raising, so a loop
    that checks it ends between two pieces of work. A KeyboardInterrupt raised
    mid-work can land inside a close or a lock's hold and leave a non-daemon thread
    running, which the interpreter then waits for at exit.

    The handler sets ``stop`` from a thread of its own: it runs on the main thread,
    which may hold ``stop``'s lock at that moment (inside ``stop.wait``), and the lock
    is not reentrant. Not the main thread: nothing is installed."""

    def handler(signum: int, frame: Any) -> None:
        threading.Thread(target=stop.set, name="signal-stop", daemon=True).start()

    try:
        previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)}
    except ValueError:
        yield
        return
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


@contextlib.contextmanager
def stop_on_signals(stop: Callable[[], None]) -> Iterator[None]:
    """SIGTERM and SIGINT ask for a clean stop (flush, save the position) instead of dying."""
    previous: dict[signal.Signals, Any] = {}

    def handler(signum: int, frame: Any) -> None:
        stop()

    for signum in (signal.SIGTERM, signal.SIGINT):
        # Outside the main thread signals cannot be set: leave them alone.
        with contextlib.suppress(ValueError):
            previous[signum] = signal.signal(signum, handler)
    try:
        yield
    finally:
        for signum, old in previous.items():
            signal.signal(signum, old)
