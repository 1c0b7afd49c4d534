"""The webhook receiver on its own, in-process and as ``fencewatch receive-webhooks``,
over real HTTP on 127.0.0.1."""

from __future__ import annotations

import io
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from streaming.webhooks.receiver import WebhookReceiver
from streaming.webhooks.signing import ALERT_ID_HEADER, sign

SECRET = b"receiver-test-secret"
ALERT = {"alert_id": "abc123", "rule": "QUORUM_DOUBLE_VOTE", "severity": "critical", "message": "m"}
# What Alertmanager itself POSTs: no fencewatch headers, no signature.
AM_POST = {
    "version": "4",
    "groupKey": '{}:{alertname="FencewatchAlertsRaised"}',
    "truncatedAlerts": 0,
    "status": "firing",
    "receiver": "fencewatch",
    "groupLabels": {"alertname": "FencewatchAlertsRaised"},
    "commonLabels": {},
    "commonAnnotations": {},
    "externalURL": "http://alertmanager:9093",
    "alerts": [],
}


@pytest.fixture
def receiver() -> Iterator[WebhookReceiver]:
    with WebhookReceiver(0, secret=SECRET, output=io.StringIO()) as running:
        yield running


def post(url: str, body: Any, secret: bytes | None = SECRET, alert_id: str | None = None) -> httpx.Response:
    data = orjson.dumps(body)
    headers = {"Content-Type": "application/json"}
    if secret is not None:
        headers.update(sign(secret, int(time.time()), data))
    if alert_id is not None:
        headers[ALERT_ID_HEADER] = alert_id
    return httpx.post(url, content=data, headers=headers, timeout=5.0)


def test_a_repeated_alert_id_gets_200_but_is_recorded_once_per_path(receiver: WebhookReceiver) -> None:
    for _ in range(3):
        assert post(receiver.url("/a"), ALERT, alert_id="abc123").status_code == 200
    assert post(receiver.url("/b"), ALERT, alert_id="abc123").status_code == 200
    assert [r["path"] for r in receiver.received] == ["/a", "/b"]
    assert receiver.duplicates == 2
    assert isinstance(receiver.output, io.StringIO)
    lines = [orjson.loads(line) for line in receiver.output.getvalue().splitlines()]
    assert [(line["path"], line["format"], line["body"]) for line in lines] == [
        ("/a", "json", ALERT),
        ("/b", "json", ALERT),
    ]
    assert lines[0]["headers"][ALERT_ID_HEADER] == "abc123"


def test_alertmanagers_own_unsigned_posts_are_accepted_on_their_path_only(receiver: WebhookReceiver) -> None:
    assert post(receiver.url("/alertmanager"), AM_POST, secret=None).status_code == 200
    assert post(receiver.url("/other"), AM_POST, secret=None).status_code == 401
    assert [(r["path"], r["format"]) for r in receiver.received] == [("/alertmanager", "alertmanager")]
    assert receiver.rejected == 1


def test_bad_signatures_and_unknown_bodies_are_refused(receiver: WebhookReceiver) -> None:
    assert post(receiver.url("/"), ALERT, secret=b"wrong").status_code == 401
    stale = orjson.dumps(ALERT)
    headers = sign(SECRET, int(time.time()) - 3600, stale)
    assert httpx.post(receiver.url("/"), content=stale, headers=headers).status_code == 401
    assert post(receiver.url("/"), {"hello": "world"}).status_code == 400
    assert post(receiver.url("/"), {"text": "[CRITICAL] R cluster c1: m"}).status_code == 200
    assert [r["format"] for r in receiver.received] == ["slack"]


def test_answer_with_stands_in_for_a_failing_endpoint(receiver: WebhookReceiver) -> None:
    receiver.answer_with(503, retry_after_seconds=7)
    response = post(receiver.url("/"), ALERT, alert_id="x")
    assert (response.status_code, response.headers["Retry-After"]) == (503, "7")
    receiver.answer_with(None)
    assert post(receiver.url("/"), ALERT, alert_id="x").status_code == 200
    assert len(receiver.received) == 1 and receiver.requests == 2


def test_the_cli_receives_verifies_and_writes_json_lines(tmp_path: Path) -> None:
    output = tmp_path / "received.jsonl"
    secret_file = tmp_path / "secret"
    secret_file.write_text(SECRET.decode() + "\n")
    env = {k: v for k, v in os.environ.items() if k != "FENCEWATCH_WEBHOOK_SECRET"}
    command = [sys.executable, "-m", "fencewatch", "receive-webhooks", "--port", "0"]
    proc = subprocess.Popen(
        [*command, "--output", str(output), "--secret-file", str(secret_file)],
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        assert proc.stderr is not None
        first = proc.stderr.readline()  # blocks until it listens (or dies: then it is empty)
        assert "listening on 127.0.0.1:" in first and "signatures checked" in first, first
        port = int(first.split("127.0.0.1:")[1].split(",")[0])
        url = f"http://127.0.0.1:{port}/hook"
        assert post(url, ALERT, alert_id="abc123").status_code == 200
        assert post(url, ALERT, alert_id="abc123").status_code == 200
        assert post(url, ALERT, secret=b"wrong", alert_id="zzz").status_code == 401
        assert SECRET.decode() not in first
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=10) == 0
    lines = [orjson.loads(line) for line in output.read_text().splitlines()]
    assert [(line["path"], line["body"]) for line in lines] == [("/hook", ALERT)]
    assert proc.stderr is not None
    assert "1 recorded, 1 duplicates, 1 rejected" in proc.stderr.read()
