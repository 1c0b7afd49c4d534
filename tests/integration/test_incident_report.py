"""The incident report as a reader meets it: written by ``fencewatch replay
--report`` from a simulated cluster with injected faults, and by ``fencewatch
report`` from alerts in a real broker's topic, then opened in Debian's
Chromium (headless, through chromedriver): no console error, nothing fetched
from the network, one drawn timeline per alert, the summary's counts.

tests/report_browser.py drives the browser; run it as a script for a screenshot.
"""

from __future__ import annotations

import io
from collections import Counter
from collections.abc import Iterator
from contextlib import redirect_stderr, redirect_stdout
from html import escape
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import orjson
import pytest
from report_browser import PageState, chromium, missing_browser, rendered

from fencewatch.cli import main as fencewatch
from incidents.timelines import FROM_EVIDENCE, FROM_VIEW
from streaming.broker import EmbeddedBroker
from streaming.sinks import TopicSink

pytestmark = pytest.mark.integration

SEED, EVENTS = 7, 40_000


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """Chromium, failing (never skipping) where it is missing: CI installs it."""
    problem = missing_browser()
    if problem:
        pytest.fail(problem, pytrace=False)
    with chromium() as driver:
        yield driver


def run(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        code = fencewatch(list(argv))
    return code, out.getvalue(), err.getvalue()


@pytest.fixture(scope="module")
def replayed(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[dict[str, Any]], Path]:
    """A simulated cluster with injected faults, replayed with ``--report``:
    (the alerts on stdout, the report)."""
    work = tmp_path_factory.mktemp("incident-report")
    events, report = work / "events.jsonl", work / "report.html"
    # simulate writes to a file; its one line of figures goes to the test's stderr
    assert fencewatch(["simulate", "--seed", str(SEED), "--events", str(EVENTS), "-o", str(events)]) == 0
    code, out, err = run("replay", "--no-progress", "--report", str(report), str(events))
    assert code == 0, err
    alerts = [orjson.loads(line) for line in out.splitlines()]
    assert f"wrote {report}" in err
    return alerts, report


def summary_of(alerts: list[dict[str, Any]]) -> set[tuple[str, str, int, int]]:
    """What the summary table must say: per rule and severity, firing and resolved."""
    counts = Counter((a["rule"], a["severity"], a["status"]) for a in alerts)
    return {
        (rule, severity, counts[(rule, severity, "firing")], counts[(rule, severity, "resolved")])
        for rule, severity, _ in counts
    }


def assert_clean(page: PageState) -> None:
    assert page.console_errors == []
    assert page.external_scripts == 0
    assert [url for url in page.fetched if not url.startswith(("file:", "data:", "blob:"))] == []


def test_a_replay_report_draws_a_timeline_per_alert(replayed, browser):
    alerts, report = replayed
    assert len({a["rule"] for a in alerts}) >= 5, "the simulated faults must raise several rules"
    page = rendered(browser, report)
    assert_clean(page)
    assert page.sections == page.drawn == len(alerts)
    assert set(page.summary) == summary_of(alerts)
    assert page.left_out == []
    html = report.read_text()
    assert html.count(escape(FROM_VIEW)) == len(alerts)


def publish_alerts(broker: EmbeddedBroker, topic: str, payloads: list[bytes]) -> None:
    """As the job's alert sink publishes them (streaming.sinks.TopicSink)."""
    sink = TopicSink(broker.bootstrap_servers, topic, {})
    try:
        rows = [
            SimpleNamespace(id=f"r{i}", cluster="sim-1", payload=p.decode()) for i, p in enumerate(payloads)
        ]
        sink.publish(rows, batch_id=0)
    finally:
        sink.close()


def test_a_report_of_an_alerts_topic_draws_the_first_of_each_rule(
    replayed, browser, broker, make_topic, tmp_path
):
    alerts, _ = replayed
    topic = make_topic(partitions=2)
    not_an_alert = b'{"rule": "PRODUCE_STALE_EPOCH_ACCEPTED"}'
    # the first alert twice, as an at-least-once delivery may leave it
    publish_alerts(broker, topic, [orjson.dumps(a) for a in [*alerts, alerts[0]]] + [not_an_alert])
    report = tmp_path / "topic-report.html"
    code, _, err = run(
        "report",
        "--bootstrap-servers",
        broker.bootstrap_servers,
        "--alerts-topic",
        topic,
        "--max-per-rule",
        "1",
        "-o",
        str(report),
    )
    assert code == 0, err
    assert "1 records of" in err and "are not alerts and were skipped" in err
    assert "1 repeated alerts (same alert_id) counted once" in err
    page = rendered(browser, report)
    assert_clean(page)
    rules = Counter(a["rule"] for a in alerts)
    assert page.sections == page.drawn == len(rules)
    assert set(page.summary) == summary_of(alerts)
    assert sorted(page.left_out) == sorted(rule for rule, n in rules.items() if n > 1)
    assert report.read_text().count(escape(FROM_EVIDENCE)) == len(rules)


def test_a_report_of_a_missing_broker_is_one_line(tmp_path):
    code, _, err = run(
        "report",
        "--bootstrap-servers",
        "127.0.0.1:1",
        "--alerts-topic",
        "t",
        "--timeout-seconds",
        "2",
        "-o",
        str(tmp_path / "r.html"),
    )
    assert code == 1
    assert err.startswith("fencewatch report: cannot read the metadata of topic t") and err.count("\n") == 1
    assert not (tmp_path / "r.html").exists()
