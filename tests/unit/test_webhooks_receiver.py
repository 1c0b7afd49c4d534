"""The webhook receiver on its own, in-process and as ``fencewatch receive-webhooks``,
over real HTTP on 127.0.0.1: what it records, every forgery it must refuse, and
the clients (stalled, idle, oversized) it must outlast."""

from __future__ import annotations

import io
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from webhooks.http_server import ServerLimits
from webhooks.receiver import WebhookReceiver
from webhooks.signing import ALERT_ID_HEADER, SIGNATURE_HEADER, TIMESTAMP_HEADER, sign

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
BODIES = {"json": ALERT, "alertmanager": AM_POST, "slack": {"text": "[CRITICAL] QUORUM_DOUBLE_VOTE c1: m"}}
ROUTES = ("/", "/alertmanager", "/fencewatch", "/fencewatch-alertmanager", "/slack")
# Short enough that a test waits for them, long enough that a legitimate request never meets
# them and that opening a few hundred stalled connections takes less time on a busy machine.
QUICK = ServerLimits(body_timeout_seconds=5.0, idle_timeout_seconds=2.0)


@pytest.fixture
def receiver() -> Iterator[WebhookReceiver]:
    with WebhookReceiver(0, secret=SECRET, output=io.StringIO()) as running:
        yield running


@pytest.fixture
def make_receiver() -> Iterator[Callable[..., WebhookReceiver]]:
    """``make_receiver(**kwargs)``: a running signed receiver, stopped after the test."""
    with ExitStack() as stack:
        yield lambda **kwargs: stack.enter_context(WebhookReceiver(0, secret=SECRET, **kwargs))


def signed(body: Any, alert_id: str = "abc123", at: float | None = None) -> dict[str, str]:
    """The headers of ``body`` as JSON, signed now (or ``at``)."""
    data = orjson.dumps(body)
    return {"Content-Type": "application/json", **sign(SECRET, int(at or time.time()), alert_id, data)}


def post(url: str, body: Any, secret: bytes | None = SECRET, alert_id: str | None = None) -> httpx.Response:
    """POST ``body`` as JSON, signed with ``secret`` (None: unsigned, the alert id alone)."""
    data = orjson.dumps(body)
    sent = {"Content-Type": "application/json"}
    if secret is not None:
        sent.update(sign(secret, int(time.time()), alert_id or "abc123", data))
    elif alert_id is not None:
        sent[ALERT_ID_HEADER] = alert_id
    return httpx.post(url, content=data, headers=sent, timeout=5.0)


def wait_until(condition: Callable[[], bool], what: str, seconds: float = 20.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, f"not within {seconds} s: {what}"
        time.sleep(0.02)


def one_line(response: httpx.Response) -> str:
    """The answer's reason, which must be one line and no traceback."""
    text = response.text
    assert text.endswith("\n") and text.count("\n") == 1 and "Traceback" not in text, text
    return text


def stall_mid_body(port: int, count: int) -> list[socket.socket]:
    """``count`` connections that send their headers and 2 of 100 declared body bytes, then stop."""
    stalled = []
    for _ in range(count):
        conn = socket.create_connection(("127.0.0.1", port), timeout=10)
        conn.sendall(b"POST /hook HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{}")
        stalled.append(conn)
    return stalled


def answer_to(conn: socket.socket) -> bytes:
    """Everything the server sends before it closes ``conn`` (b"": closed without a word)."""
    chunks = []
    while chunk := conn.recv(4096):
        chunks.append(chunk)
    return b"".join(chunks)


# ---- what it records ------------------------------------------------------------------------


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
    assert lines[0]["headers"][SIGNATURE_HEADER].startswith("v1=")


def test_each_format_signed_is_accepted_on_any_path(receiver: WebhookReceiver) -> None:
    for n, (fmt, body) in enumerate(BODIES.items()):
        assert post(receiver.url(f"/{fmt}"), body, alert_id=f"id-{n}").status_code == 200
    assert [(r["path"], r["format"]) for r in receiver.received] == [(f"/{f}", f) for f in BODIES]
    assert receiver.rejected == 0


def test_without_a_secret_unsigned_posts_are_accepted_alertmanagers_own_included() -> None:
    with WebhookReceiver(0) as unsigned:
        assert post(unsigned.url("/alertmanager"), AM_POST, secret=None).status_code == 200
        assert post(unsigned.url("/hook"), ALERT, secret=None, alert_id="x1").status_code == 200
        assert post(unsigned.url("/hook"), ALERT, secret=None, alert_id="x1").status_code == 200
        assert [(r["path"], r["format"]) for r in unsigned.received] == [
            ("/alertmanager", "alertmanager"),
            ("/hook", "json"),
        ]
        assert unsigned.duplicates == 1


def test_answer_with_stands_in_for_a_failing_endpoint(receiver: WebhookReceiver) -> None:
    receiver.answer_with(503, retry_after_seconds=7)
    response = post(receiver.url("/"), ALERT, alert_id="x")
    assert (response.status_code, response.headers["Retry-After"]) == (503, "7")
    receiver.answer_with(None)
    assert post(receiver.url("/"), ALERT, alert_id="x").status_code == 200
    assert len(receiver.received) == 1 and receiver.requests == 2


def test_unknown_bodies_are_refused_with_a_reason(receiver: WebhookReceiver) -> None:
    response = post(receiver.url("/"), {"hello": "world"})
    assert response.status_code == 400 and "none of json" in one_line(response)
    not_utf8 = b'{"text": "\xff\xfe"}'
    headers = sign(SECRET, int(time.time()), "abc123", not_utf8)
    response = httpx.post(receiver.url("/"), content=not_utf8, headers=headers)
    assert response.status_code == 400 and "not UTF-8 JSON" in one_line(response)
    assert receiver.received == [] and receiver.rejected == 2


# ---- forgeries: with a secret, nothing unsigned or altered is recorded -----------------------


@pytest.mark.parametrize("fmt", sorted(BODIES))
def test_an_unsigned_post_of_any_format_to_any_route_gets_401(receiver: WebhookReceiver, fmt: str) -> None:
    for route in ROUTES:
        response = post(receiver.url(route), BODIES[fmt], secret=None, alert_id="forged")
        assert response.status_code == 401, route
        assert "unsigned" in one_line(response)
    assert receiver.received == [] and receiver.rejected == len(ROUTES)


def test_a_captured_request_resent_with_another_alert_id_is_refused(receiver: WebhookReceiver) -> None:
    data = orjson.dumps(ALERT)
    captured = sign(SECRET, int(time.time()), "abc123", data)
    assert httpx.post(receiver.url("/hook"), content=data, headers=captured).status_code == 200
    for other_id in ("abc124", "ABC123", "abc123.2"):
        replayed = {**captured, ALERT_ID_HEADER: other_id}
        response = httpx.post(receiver.url("/hook"), content=data, headers=replayed)
        assert response.status_code == 401 and "does not match" in one_line(response)
    # Re-sent unchanged it is what it was: a duplicate, recorded once.
    response = httpx.post(receiver.url("/hook"), content=data, headers=captured)
    assert (response.status_code, response.text) == (200, "duplicate\n")
    assert len(receiver.received) == 1 and receiver.rejected == 3


def test_a_changed_body_or_timestamp_or_another_secret_is_refused(receiver: WebhookReceiver) -> None:
    data = orjson.dumps(ALERT)
    captured = sign(SECRET, int(time.time()), "abc123", data)
    altered = orjson.dumps({**ALERT, "severity": "info"})
    assert httpx.post(receiver.url("/"), content=altered, headers=captured).status_code == 401
    moved = {**captured, TIMESTAMP_HEADER: str(int(captured[TIMESTAMP_HEADER]) + 1)}
    assert httpx.post(receiver.url("/"), content=data, headers=moved).status_code == 401
    assert post(receiver.url("/"), ALERT, secret=b"not-the-secret").status_code == 401
    assert receiver.received == [] and receiver.rejected == 3


NOW = 1_763_720_000


@pytest.mark.parametrize(
    ("offset_seconds", "status"), [(-3600, 401), (-301, 401), (-300, 200), (300, 200), (301, 401)]
)
def test_a_timestamp_outside_the_window_is_refused(
    make_receiver: Callable[..., WebhookReceiver], offset_seconds: int, status: int
) -> None:
    receiver = make_receiver(clock=lambda: float(NOW))
    data = orjson.dumps(ALERT)
    headers = sign(SECRET, NOW + offset_seconds, "abc123", data)
    response = httpx.post(receiver.url("/"), content=data, headers=headers)
    assert response.status_code == status
    if status == 401:
        word = "old" if offset_seconds < 0 else "ahead"
        assert f"{abs(offset_seconds)} s {word}, outside the 300 s window" in one_line(response)
    assert len(receiver.received) == (status == 200)


def test_the_window_is_the_receivers_max_skew(make_receiver: Callable[..., WebhookReceiver]) -> None:
    strict = make_receiver(max_skew_seconds=5.0)
    assert post(strict.url("/"), ALERT).status_code == 200
    headers = signed(ALERT, alert_id="late", at=time.time() - 60)
    assert httpx.post(strict.url("/"), content=orjson.dumps(ALERT), headers=headers).status_code == 401


# (case, header values replacing the signed ones, words the one-line reason must hold)
MALFORMED: list[tuple[str, list[tuple[str, bytes]], str]] = [
    ("non-numeric timestamp", [(TIMESTAMP_HEADER, b"yesterday")], "1 to 12 ASCII digits"),
    ("401-digit timestamp", [(TIMESTAMP_HEADER, b"9" * 401)], "got 401 characters"),
    ("negative timestamp", [(TIMESTAMP_HEADER, b"-1763720000")], "1 to 12 ASCII digits"),
    ("fractional timestamp", [(TIMESTAMP_HEADER, b"1763720000.5")], "1 to 12 ASCII digits"),
    ("empty signature", [(SIGNATURE_HEADER, b"")], "scheme=hex"),
    ("garbled signature", [(SIGNATURE_HEADER, b"v1")], "scheme=hex"),
    ("short signature", [(SIGNATURE_HEADER, b"v1=abc")], "64 hex digits"),
    ("the old unversioned scheme", [(SIGNATURE_HEADER, b"sha256=" + b"0" * 64)], "unknown signature scheme"),
    ("an unknown scheme version", [(SIGNATURE_HEADER, b"v2=" + b"0" * 64)], "this receiver verifies v1"),
    ("alert id with a colon", [(ALERT_ID_HEADER, b"abc:123")], ALERT_ID_HEADER),
    ("non-UTF-8 alert id", [(ALERT_ID_HEADER, b"\xff\xfeabc")], "printable ASCII"),
    ("non-UTF-8 timestamp", [(TIMESTAMP_HEADER, b"17637\xff")], "printable ASCII"),
    ("two alert ids", [(ALERT_ID_HEADER, b"abc123"), (ALERT_ID_HEADER, b"zzz")], "more than once"),
]


@pytest.mark.parametrize(("case", "overrides", "words"), MALFORMED, ids=[case for case, _, _ in MALFORMED])
def test_malformed_signing_headers_get_400_and_the_receiver_answers_on(
    receiver: WebhookReceiver, case: str, overrides: list[tuple[str, bytes]], words: str
) -> None:
    data = orjson.dumps(ALERT)
    replaced = {name for name, _ in overrides}
    headers = [(k.encode(), v.encode()) for k, v in signed(ALERT).items() if k not in replaced]
    headers += [(k.encode(), v) for k, v in overrides]
    response = httpx.post(receiver.url("/"), content=data, headers=headers)
    assert response.status_code == 400, case
    assert words in one_line(response), case
    # The handler is alive and well: the next request is answered.
    assert post(receiver.url("/"), ALERT, alert_id="next").status_code == 200
    assert [r["headers"][ALERT_ID_HEADER] for r in receiver.received] == ["next"]


def test_a_signed_request_missing_its_timestamp_or_alert_id_gets_400(receiver: WebhookReceiver) -> None:
    data = orjson.dumps(ALERT)
    for missing in (TIMESTAMP_HEADER, ALERT_ID_HEADER):
        headers = {k: v for k, v in signed(ALERT).items() if k != missing}
        response = httpx.post(receiver.url("/"), content=data, headers=headers)
        assert response.status_code == 400 and missing in one_line(response)


def test_a_401_digit_timestamp_on_a_raw_connection_is_answered_not_dropped(receiver: WebhookReceiver) -> None:
    data = orjson.dumps(ALERT)
    request = (
        f"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: {len(data)}\r\n"
        f"{TIMESTAMP_HEADER}: {'9' * 401}\r\n{ALERT_ID_HEADER}: abc123\r\n"
        f"{SIGNATURE_HEADER}: v1={'0' * 64}\r\nConnection: close\r\n\r\n"
    ).encode() + data
    with socket.create_connection(("127.0.0.1", receiver.port), timeout=10) as conn:
        conn.sendall(request)
        answer = answer_to(conn)
    assert answer.startswith(b"HTTP/1.1 400 "), answer
    assert post(receiver.url("/"), ALERT).status_code == 200


# ---- clients that stall, idle or send too much ----------------------------------------------


def test_many_connections_stalled_mid_body_take_no_threads_and_a_signed_post_still_succeeds(
    make_receiver: Callable[..., WebhookReceiver],
) -> None:
    receiver = make_receiver(limits=QUICK)
    threads_before = threading.active_count()
    stalled = stall_mid_body(receiver.port, 200)
    try:
        wait_until(lambda: receiver.server.open_connections == 200, "the 200 stalled connections admitted")
        assert threading.active_count() == threads_before
        # While all 200 still hang, a legitimate request is answered.
        assert post(receiver.url("/hook"), ALERT, alert_id="legit").status_code == 200
        assert receiver.server.open_connections >= 200
        assert [r["headers"][ALERT_ID_HEADER] for r in receiver.received] == ["legit"]
        # Each stalled one is answered 408 at its body deadline and closed.
        answers = {answer_to(conn).split(b"\r\n", 1)[0] for conn in stalled}
        assert answers == {b"HTTP/1.1 408 Request Timeout"}
        wait_until(lambda: receiver.server.open_connections == 0, "every stalled connection closed")
        assert threading.active_count() == threads_before
    finally:
        for conn in stalled:
            conn.close()


def test_connections_over_the_bound_get_503_and_service_resumes_when_stalled_ones_time_out(
    make_receiver: Callable[..., WebhookReceiver],
) -> None:
    bound = 20
    receiver = make_receiver(limits=ServerLimits(max_connections=bound, body_timeout_seconds=5.0))
    threads_before = threading.active_count()
    stalled = stall_mid_body(receiver.port, 60)
    try:
        wait_until(lambda: receiver.server.turned_away == 40, "40 connections over the bound turned away")
        assert receiver.server.open_connections == bound
        assert threading.active_count() == threads_before
        refused = post(receiver.url("/hook"), ALERT, alert_id="while-full")
        assert refused.status_code == 503 and refused.headers["Retry-After"] == "1"
        # The admitted ones meet their body deadline; then there is room again.
        wait_until(lambda: receiver.server.open_connections == 0, "the stalled connections timed out")
        assert post(receiver.url("/hook"), ALERT, alert_id="after").status_code == 200
    finally:
        for conn in stalled:
            conn.close()
    assert [r["headers"][ALERT_ID_HEADER] for r in receiver.received] == ["after"]


@pytest.mark.parametrize(
    "sent",
    [b"", b"POST /hook HTTP/1.1\r\nHost: x\r\n", b"POST /hook HTTP/1.1\r\nHost: x\r\nX-Slow: a"],
    ids=["nothing", "half the headers", "a header cut short"],
)
def test_a_connection_that_never_completes_its_headers_is_closed_at_the_idle_timeout(
    make_receiver: Callable[..., WebhookReceiver], sent: bytes
) -> None:
    receiver = make_receiver(limits=QUICK)
    with socket.create_connection(("127.0.0.1", receiver.port), timeout=10) as conn:
        conn.sendall(sent)
        wait_until(lambda: receiver.server.open_connections == 1, "the connection admitted")
        if sent:  # bytes trickled in do not reset the timer: the headers must complete in time
            for _ in range(3):
                time.sleep(0.2)
                conn.sendall(b"a")
        assert answer_to(conn) == b""
    wait_until(lambda: receiver.server.open_connections == 0, "the idle connection closed")
    assert post(receiver.url("/"), ALERT).status_code == 200


def test_an_idle_keep_alive_connection_is_closed_after_its_last_answer(
    make_receiver: Callable[..., WebhookReceiver],
) -> None:
    receiver = make_receiver(limits=QUICK)
    with httpx.Client(timeout=5.0) as client:
        data = orjson.dumps(ALERT)
        assert client.post(receiver.url("/"), content=data, headers=signed(ALERT)).status_code == 200
        wait_until(lambda: receiver.server.open_connections == 1, "the keep-alive connection open")
        wait_until(lambda: receiver.server.open_connections == 0, "the idle connection closed")


def test_an_oversized_body_gets_413_declared_or_streamed(
    make_receiver: Callable[..., WebhookReceiver],
) -> None:
    receiver = make_receiver(limits=ServerLimits(max_body_bytes=1000))
    big = orjson.dumps({**ALERT, "message": "x" * 2000})
    response = httpx.post(receiver.url("/"), content=big, headers=signed({**ALERT, "message": "x" * 2000}))
    assert response.status_code == 413 and "over 1000 bytes" in one_line(response)

    def chunks() -> Iterator[bytes]:  # no Content-Length: chunked transfer encoding
        yield big[:600]
        yield big[600:]

    response = httpx.post(receiver.url("/"), content=chunks(), headers={"Content-Type": "application/json"})
    assert response.status_code == 413
    assert post(receiver.url("/"), ALERT).status_code == 200
    assert len(receiver.received) == 1


def test_only_post_is_served(receiver: WebhookReceiver) -> None:
    response = httpx.get(receiver.url("/"))
    assert (response.status_code, response.headers["Allow"]) == (405, "POST")


def test_a_stopped_receiver_answers_nothing_and_cuts_keep_alive_connections(
    receiver: WebhookReceiver,
) -> None:
    with socket.create_connection(("127.0.0.1", receiver.port), timeout=10) as kept:
        wait_until(lambda: receiver.server.open_connections == 1, "the connection admitted")
        receiver.stop()
        assert answer_to(kept) == b""
    with pytest.raises(httpx.ConnectError):
        post(receiver.url("/"), ALERT)


def test_limits_must_be_above_zero() -> None:
    with pytest.raises(ValueError, match="max_connections must be above 0"):
        ServerLimits(max_connections=0)
    with pytest.raises(ValueError, match="body_timeout_seconds must be above 0"):
        ServerLimits(body_timeout_seconds=-1.0)


# ---- the command ----------------------------------------------------------------------------


def start_cli(*args: str, env: dict[str, str] | None = None) -> tuple[subprocess.Popen[str], int]:
    """``fencewatch receive-webhooks --port 0 ARGS`` and the port it listens on."""
    base_env = {k: v for k, v in os.environ.items() if k != "FENCEWATCH_WEBHOOK_SECRET"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "fencewatch", "receive-webhooks", "--port", "0", *args],
        stderr=subprocess.PIPE,
        text=True,
        env={**base_env, **(env or {})},
    )
    assert proc.stderr is not None
    first = proc.stderr.readline()  # blocks until it listens (or dies: then it is empty)
    assert "listening on 127.0.0.1:" in first, first
    return proc, int(first.split("127.0.0.1:")[1].split(",")[0])


def stop_cli(proc: subprocess.Popen[str]) -> str:
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=10) == 0
    assert proc.stderr is not None
    return proc.stderr.read()


def test_the_cli_receives_verifies_and_writes_json_lines(tmp_path: Path) -> None:
    output = tmp_path / "received.jsonl"
    secret_file = tmp_path / "secret"
    secret_file.write_text(SECRET.decode() + "\n")
    proc, port = start_cli("--output", str(output), "--secret-file", str(secret_file))
    try:
        url = f"http://127.0.0.1:{port}/hook"
        assert post(url, ALERT, alert_id="abc123").status_code == 200
        assert post(url, ALERT, alert_id="abc123").status_code == 200
        assert post(url, ALERT, secret=b"wrong", alert_id="zzz").status_code == 401
        assert post(f"http://127.0.0.1:{port}/alertmanager", AM_POST, secret=None).status_code == 401
    finally:
        summary = stop_cli(proc)
    lines = [orjson.loads(line) for line in output.read_text().splitlines()]
    assert [(line["path"], line["body"]) for line in lines] == [("/hook", ALERT)]
    assert "1 recorded, 1 duplicates, 2 rejected" in summary
    assert SECRET.decode() not in summary


def test_the_cli_applies_its_limits(tmp_path: Path) -> None:
    proc, port = start_cli(
        "--output", str(tmp_path / "out.jsonl"), "--max-body-bytes", "100", "--max-connections", "3"
    )
    try:
        held = [socket.create_connection(("127.0.0.1", port), timeout=10) for _ in range(3)]
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=10) as extra:
                assert answer_to(extra).startswith(b"HTTP/1.1 503 ")
        finally:
            for conn in held:
                conn.close()
        # There is room again once the server has seen the held connections close.
        statuses: list[int] = []
        big = {**ALERT, "message": "x" * 200}
        url = f"http://127.0.0.1:{port}/hook"

        def answered_with_room() -> bool:
            statuses.append(post(url, big, secret=None).status_code)
            return statuses[-1] != 503

        wait_until(answered_with_room, "room for a connection again")
        assert statuses[-1] == 413
    finally:
        stop_cli(proc)


def test_malformed_http_gets_400_and_leaves_no_traceback_in_the_log(tmp_path: Path) -> None:
    proc, port = start_cli("--output", str(tmp_path / "out.jsonl"))
    try:
        for raw in (
            b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\n",
            b"POST / HTTP/1.1\r\nX-Long: " + b"a" * 9000 + b"\r\n\r\n",
            b"GARBAGE\r\n\r\n",
            b"\x16\x03\x01\x00\xa5\x01\x00",  # a TLS ClientHello on the plain port
        ):
            with socket.create_connection(("127.0.0.1", port), timeout=10) as conn:
                conn.sendall(raw)
                assert answer_to(conn).split(b"\r\n", 1)[0].endswith(b" 400 Bad Request"), raw[:20]
        assert post(f"http://127.0.0.1:{port}/hook", ALERT, secret=None).status_code == 200
    finally:
        log = stop_cli(proc)
    assert "Traceback" not in log and "1 recorded" in log


@pytest.mark.parametrize("bad", ["0", "-5", "many"])
def test_the_cli_refuses_a_limit_that_is_not_above_zero(bad: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "fencewatch", "receive-webhooks", "--port", "0", "--max-connections", bad],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert "--max-connections" in done.stderr and "Traceback" not in done.stderr


def test_the_cli_help_states_the_receivers_default_limits() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "fencewatch", "receive-webhooks", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    help_text = " ".join(done.stdout.split())
    defaults = ServerLimits()
    for option, value in (
        ("--max-connections", defaults.max_connections),
        ("--max-body-bytes", defaults.max_body_bytes),
        ("--body-timeout-seconds", defaults.body_timeout_seconds),
        ("--idle-timeout-seconds", defaults.idle_timeout_seconds),
    ):
        stated = help_text.split(option, 2)[2].split("(default ", 1)[1].split(")", 1)[0]
        assert float(stated) == value, option
