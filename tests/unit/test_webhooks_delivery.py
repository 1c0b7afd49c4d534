"""Webhook delivery over real HTTP: the dispatcher against the real receiver
(``webhooks.receiver``) and scripted endpoints (``webhook_endpoints``:
a poison alert, 404, redirects, Retry-After, a byte-dripping server) on
127.0.0.1 and random ports.

The dispatcher runs on a fake clock (Unix seconds, starting at the real now so
signed timestamps fall within the receiver's window) and calls
``deliver_due()`` directly; only ``test_background_thread_*`` uses the real
clock and the delivery threads, waiting by polling with a deadline.
"""

from __future__ import annotations

import email.utils
import itertools
import logging
import random
import socket
import sqlite3
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry
from webhook_endpoints import Script, ScriptedEndpoint

from streaming.metrics import Metrics
from webhooks import Dispatcher, Endpoint
from webhooks.outbox import DELIVERED, PARKED, PENDING
from webhooks.receiver import WebhookReceiver
from webhooks.signing import ALERT_ID_HEADER, SIGNATURE_HEADER, TIMESTAMP_HEADER

SECRET = b"test-hmac-secret"
_ids = itertools.count(1)


def make_alert(**changes: Any) -> dict[str, Any]:
    """A SPEC 3 alert with a fresh alert_id."""
    n = next(_ids)
    alert = {
        "alert_id": f"alert-{n:05d}",
        "rule": "PRODUCE_STALE_EPOCH_ACCEPTED",
        "severity": "critical",
        "status": "firing",
        "cluster": "c1",
        "topic": "orders",
        "topic_id": "qG8hUlWTTJ2eRb_bFvWRXg",
        "partition": 0,
        "node": 2,
        "ts_ms": 1_800_000_000_000 + n,
        "detected_ms": 1_800_000_000_500 + n,
        "message": f"node 2 accepted a produce with leader epoch 3 after epoch 4 (#{n})",
        "evidence": [],
        "links": ["https://cwiki.apache.org/confluence/display/KAFKA/KIP-101"],
    }
    return {**alert, **changes}


class FakeClock:
    """Unix seconds that move only when told."""

    def __init__(self) -> None:
        self.now = float(int(time.time()))

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


class TopOfRange(random.Random):
    """Draws the upper bound of every range, so each backoff is its ceiling."""

    def uniform(self, a: float, b: float) -> float:
        return b


def wait_for(predicate: Callable[[], bool], timeout_seconds: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_seconds
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout_seconds} s")
        time.sleep(0.02)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def sample(metrics: Metrics, name: str, **labels: str) -> float:
    value = metrics.registry.get_sample_value(name, labels)
    return 0.0 if value is None else value


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def metrics() -> Metrics:
    return Metrics(CollectorRegistry())


@pytest.fixture
def make_receiver(clock: FakeClock) -> Iterator[Callable[..., WebhookReceiver]]:
    """``make_receiver(port=0, secret=SECRET, ...)``: a running receiver on the fake clock
    (override with ``clock=``; it judges signature timestamps), stopped after the test."""
    started: list[WebhookReceiver] = []

    def make(port: int = 0, secret: bytes | None = SECRET, **kwargs: Any) -> WebhookReceiver:
        kwargs.setdefault("clock", clock)
        receiver = WebhookReceiver(port, secret=secret, **kwargs)
        started.append(receiver)
        return receiver

    yield make
    for receiver in started:
        receiver.stop()


@pytest.fixture
def make_scripted() -> Iterator[Callable[[], ScriptedEndpoint]]:
    """``make_scripted()``: a running :class:`ScriptedEndpoint`, stopped after the test."""
    started: list[ScriptedEndpoint] = []

    def make() -> ScriptedEndpoint:
        started.append(ScriptedEndpoint())
        return started[-1]

    yield make
    for scripted in started:
        scripted.stop()


@pytest.fixture
def make_dispatcher(
    tmp_path: Path, clock: FakeClock, metrics: Metrics
) -> Iterator[Callable[..., Dispatcher]]:
    """``make_dispatcher(endpoints, outbox=None, **kwargs)``: a dispatcher on the fake clock
    (override with ``clock=``), its outbox a fresh file unless given; stopped after the test."""
    made: list[Dispatcher] = []

    def make(endpoints: list[Endpoint], outbox: Path | None = None, **kwargs: Any) -> Dispatcher:
        kwargs.setdefault("clock", clock)
        kwargs.setdefault("rng", TopOfRange())
        dispatcher = Dispatcher(
            endpoints, outbox or tmp_path / f"outbox-{len(made)}.sqlite", metrics, **kwargs
        )
        made.append(dispatcher)
        return dispatcher

    yield make
    for dispatcher in made:
        dispatcher.stop()


def endpoint(name: str, url: str, **changes: Any) -> Endpoint:
    settings: dict[str, Any] = {"secret": SECRET, "rate_per_second": 1000.0, "burst": 1000}
    settings.update(changes)
    return Endpoint(name, url, **settings)


# ---- formats, headers, signatures ----------------------------------------------------------------


def test_each_format_arrives_signed_with_its_alert_id(make_receiver, make_dispatcher, clock) -> None:
    receiver = make_receiver()
    dispatcher = make_dispatcher(
        [endpoint(fmt, receiver.url(f"/{fmt}"), format=fmt) for fmt in ("json", "alertmanager", "slack")]
    )
    alert = make_alert()
    assert dispatcher.enqueue([alert]) == 3
    assert dispatcher.deliver_due() == 3
    by_path = {r["path"]: r for r in receiver.received}
    assert {p: r["format"] for p, r in by_path.items()} == {
        "/json": "json",
        "/alertmanager": "alertmanager",
        "/slack": "slack",
    }
    assert by_path["/json"]["body"] == alert
    assert by_path["/alertmanager"]["body"]["receiver"] == "alertmanager"
    assert by_path["/alertmanager"]["body"]["alerts"][0]["annotations"]["alert_id"] == alert["alert_id"]
    assert "PRODUCE_STALE_EPOCH_ACCEPTED" in by_path["/slack"]["body"]["text"]
    for record in receiver.received:
        assert record["headers"][ALERT_ID_HEADER] == alert["alert_id"]
        assert record["headers"][SIGNATURE_HEADER]  # and the receiver verified it: nothing rejected
        assert record["headers"][TIMESTAMP_HEADER] == str(int(clock.now))
    assert receiver.rejected == 0


def test_wrong_secret_gets_401_and_the_alert_waits_until_the_secret_is_fixed(
    make_receiver, make_dispatcher, metrics, clock, caplog, tmp_path
) -> None:
    receiver = make_receiver(secret=SECRET)
    outbox = tmp_path / "outbox.sqlite"
    dispatcher = make_dispatcher(
        [endpoint("oncall", receiver.url("/hook"), secret=b"not-the-secret")], outbox
    )
    alert = make_alert()
    dispatcher.enqueue([alert])
    with caplog.at_level(logging.WARNING, logger="webhooks"):
        assert dispatcher.deliver_due() == 0
    assert receiver.rejected == 1 and receiver.received == []
    assert dispatcher.outbox.states("oncall") == {alert["alert_id"]: PENDING}
    assert sample(metrics, "fencewatch_webhook_deliveries_total", endpoint="oncall") == 0
    assert sample(metrics, "fencewatch_webhook_failures_total", endpoint="oncall", reason="http_4xx") == 1
    assert "HTTP 401" in caplog.text
    # The operator fixes the secret and restarts the job: the alert goes out then.
    dispatcher.stop()
    fixed = make_dispatcher([endpoint("oncall", receiver.url("/hook"))], outbox)
    clock.advance(3600)
    assert fixed.deliver_due() == 1
    assert [r["body"]["alert_id"] for r in receiver.received] == [alert["alert_id"]]


def test_unsigned_requests_are_rejected_when_the_receiver_has_a_secret(
    make_receiver, make_dispatcher
) -> None:
    receiver = make_receiver(secret=SECRET)
    dispatcher = make_dispatcher([endpoint("plain", receiver.url("/hook"), secret=None)])
    dispatcher.enqueue([make_alert()])
    dispatcher.deliver_due()
    assert receiver.rejected == 1 and receiver.received == []


# ---- filters -----------------------------------------------------------------------------------


def test_each_endpoint_gets_only_what_its_filters_accept(make_receiver, make_dispatcher) -> None:
    receiver = make_receiver()
    dispatcher = make_dispatcher(
        [
            endpoint("all", receiver.url("/all")),
            endpoint("critical", receiver.url("/critical"), severities=frozenset({"critical"})),
            endpoint("quorum", receiver.url("/quorum"), rules=frozenset({"QUORUM_ZOMBIE_LEADER"})),
            endpoint("c2", receiver.url("/c2"), clusters=frozenset({"c2"})),
        ]
    )
    critical_c1 = make_alert()
    warning_c2 = make_alert(severity="warning", cluster="c2")
    zombie_c1 = make_alert(rule="QUORUM_ZOMBIE_LEADER", severity="critical")
    assert dispatcher.enqueue([critical_c1, warning_c2, zombie_c1]) == 3 + 2 + 1 + 1
    assert dispatcher.deliver_due() == 7
    got: dict[str, set[str]] = {}
    for record in receiver.received:
        got.setdefault(record["path"], set()).add(record["body"]["alert_id"])
    assert got == {
        "/all": {critical_c1["alert_id"], warning_c2["alert_id"], zombie_c1["alert_id"]},
        "/critical": {critical_c1["alert_id"], zombie_c1["alert_id"]},
        "/quorum": {zombie_c1["alert_id"]},
        "/c2": {warning_c2["alert_id"]},
    }


# ---- de-duplication and durability --------------------------------------------------------------


def test_an_alert_enqueued_twice_is_delivered_once(make_receiver, make_dispatcher, tmp_path) -> None:
    receiver = make_receiver()
    outbox = tmp_path / "dedup.sqlite"
    dispatcher = make_dispatcher([endpoint("oncall", receiver.url("/hook"))], outbox)
    alert = make_alert()
    assert dispatcher.enqueue([alert, dict(alert)]) == 1
    assert dispatcher.enqueue([alert]) == 0
    # Committed when enqueue returned: another connection sees the row.
    with sqlite3.connect(outbox) as other:
        assert other.execute("SELECT COUNT(*) FROM outbox").fetchone() == (1,)
    assert dispatcher.deliver_due() == 1
    assert dispatcher.enqueue([alert]) == 0  # a re-run micro-batch after delivery
    assert dispatcher.deliver_due() == 0
    assert [r["body"]["alert_id"] for r in receiver.received] == [alert["alert_id"]]
    assert receiver.requests == 1


def test_a_resolved_alert_is_delivered_after_its_firing_alert(make_receiver, make_dispatcher) -> None:
    receiver = make_receiver()
    dispatcher = make_dispatcher([endpoint("am", receiver.url("/am"), format="alertmanager")])
    firing = make_alert(rule="QUORUM_ZOMBIE_LEADER")
    resolved = make_alert(rule="QUORUM_ZOMBIE_LEADER", status="resolved")
    dispatcher.enqueue([firing])
    dispatcher.enqueue([resolved])
    assert dispatcher.deliver_due() == 2
    statuses = [(r["body"]["status"], r["body"]["alerts"][0]["endsAt"]) for r in receiver.received]
    assert statuses[0] == ("firing", "0001-01-01T00:00:00Z")
    assert statuses[1][0] == "resolved" and statuses[1][1] != "0001-01-01T00:00:00Z"


def test_alerts_queued_while_the_receiver_is_down_arrive_once_after_a_restart(
    make_receiver, make_dispatcher, metrics, clock, tmp_path
) -> None:
    port = free_port()  # nothing listens here yet: connections are refused
    # Refused connections are the endpoint's failure, not the alerts': they never
    # use up max_attempts, however low.
    hook = endpoint("oncall", f"http://127.0.0.1:{port}/hook", backoff_cap_seconds=60.0, max_attempts=1)
    outbox = tmp_path / "durable.sqlite"
    alerts = [make_alert() for _ in range(5)]

    first = make_dispatcher([hook], outbox)
    assert first.enqueue(alerts) == 5
    for _ in range(4):
        assert first.deliver_due() == 0
        clock.advance(61)
    assert sample(metrics, "fencewatch_webhook_failures_total", endpoint="oncall", reason="connection") == 4
    assert first.backlog() == {"oncall": 5}
    assert sample(metrics, "fencewatch_webhook_backlog", endpoint="oncall") == 5
    first.stop()  # the job stops (or dies) with everything still queued

    receiver = make_receiver(port=port)
    second = make_dispatcher([hook], outbox)
    # The restarted job re-runs its last micro-batch: the same alerts again.
    assert second.enqueue(alerts) == 0
    assert second.backlog() == {"oncall": 5}
    delivered = 0
    for _ in range(5):
        delivered += second.deliver_due()
        clock.advance(61)
    assert delivered == 5
    assert sorted(r["body"]["alert_id"] for r in receiver.received) == sorted(a["alert_id"] for a in alerts)
    assert receiver.duplicates == 0
    assert second.backlog() == {"oncall": 0}
    assert sample(metrics, "fencewatch_webhook_backlog", endpoint="oncall") == 0
    assert sample(metrics, "fencewatch_webhook_oldest_pending_seconds", endpoint="oncall") == 0


def test_retry_state_survives_a_restart(make_receiver, make_dispatcher, clock, tmp_path) -> None:
    receiver = make_receiver()
    receiver.answer_with(503)
    hook = endpoint("oncall", receiver.url("/hook"), backoff_base_seconds=10.0, backoff_cap_seconds=1000.0)
    outbox = tmp_path / "retry.sqlite"
    first = make_dispatcher([hook], outbox)
    first.enqueue([make_alert()])
    first.deliver_due()
    clock.advance(10)
    first.deliver_due()  # second failure: next attempt in 20 s
    first.stop()
    second = make_dispatcher([hook], outbox)
    assert second.outbox.next_attempt_at("oncall") == clock.now + 20
    clock.advance(19)
    second.deliver_due()
    assert receiver.requests == 2  # not before it is due, though this dispatcher is new
    clock.advance(1)
    second.deliver_due()
    assert receiver.requests == 3
    assert second.outbox.next_attempt_at("oncall") == clock.now + 40  # the third failure, persisted count


# ---- retries, backoff, rate limit -------------------------------------------------------------


def test_backoff_doubles_up_to_the_cap_and_no_attempt_comes_early(
    make_receiver, make_dispatcher, metrics, clock
) -> None:
    receiver = make_receiver()
    receiver.answer_with(500)
    dispatcher = make_dispatcher(
        [endpoint("oncall", receiver.url("/hook"), backoff_base_seconds=1.0, backoff_cap_seconds=20.0)]
    )
    dispatcher.enqueue([make_alert()])
    waits = []
    for attempt in range(1, 8):
        dispatcher.deliver_due()
        assert receiver.requests == attempt
        due = dispatcher.outbox.next_attempt_at("oncall")
        assert due is not None
        waits.append(due - clock.now)
        clock.advance(waits[-1] - 0.5)
        dispatcher.deliver_due()
        assert receiver.requests == attempt  # half a second early: no attempt
        clock.advance(0.5)
    assert waits == [1, 2, 4, 8, 16, 20, 20]
    assert sample(metrics, "fencewatch_webhook_failures_total", endpoint="oncall", reason="http_5xx") == 7


def test_a_failing_endpoint_is_probed_once_per_backoff_not_with_its_whole_backlog(
    make_receiver, make_dispatcher, clock
) -> None:
    receiver = make_receiver()
    receiver.answer_with(503)
    dispatcher = make_dispatcher([endpoint("oncall", receiver.url("/hook"), backoff_base_seconds=4.0)])
    alerts = [make_alert() for _ in range(5)]
    dispatcher.enqueue(alerts)
    dispatcher.deliver_due()
    dispatcher.deliver_due()  # the other four are due, but the endpoint is paused
    assert receiver.requests == 1
    clock.advance(3.9)
    dispatcher.deliver_due()
    assert receiver.requests == 1
    receiver.answer_with(None)
    clock.advance(0.1)
    assert dispatcher.deliver_due() == 5  # back: the whole backlog, oldest first
    assert [r["body"]["alert_id"] for r in receiver.received] == [a["alert_id"] for a in alerts]
    assert dispatcher.backlog() == {"oncall": 0}


def test_backoff_jitter_stays_within_the_ceiling(make_receiver, make_dispatcher, clock) -> None:
    receiver = make_receiver()
    receiver.answer_with(502)
    dispatcher = make_dispatcher(
        [endpoint("oncall", receiver.url("/hook"), backoff_base_seconds=2.0, backoff_cap_seconds=30.0)],
        rng=random.Random(3),
    )
    dispatcher.enqueue([make_alert()])
    waits = []
    for attempt in range(1, 9):
        dispatcher.deliver_due()
        due = dispatcher.outbox.next_attempt_at("oncall")
        assert due is not None
        waits.append(due - clock.now)
        assert 0 <= waits[-1] <= min(30.0, 2.0 * 2 ** (attempt - 1))
        clock.advance(waits[-1])
    assert receiver.requests == 8
    assert len(set(waits)) == len(waits)  # jittered, not a fixed schedule


def test_retry_after_is_honoured_on_429(make_receiver, make_dispatcher, metrics, clock) -> None:
    receiver = make_receiver()
    receiver.answer_with(429, retry_after_seconds=30)
    dispatcher = make_dispatcher([endpoint("oncall", receiver.url("/hook"))])
    dispatcher.enqueue([make_alert()])
    dispatcher.deliver_due()
    assert dispatcher.outbox.next_attempt_at("oncall") == clock.now + 30
    assert sample(metrics, "fencewatch_webhook_failures_total", endpoint="oncall", reason="http_4xx") == 1
    receiver.answer_with(None)
    clock.advance(29)
    assert dispatcher.deliver_due() == 0
    clock.advance(1)
    assert dispatcher.deliver_due() == 1


def test_408_and_timeouts_are_retried_not_dropped(make_receiver, make_dispatcher, metrics, clock) -> None:
    receiver = make_receiver()
    receiver.answer_with(408)
    dispatcher = make_dispatcher([endpoint("oncall", receiver.url("/hook"))])
    alert = make_alert()
    dispatcher.enqueue([alert])
    dispatcher.deliver_due()
    assert dispatcher.outbox.states("oncall") == {alert["alert_id"]: PENDING}
    receiver.answer_with(None)
    clock.advance(2)
    assert dispatcher.deliver_due() == 1
    assert dispatcher.outbox.states("oncall") == {alert["alert_id"]: DELIVERED}

    # A server that accepts the connection and never answers: a timeout.
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        port = silent.getsockname()[1]
        slow = make_dispatcher([endpoint("slow", f"http://127.0.0.1:{port}/", timeout_seconds=0.2)])
        late = make_alert()
        slow.enqueue([late])
        slow.deliver_due()
        assert slow.outbox.states("slow") == {late["alert_id"]: PENDING}
    assert sample(metrics, "fencewatch_webhook_failures_total", endpoint="slow", reason="timeout") == 1


def test_the_rate_limit_holds_deliveries_back(make_receiver, make_dispatcher, metrics, clock) -> None:
    receiver = make_receiver()
    dispatcher = make_dispatcher([endpoint("chat", receiver.url("/hook"), rate_per_second=2.0, burst=3)])
    dispatcher.enqueue([make_alert() for _ in range(8)])
    assert dispatcher.deliver_due() == 3  # the burst
    assert len(receiver.received) == 3
    assert sample(metrics, "fencewatch_webhook_rate_limited_total", endpoint="chat") == 1
    assert dispatcher.deliver_due() == 0  # no time passed: no tokens
    clock.advance(0.5)
    assert dispatcher.deliver_due() == 1
    clock.advance(1.0)
    assert dispatcher.deliver_due() == 2
    clock.advance(100)
    assert dispatcher.deliver_due() == 2
    assert len(receiver.received) == 8
    assert sample(metrics, "fencewatch_webhook_deliveries_total", endpoint="chat") == 8


# ---- one failing alert, a failing endpoint --------------------------------------------------------


def test_a_poison_alert_backs_off_alone_and_is_parked_after_max_attempts(
    make_scripted, make_dispatcher, metrics, clock
) -> None:
    scripted = make_scripted()
    poison = make_alert()
    scripted.script(poison["alert_id"], Script(500, body="boom: cannot template this alert\n"))
    dispatcher = make_dispatcher(
        [endpoint("oncall", scripted.url(), max_attempts=4, backoff_base_seconds=2.0, backoff_cap_seconds=60)]
    )
    others = [make_alert() for _ in range(5)]
    dispatcher.enqueue([poison, *others])  # the poison alert is the oldest
    assert dispatcher.deliver_due() == 5  # the ones behind it go out in the same pass
    for _ in range(3):
        # While the poison alert backs off, each new alert goes out at once ...
        newcomer = make_alert()
        dispatcher.enqueue([newcomer])
        assert dispatcher.deliver_due() == 1
        others.append(newcomer)
        # ... and the poison alert is tried again only when its own backoff is over.
        due = dispatcher.outbox.next_attempt_at("oncall")
        assert due is not None and due > clock.now
        clock.now = due
        assert dispatcher.deliver_due() == 0
    assert scripted.count(poison["alert_id"]) == 4
    assert all(scripted.count(a["alert_id"]) == 1 for a in others)
    assert dispatcher.outbox.states("oncall") == {
        poison["alert_id"]: PARKED,
        **{a["alert_id"]: DELIVERED for a in others},
    }
    (parked,) = dispatcher.outbox.parked("oncall")
    assert (parked.alert_id, parked.reason, parked.attempts, parked.last_status) == (
        poison["alert_id"],
        "retries_exhausted",
        4,
        500,
    )
    assert parked.last_body == "boom: cannot template this alert"
    assert parked.last_error == "HTTP 500 boom: cannot template this alert"
    assert parked.parked_at == clock.now
    assert (
        sample(metrics, "fencewatch_webhook_parkings_total", endpoint="oncall", reason="retries_exhausted")
        == 1
    )
    assert sample(metrics, "fencewatch_webhook_parked", endpoint="oncall") == 1
    assert sample(metrics, "fencewatch_webhook_failures_total", endpoint="oncall", reason="http_5xx") == 4
    assert sample(metrics, "fencewatch_webhook_deliveries_total", endpoint="oncall") == 8


def test_a_poison_alert_is_parked_at_max_age_with_its_last_answer(
    make_scripted, make_dispatcher, metrics, clock
) -> None:
    scripted = make_scripted()
    poison, fine = make_alert(), make_alert()
    scripted.script(poison["alert_id"], Script(500, body="still broken"))
    dispatcher = make_dispatcher(
        [
            endpoint(
                "oncall", scripted.url(), max_age_seconds=30, backoff_base_seconds=4, backoff_cap_seconds=8
            )
        ]
    )
    dispatcher.enqueue([poison, fine])
    assert dispatcher.deliver_due() == 1
    for _ in range(3):
        clock.advance(8)
        dispatcher.deliver_due()
    assert dispatcher.outbox.states("oncall")[poison["alert_id"]] == PENDING
    clock.advance(8)  # 32 s after it was queued
    dispatcher.deliver_due()
    (parked,) = dispatcher.outbox.parked("oncall")
    assert (parked.alert_id, parked.reason, parked.last_status, parked.last_body) == (
        poison["alert_id"],
        "max_age",
        500,
        "still broken",
    )
    assert parked.attempts == scripted.count(poison["alert_id"]) >= 2
    assert sample(metrics, "fencewatch_webhook_parkings_total", endpoint="oncall", reason="max_age") == 1


def test_an_endpoint_answering_500_to_everything_gets_one_probe_per_pause(
    make_scripted, make_dispatcher, clock
) -> None:
    scripted = make_scripted()
    scripted.script(None, Script(500, body="down for maintenance"))
    dispatcher = make_dispatcher(
        [endpoint("oncall", scripted.url(), backoff_base_seconds=4.0, backoff_cap_seconds=100.0)]
    )
    alerts = [make_alert() for _ in range(10)]
    dispatcher.enqueue(alerts)
    dispatcher.deliver_due()
    # Three different alerts failed in a row: the endpoint looks down, not those alerts.
    assert len(scripted.requests) == 3
    clock.advance(3.9)
    dispatcher.deliver_due()
    assert len(scripted.requests) == 3
    clock.advance(0.1)
    dispatcher.deliver_due()
    assert len(scripted.requests) == 4  # one probe, and a fresh alert rather than one known to fail
    assert scripted.requests[-1] == alerts[3]["alert_id"]
    clock.advance(7.9)  # the pause doubled
    dispatcher.deliver_due()
    assert len(scripted.requests) == 4
    scripted.script(None, Script(200))
    clock.advance(0.1)
    assert dispatcher.deliver_due() == 10  # the probe got through: the whole backlog follows
    assert dispatcher.backlog() == {"oncall": 0}


def test_a_404_is_parked_at_once_with_its_status_and_a_bounded_body_excerpt(
    make_scripted, make_dispatcher, metrics, clock
) -> None:
    scripted = make_scripted()
    missing, later = make_alert(), make_alert()
    scripted.script(missing["alert_id"], Script(404, body="no hook named oncall here\n" + "x" * 5000))
    dispatcher = make_dispatcher([endpoint("oncall", scripted.url())])
    dispatcher.enqueue([missing])
    dispatcher.deliver_due()
    (parked,) = dispatcher.outbox.parked("oncall")
    assert (parked.alert_id, parked.reason, parked.attempts, parked.last_status) == (
        missing["alert_id"],
        "rejected",
        1,
        404,
    )
    assert parked.last_body.startswith("no hook named oncall here xxx") and len(parked.last_body) == 500
    assert parked.last_error.startswith("HTTP 404 no hook named oncall here")
    assert sample(metrics, "fencewatch_webhook_parkings_total", endpoint="oncall", reason="rejected") == 1
    # A rejected alert says nothing about the next one: it is sent at once.
    dispatcher.enqueue([later])
    assert dispatcher.deliver_due() == 1


def test_a_redirect_is_parked_naming_its_location_and_is_not_followed(
    make_scripted, make_dispatcher, metrics
) -> None:
    scripted, elsewhere = make_scripted(), make_scripted()
    alert = make_alert()
    target = elsewhere.url("/moved-hook")
    scripted.script(alert["alert_id"], Script(302, headers={"Location": target}, body=""))
    dispatcher = make_dispatcher([endpoint("oncall", scripted.url())])
    dispatcher.enqueue([alert])
    assert dispatcher.deliver_due() == 0
    (parked,) = dispatcher.outbox.parked("oncall")
    assert (parked.reason, parked.last_status, parked.attempts) == ("redirect", 302, 1)
    assert f"a redirect to {target}" in parked.last_error
    assert "redirects are not followed" in parked.last_error
    assert elsewhere.requests == []  # the signed alert never went to the other URL
    assert sample(metrics, "fencewatch_webhook_failures_total", endpoint="oncall", reason="http_3xx") == 1
    assert sample(metrics, "fencewatch_webhook_parkings_total", endpoint="oncall", reason="redirect") == 1


def http_date(unix_seconds: float) -> str:
    return email.utils.formatdate(unix_seconds, usegmt=True)


@pytest.mark.parametrize(
    ("retry_after", "expected_wait"),
    [
        (lambda now: "99999999", 120.0),
        (lambda now: "9" * 400, 120.0),
        (lambda now: "Fri, 31 Dec 9999 23:59:59 GMT", 120.0),
        (lambda now: http_date(now + 30), 30.0),
        (lambda now: "soon", 5.0),  # not a Retry-After: the endpoint's own backoff
    ],
    ids=["huge-seconds", "400-digits", "year-9999", "date-in-30s", "malformed"],
)
def test_retry_after_is_capped_by_the_max_backoff(
    make_scripted, make_dispatcher, clock, retry_after, expected_wait
) -> None:
    scripted = make_scripted()
    scripted.script(None, Script(429, headers={"Retry-After": retry_after(clock.now)}))
    dispatcher = make_dispatcher(
        [endpoint("oncall", scripted.url(), backoff_base_seconds=5.0, backoff_cap_seconds=120.0)]
    )
    dispatcher.enqueue([make_alert()])
    dispatcher.deliver_due()
    assert dispatcher.outbox.next_attempt_at("oncall") == clock.now + expected_wait
    scripted.script(None, Script(200))
    dispatcher.enqueue([make_alert()])
    clock.advance(expected_wait - 0.5)
    dispatcher.deliver_due()
    assert len(scripted.requests) == 1  # the whole endpoint waits, not just that alert
    clock.advance(0.5)
    assert dispatcher.deliver_due() == 2


@pytest.mark.parametrize("drip_body_only", [False, True], ids=["status-line-and-headers", "body"])
def test_a_server_dripping_bytes_is_cut_off_at_the_deadline(
    make_scripted, make_dispatcher, metrics, drip_body_only
) -> None:
    scripted = make_scripted()
    # One byte every 0.25 s: each read is quick, but the whole answer would take a minute.
    scripted.script(None, Script(200, body="x" * 200, drip_seconds=0.25, drip_body_only=drip_body_only))
    dispatcher = make_dispatcher([endpoint("slow", scripted.url(), timeout_seconds=1.0)])
    alert = make_alert()
    dispatcher.enqueue([alert])
    assert dispatcher.deliver_due() == 0
    assert dispatcher.outbox.states("slow") == {alert["alert_id"]: PENDING}
    assert sample(metrics, "fencewatch_webhook_failures_total", endpoint="slow", reason="timeout") == 1
    # The sender hung up: the server found out while it still had most of the answer to send.
    wait_for(lambda: bool(scripted.cuts))
    (cut,) = scripted.cuts
    assert cut.sent < cut.total / 2


# ---- giving up -----------------------------------------------------------------------------------


def test_a_4xx_is_parked_with_a_log_line_naming_status_and_endpoint(
    make_receiver, make_dispatcher, metrics, clock, caplog
) -> None:
    receiver = make_receiver()
    receiver.answer_with(400)
    dispatcher = make_dispatcher([endpoint("chat", receiver.url("/hook"))])
    first, second = make_alert(), make_alert()
    dispatcher.enqueue([first, second])
    with caplog.at_level(logging.WARNING, logger="webhooks"):
        dispatcher.deliver_due()
    # Each alert is judged on its own: a 400 is about that request, not the endpoint.
    assert receiver.requests == 2
    assert dispatcher.outbox.states("chat") == {first["alert_id"]: PARKED, second["alert_id"]: PARKED}
    assert sample(metrics, "fencewatch_webhook_parkings_total", endpoint="chat", reason="rejected") == 2
    assert sample(metrics, "fencewatch_webhook_parked", endpoint="chat") == 2
    assert sample(metrics, "fencewatch_webhook_failures_total", endpoint="chat", reason="http_4xx") == 2
    lines = [r.getMessage() for r in caplog.records if "parked alert" in r.getMessage()]
    assert len(lines) == 2 and all("webhook chat:" in line and "HTTP 400" in line for line in lines)
    receiver.answer_with(None)
    clock.advance(3600)
    assert dispatcher.deliver_due() == 0  # parked rows wait for an operator, not for time
    assert receiver.requests == 2


def test_alerts_older_than_max_age_are_parked_with_their_last_answer(
    make_receiver, make_dispatcher, metrics, clock, caplog
) -> None:
    receiver = make_receiver()
    receiver.answer_with(503)
    dispatcher = make_dispatcher([endpoint("oncall", receiver.url("/hook"), max_age_seconds=60.0)])
    alerts = [make_alert(), make_alert()]
    dispatcher.enqueue(alerts)
    dispatcher.deliver_due()
    clock.advance(45)
    dispatcher.deliver_due()
    assert sample(metrics, "fencewatch_webhook_oldest_pending_seconds", endpoint="oncall") == 45
    assert sample(metrics, "fencewatch_webhook_backlog", endpoint="oncall") == 2
    receiver.answer_with(None)
    clock.advance(16)
    with caplog.at_level(logging.WARNING, logger="webhooks"):
        assert dispatcher.deliver_due() == 0
    assert receiver.received == []
    assert set(dispatcher.outbox.states("oncall").values()) == {PARKED}
    assert sample(metrics, "fencewatch_webhook_parkings_total", endpoint="oncall", reason="max_age") == 2
    assert sample(metrics, "fencewatch_webhook_parked", endpoint="oncall") == 2
    assert dispatcher.backlog() == {"oncall": 0}
    assert "webhook oncall: parked 2 alert(s) still undelivered after max_age_seconds=60" in caplog.text
    # The 503s held the endpoint back: only the oldest alert was tried (twice), and keeps its answer.
    first, second = dispatcher.outbox.parked("oncall")
    assert (first.alert_id, first.reason, first.attempts, first.last_status) == (
        alerts[0]["alert_id"],
        "max_age",
        2,
        503,
    )
    assert "answering 503 as told" in first.last_body and first.last_error.startswith("HTTP 503")
    assert (second.alert_id, second.attempts, second.last_error) == (alerts[1]["alert_id"], 0, "")
    # Parked rows still de-duplicate: a re-run batch does not queue them again.
    assert dispatcher.enqueue(alerts) == 0


def test_finished_rows_are_pruned_after_the_retention(
    make_receiver, make_dispatcher, clock, tmp_path
) -> None:
    receiver = make_receiver()
    outbox = tmp_path / "prune.sqlite"
    hook = endpoint("oncall", receiver.url("/hook"))
    alert = make_alert()
    first = make_dispatcher([hook], outbox, retention_seconds=3600.0)
    first.enqueue([alert])
    assert first.deliver_due() == 1
    first.stop()
    clock.advance(3601)
    second = make_dispatcher([hook], outbox, retention_seconds=3600.0)
    second.deliver_due()  # the first pass prunes
    assert second.outbox.states("oncall") == {}


# ---- the background threads -------------------------------------------------------------------


def test_background_thread_delivers_what_is_enqueued(make_receiver, make_dispatcher) -> None:
    receiver = make_receiver(clock=time.time)
    dispatcher = make_dispatcher(
        [endpoint("a", receiver.url("/a")), endpoint("b", receiver.url("/b"), format="slack")],
        clock=time.time,
        rng=random.Random(),
    )
    dispatcher.start()
    alerts = [make_alert() for _ in range(3)]
    dispatcher.enqueue(alerts)
    # Marked delivered only after the receiver answered: the backlog empties last.
    wait_for(lambda: dispatcher.backlog() == {"a": 0, "b": 0})
    assert len(receiver.received) == 6
    dispatcher.stop(timeout_seconds=5.0)
    assert sorted(r["headers"][ALERT_ID_HEADER] for r in receiver.received if r["path"] == "/a") == sorted(
        a["alert_id"] for a in alerts
    )


# ---- secrets stay out of the logs -------------------------------------------------------------


def test_urls_and_secrets_never_appear_in_logs(make_receiver, make_dispatcher, clock, caplog) -> None:
    caplog.set_level(logging.DEBUG)
    receiver = make_receiver(secret=SECRET)
    secret_path = "/services/T0SECRET/B0SECRET/xoxSECRETPATH"
    url = receiver.url(secret_path)
    dead_url = f"http://127.0.0.1:{free_port()}/hooks/DEADSECRETTOKEN"
    dispatcher = make_dispatcher(
        [endpoint("oncall", url), endpoint("dead", dead_url), endpoint("wrongkey", url, secret=b"WRONGKEY")]
    )
    for status in (503, 400, None):
        receiver.answer_with(status)
        dispatcher.enqueue([make_alert()])
        dispatcher.deliver_due()
        clock.advance(1000)
    assert receiver.received  # the last round went through
    messages = caplog.text + "\n".join(r.getMessage() for r in caplog.records)
    # Every path the URL could take into a log was exercised ...
    assert "<url of oncall>" in messages  # httpx's own request log line, redacted
    assert "webhook dead:" in messages and "webhook oncall: parked alert" in messages
    assert "webhook wrongkey: parked alert" in messages
    # ... and none of them shows it.
    for secret in ("T0SECRET", "xoxSECRETPATH", "DEADSECRETTOKEN", SECRET.decode(), "WRONGKEY"):
        assert secret not in messages
