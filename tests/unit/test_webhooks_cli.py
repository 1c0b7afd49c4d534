"""``fencewatch webhooks parked|resend`` (fencewatch/webhooks.py), run as a user
runs it: a subprocess on the outbox of a dispatcher that is delivering meanwhile
against a real HTTP endpoint."""

from __future__ import annotations

import os
import random
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import orjson
import pytest
from prometheus_client import CollectorRegistry
from webhook_endpoints import Script, ScriptedEndpoint

from streaming.metrics import Metrics
from webhooks import Dispatcher, Endpoint
from webhooks.outbox import DELIVERED, PARKED

REPO = Path(__file__).resolve().parents[2]


def fencewatch(*argv: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "FENCEWATCH_WEBHOOK_OUTBOX"}
    return subprocess.run(
        [sys.executable, "-m", "fencewatch", *argv],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
        env=env,
    )


def wait_for(predicate: Callable[[], bool], timeout_seconds: float = 15.0) -> None:
    deadline = time.monotonic() + timeout_seconds
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout_seconds} s")
        time.sleep(0.05)


def alert(alert_id: str, status: str = "firing") -> dict[str, object]:
    return {
        "alert_id": alert_id,
        "rule": "LEADER_INELIGIBLE_ELECTED",
        "severity": "critical",
        "status": status,
        "cluster": "prod",
        "message": "broker 3 was elected leader while fenced",
    }


@pytest.fixture
def scripted() -> Iterator[ScriptedEndpoint]:
    endpoint = ScriptedEndpoint()
    yield endpoint
    endpoint.stop()


@pytest.fixture
def running(tmp_path: Path, scripted: ScriptedEndpoint) -> Iterator[Dispatcher]:
    """A started dispatcher (the running job's) delivering to ``scripted`` as endpoint "oncall"."""
    dispatcher = Dispatcher(
        [Endpoint("oncall", scripted.url(), rate_per_second=100.0, burst=100)],
        tmp_path / "outbox.sqlite",
        Metrics(CollectorRegistry()),
        rng=random.Random(1),
    )
    dispatcher.start()
    yield dispatcher
    dispatcher.stop()


def test_parked_lists_the_row_and_resend_has_the_running_job_deliver_it(
    scripted: ScriptedEndpoint, running: Dispatcher, tmp_path: Path
) -> None:
    outbox = str(tmp_path / "outbox.sqlite")
    scripted.script("a-missing", Script(404, body="no hook at this path\n"))
    running.enqueue([alert("a-missing", status="resolved"), alert("a-fine")])
    wait_for(lambda: running.outbox.states("oncall") == {"a-missing": PARKED, "a-fine": DELIVERED})

    listed = fencewatch("webhooks", "parked", "--outbox", outbox)
    assert listed.returncode == 0, listed.stderr
    header, row = listed.stdout.splitlines()
    assert header.split()[:5] == ["ENDPOINT", "ALERT", "ID", "RULE", "STATUS"]
    assert row.split()[:6] == [
        "oncall",
        "a-missing",
        "LEADER_INELIGIBLE_ELECTED",
        "resolved",
        "rejected",
        "1",
    ]
    assert "HTTP 404 no hook at this path" in row
    assert "a-fine" not in listed.stdout
    assert "1 parked alert(s)" in listed.stderr

    as_json = fencewatch("webhooks", "parked", "--outbox", outbox, "--endpoint", "oncall", "--json")
    assert as_json.returncode == 0, as_json.stderr
    (record,) = [orjson.loads(line) for line in as_json.stdout.splitlines()]
    shown = ("endpoint", "alert_id", "status", "reason", "attempts", "last_status", "last_body")
    assert {k: record[k] for k in shown} == {
        "endpoint": "oncall",
        "alert_id": "a-missing",
        "status": "resolved",
        "reason": "rejected",
        "attempts": 1,
        "last_status": 404,
        "last_body": "no hook at this path",
    }

    scripted.script("a-missing", Script(200))  # the receiver got its route back
    resent = fencewatch("webhooks", "resend", "--outbox", outbox, "--alert-id", "a-missing")
    assert resent.returncode == 0, resent.stderr
    assert resent.stdout.splitlines() == ["oncall\ta-missing"]
    # The command only moved it: the running dispatcher delivers it.
    wait_for(lambda: running.outbox.states("oncall")["a-missing"] == DELIVERED)
    assert scripted.count("a-missing") == 2

    after = fencewatch("webhooks", "parked", "--outbox", outbox)
    assert (after.returncode, after.stdout) == (0, "")
    assert "0 parked alert(s)" in after.stderr


def test_resend_of_a_row_that_is_not_parked_names_it_and_fails(
    scripted: ScriptedEndpoint, running: Dispatcher, tmp_path: Path
) -> None:
    outbox = str(tmp_path / "outbox.sqlite")
    running.enqueue([alert("a-fine")])
    wait_for(lambda: running.outbox.states("oncall") == {"a-fine": DELIVERED})
    done = fencewatch("webhooks", "resend", "--outbox", outbox, "--alert-id", "a-fine", "a-unknown")
    assert done.returncode == 1
    assert "not parked (unknown, pending or delivered): a-fine, a-unknown" in done.stderr
    assert running.outbox.states("oncall") == {"a-fine": DELIVERED}
    wrong = fencewatch("webhooks", "parked", "--outbox", outbox, "--endpoint", "on-call")
    assert wrong.returncode == 1
    assert "the outbox has no endpoint 'on-call'; it has: oncall" in wrong.stderr


@pytest.mark.parametrize("action", ["parked", "resend"])
def test_an_unusable_outbox_is_one_line_and_exit_1_and_is_never_created(action: str, tmp_path: Path) -> None:
    missing = tmp_path / "missing.sqlite"
    done = fencewatch("webhooks", action, "--outbox", str(missing))
    assert done.returncode == 1
    assert done.stderr.count("\n") == 1 and f"no outbox at {missing}" in done.stderr
    assert not missing.exists()
    text = tmp_path / "notes.txt"
    text.write_text("these are notes, not an outbox; long enough for a header of one hundred bytes or so.\n")
    done = fencewatch("webhooks", action, "--outbox", str(text))
    assert done.returncode == 1
    assert done.stderr.count("\n") == 1 and "is not a usable webhook outbox" in done.stderr


def test_the_outbox_is_required() -> None:
    done = fencewatch("webhooks", "parked")
    assert done.returncode == 2
    assert "--outbox" in done.stderr
