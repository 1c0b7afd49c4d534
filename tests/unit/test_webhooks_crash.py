"""Kill -9 during delivery loses no alert: a child process delivers an outbox
to a real HTTP endpoint and is SIGKILLed while a request is in flight; a fresh
dispatcher on the same file then delivers the rest, the interrupted one again."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

from prometheus_client import CollectorRegistry
from webhook_endpoints import Script, ScriptedEndpoint

from streaming.metrics import Metrics
from webhooks import Dispatcher, Endpoint
from webhooks.outbox import DELIVERED, PENDING

REPO = Path(__file__).resolve().parents[2]

# The child: the job's dispatcher threads on the outbox, until it is killed.
CHILD = """
import sys, threading
from prometheus_client import CollectorRegistry
from streaming.metrics import Metrics
from webhooks import Dispatcher, Endpoint

outbox, url = sys.argv[1:]
endpoint = Endpoint("oncall", url, rate_per_second=1000.0, burst=1000, timeout_seconds=120.0)
Dispatcher([endpoint], outbox, Metrics(CollectorRegistry())).start()
threading.Event().wait()
"""


def wait_for(predicate: Callable[[], bool], timeout_seconds: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_seconds
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout_seconds} s")
        time.sleep(0.02)


def test_kill_9_during_delivery_then_a_fresh_dispatcher_delivers_every_alert(tmp_path: Path) -> None:
    outbox = tmp_path / "outbox.sqlite"
    scripted = ScriptedEndpoint()
    ids = [f"alert-{n:03d}" for n in range(30)]
    in_flight = ids[9]
    release = threading.Event()
    # The tenth request gets no answer until the test says so: the child dies waiting for it.
    scripted.script(in_flight, Script(200, hold=release))
    endpoint = Endpoint("oncall", scripted.url(), rate_per_second=1000.0, burst=1000)
    alerts = [{"alert_id": i, "rule": "QUORUM_TWO_LEADERS_IN_EPOCH", "severity": "critical"} for i in ids]
    queued = Dispatcher([endpoint], outbox, Metrics(CollectorRegistry()))
    assert queued.enqueue(alerts) == 30
    queued.stop()

    child = subprocess.Popen([sys.executable, "-c", CHILD, str(outbox), scripted.url()], cwd=REPO)
    try:
        wait_for(
            lambda: (scripted.count(in_flight) == 1 and scripted.in_flight == 1) or child.poll() is not None
        )
        assert child.poll() is None, f"the delivering child exited early with {child.returncode}"
        os.kill(child.pid, signal.SIGKILL)
        assert child.wait(30) == -signal.SIGKILL
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(30)
        release.set()

    try:
        with sqlite3.connect(outbox) as conn:
            assert conn.execute("PRAGMA integrity_check").fetchone() == ("ok",)
        conn.close()
        fresh = Dispatcher([endpoint], outbox, Metrics(CollectorRegistry()))
        try:
            # What the killed process committed survived it; the alert in flight was not marked.
            states = fresh.outbox.states("oncall")
            assert [i for i in ids if states[i] == DELIVERED] == ids[:9]
            assert [i for i in ids if states[i] == PENDING] == ids[9:]
            fresh.start()
            wait_for(lambda: fresh.backlog() == {"oncall": 0})
            assert set(fresh.outbox.states("oncall").values()) == {DELIVERED}
        finally:
            fresh.stop()
    finally:
        scripted.stop()
    assert sorted(set(scripted.requests)) == ids  # every alert reached the endpoint ...
    assert {i: scripted.count(i) for i in ids if scripted.count(i) != 1} == {
        in_flight: 2
    }  # ... once, but one
