"""A stop asked by a signal: ``signals_set`` turns SIGINT and SIGTERM into an
event a loop checks between pieces of work, and puts the old handlers back."""

from __future__ import annotations

import os
import signal
import threading

import pytest

from fencewatch.interrupts import signals_set


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_sets_the_event_and_raises_nothing(signum: signal.Signals) -> None:
    stop = threading.Event()
    before = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    with signals_set(stop):
        os.kill(os.getpid(), signum)  # a KeyboardInterrupt would end the test here
        assert stop.wait(10), "the signal did not set the event"
    assert {sig: signal.getsignal(sig) for sig in before} == before


def test_off_the_main_thread_nothing_is_installed() -> None:
    stop = threading.Event()
    seen: list[object] = []

    def enter() -> None:
        with signals_set(stop):
            seen.append(signal.getsignal(signal.SIGTERM))

    before = signal.getsignal(signal.SIGTERM)
    worker = threading.Thread(target=enter)
    worker.start()
    worker.join(10)
    assert seen == [before] and not stop.is_set()
