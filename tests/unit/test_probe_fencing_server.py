"""``fencewatch probe`` against a broker that fences as Apache Kafka does
(tests/fencing_server.py, built on kafka-python's message classes): a clean run
finds nothing; each misbehaviour the server is told to show is found with its rule
and evidence; an election between the first answer and the confirmation is no
deviation; requests keep to the pace; the command's exit codes and one-line errors."""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest
from prometheus_client import CollectorRegistry

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from fencing_server import (
    FENCED_LEADER_EPOCH,
    FETCH,
    LIST_OFFSETS,
    NOT_LEADER_OR_FOLLOWER,
    OFFSET_FOR_LEADER_EPOCH,
    UNKNOWN_LEADER_EPOCH,
    UNKNOWN_TOPIC_OR_PARTITION,
    FencingServer,
)

from detectors.probe_rules import PROBE_RULES, Kind
from probe.client import ProbeClient
from probe.report import record, table
from probe.round import Prober, RoundReport
from streaming.broker import free_port
from streaming.metrics import Metrics

BROKERS = [1, 2, 3]
EPOCH = 4


@pytest.fixture
def server() -> Iterator[FencingServer]:
    """Three brokers; ``orders`` (12 partitions, 3 replicas, epoch 4) and ``fresh``
    (3 partitions, 2 replicas, epoch 0: no past probe is possible)."""
    with FencingServer(tuple(BROKERS)) as running:
        running.cluster.create_topic("orders", 12, BROKERS, 3, EPOCH)
        running.cluster.create_topic("fresh", 3, BROKERS, 2, 0)
        yield running


@pytest.fixture
def client(server: FencingServer) -> Iterator[ProbeClient]:
    probe_client = ProbeClient(server.bootstrap_servers, {}, timeout_seconds=3)
    probe_client.connect()
    server.cluster.log.clear()  # kafka-python's bootstrap: from here on, the probe's requests
    yield probe_client
    probe_client.close()


def probe_round(client: ProbeClient, **kwargs: object) -> RoundReport:
    return Prober(client, **kwargs).round()  # type: ignore[arg-type]


def fencewatch(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "fencewatch", "probe", *argv],
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
    )


# ---- a broker that fences ------------------------------------------------------------------


def test_a_broker_that_fences_as_kafka_gives_no_deviation(server: FencingServer, client: ProbeClient):
    report = probe_round(client)
    assert report.alerts == [] and report.superseded == [] and report.unconfirmed == []
    assert report.partitions_probed == report.partitions_total == 15
    # Every broker was asked every API of every kind, and answered as Kafka does.
    cells = {(a.node, a.api, a.kind) for a in report.asked}
    for node in BROKERS:
        for api in (FETCH, LIST_OFFSETS, OFFSET_FOR_LEADER_EPOCH):
            kinds = {Kind.CURRENT, Kind.FUTURE, Kind.PAST, Kind.UNKNOWN_PARTITION}
            if api != FETCH:
                kinds.add(Kind.FOLLOWER)
            assert {k for n, a, k in cells if (n, a) == (node, api)} == kinds, (node, api)
    answers = {(a.kind, a.answer) for a in report.asked}
    assert answers == {
        (Kind.CURRENT, 0),
        (Kind.FUTURE, UNKNOWN_LEADER_EPOCH),
        (Kind.PAST, FENCED_LEADER_EPOCH),
        (Kind.FOLLOWER, NOT_LEADER_OR_FOLLOWER),
        (Kind.UNKNOWN_PARTITION, UNKNOWN_TOPIC_OR_PARTITION),
    }
    # The past probe skips the partitions at epoch 0; the future one carries epoch + 1.
    assert {a.epoch_sent for a in report.asked if a.kind is Kind.PAST} == {EPOCH - 1}
    assert {(a.topic, a.epoch_sent) for a in report.asked if a.kind is Kind.FUTURE} == {
        ("orders", EPOCH + 1),
        ("fresh", 1),
    }
    # No confirmation was needed: one Metadata read.
    assert len(server.requests("Metadata")) == 1


def test_once_prints_a_clean_table_and_exits_0(server: FencingServer):
    done = fencewatch("--bootstrap-servers", server.bootstrap_servers, "--once")
    assert done.returncode == 0, done.stderr
    assert done.stdout == ""
    rows = [line.split() for line in done.stderr.splitlines() if re.match(r"[123] ", line)]
    assert len(rows) == 9  # 3 brokers x 3 APIs
    for row in rows:
        assert row[2] in ("v17", "v9", "v4") and all(
            cell in ("ok", "-") or cell.isdigit() for cell in row[3:]
        )
    assert "deviations: none" in done.stderr


# ---- misbehaviour found ----------------------------------------------------------------------

CASES = [
    # (api, case, answer, rule, kind, partitions of the case)
    (FETCH, "future", 0, "PROBE_FUTURE_EPOCH_SERVED", Kind.FUTURE, 15),
    (LIST_OFFSETS, "past", 0, "PROBE_STALE_EPOCH_SERVED", Kind.PAST, 12),
    (OFFSET_FOR_LEADER_EPOCH, "past", 1, "PROBE_STALE_EPOCH_SERVED", Kind.PAST, 12),
    (LIST_OFFSETS, "follower", 0, "PROBE_NON_LEADER_SERVED", Kind.FOLLOWER, 15),
    (OFFSET_FOR_LEADER_EPOCH, "unknown", 0, "PROBE_UNKNOWN_PARTITION_SERVED", Kind.UNKNOWN_PARTITION, 3),
    (FETCH, "future", FENCED_LEADER_EPOCH, "PROBE_FENCING_ERROR_MISMATCH", Kind.FUTURE, 15),
    (LIST_OFFSETS, "current", UNKNOWN_LEADER_EPOCH, "PROBE_FENCING_ERROR_MISMATCH", Kind.CURRENT, 15),
]


@pytest.mark.parametrize(("api", "case", "answer", "rule", "kind", "count"), CASES)
def test_each_injected_misbehaviour_is_found_with_its_rule_and_evidence(
    server: FencingServer, client: ProbeClient, api, case, answer, rule, kind, count
):
    server.cluster.misbehave(api, case, answer)
    report = probe_round(client, cluster="prod-eu-1")
    assert {a.rule for a in report.alerts} == {rule}
    assert len(report.alerts) == count  # one per partition (per broker for the missing partition)
    assert report.superseded == [] and report.unconfirmed == []
    first = report.confirmed[0]
    assert (first.api, first.kind, first.answer) == (api, kind, answer)
    for alert, asked in zip(report.alerts, report.confirmed, strict=True):
        assert (alert.cluster, alert.node, alert.partition, alert.topic) == (
            "prod-eu-1",
            asked.node,
            asked.partition,
            asked.topic,
        )
        view, seen, again = (e.summary for e in alert.evidence)
        version = {FETCH: 17, LIST_OFFSETS: 9, OFFSET_FOR_LEADER_EPOCH: 4}[api]
        assert f"{api} v{version} to broker {asked.node}" in seen
        assert f"currentLeaderEpoch {asked.epoch_sent} " in seen
        assert f"({answer})" in seen and again.startswith("confirmed: ") and f"({answer})" in again
        if kind is not Kind.UNKNOWN_PARTITION:
            assert f"leader epoch {asked.epoch_known}" in view and asked.epoch_known in (0, EPOCH)
    # The confirmation read Metadata again.
    assert len(server.requests("Metadata")) == 2


def test_alert_ids_repeat_while_the_deviation_stays_and_change_with_the_epoch(
    server: FencingServer, client: ProbeClient
):
    server.cluster.misbehave(FETCH, "future", 0)
    prober = Prober(client)
    first = sorted(a.alert_id for a in prober.round().alerts)
    assert sorted(a.alert_id for a in prober.round().alerts) == first
    server.cluster.elect()
    later = {a.alert_id for a in prober.round().alerts}
    assert len(later) == len(first) and later.isdisjoint(first)


# ---- what is not a deviation -----------------------------------------------------------------


@pytest.mark.parametrize("new_leader", [False, True], ids=["same-leader", "new-leader"])
def test_an_election_during_a_round_is_not_reported(server: FencingServer, client: ProbeClient, new_leader):
    elected = []

    def elect_before_the_first_fetch(node: int, api: str, version: int) -> None:
        if api == FETCH and not elected:
            elected.append(node)
            server.cluster.elect(new_leader)

    server.cluster.before_answer = elect_before_the_first_fetch
    report = probe_round(client)
    assert elected
    # Answers after the election looked wrong against the first Metadata...
    assert {a.answer for a in report.superseded} & {0, FENCED_LEADER_EPOCH, NOT_LEADER_OR_FOLLOWER}
    assert len(report.superseded) > 15
    # ...and the second Metadata read showed the election: nothing is reported.
    assert report.alerts == []
    assert len(server.requests("Metadata")) == 2


def test_an_answer_not_repeated_when_asked_again_is_not_reported(server: FencingServer, client: ProbeClient):
    server.cluster.misbehave(LIST_OFFSETS, "past", 0)

    def behave_after_the_second_metadata(node: int, api: str, version: int) -> None:
        if api == "Metadata" and len(server.requests("Metadata")) == 2:
            server.cluster.faults.clear()

    server.cluster.before_answer = behave_after_the_second_metadata
    report = probe_round(client)
    assert report.alerts == []
    assert len(report.unconfirmed) == 12 and {a.api for a in report.unconfirmed} == {LIST_OFFSETS}


def test_an_api_the_broker_does_not_advertise_is_unsupported_and_never_sent(
    server: FencingServer, client: ProbeClient
):
    server.cluster.unadvertised.add(23)
    client.close()
    fresh = ProbeClient(server.bootstrap_servers, {}, timeout_seconds=3)
    fresh.connect()
    server.cluster.log.clear()
    try:
        report = probe_round(fresh)
    finally:
        fresh.close()
    assert report.alerts == []
    assert server.requests(OFFSET_FOR_LEADER_EPOCH) == []
    unsupported = [(s.node, s.api, s.reason) for s in report.requests if s.outcome == "unsupported"]
    # Once per broker, though each is both a leader and a follower.
    assert sorted(unsupported) == [(n, OFFSET_FOR_LEADER_EPOCH, "not advertised") for n in BROKERS]
    assert "OffsetForLeaderEpoch  -        unsupported: not advertised" in table(report)


# ---- bounded and polite ----------------------------------------------------------------------


def test_requests_per_broker_stay_under_50_a_second_at_the_default_settings(server: FencingServer):
    client = ProbeClient(server.bootstrap_servers, {})  # the default pace
    client.connect()
    prober = Prober(client)
    try:
        for _ in range(4):
            prober.round()
    finally:
        client.close()
    worst = 0
    for node in BROKERS:
        times = sorted(r.at for r in server.requests() if r.node == node)
        # Enough requests that, unpaced, they would come in well under a second.
        assert len(times) > 50, len(times)
        in_a_second = max(sum(1 for t in times[i:] if t < start + 1.0) for i, start in enumerate(times))
        worst = max(worst, in_a_second)
    print(f"most requests to one broker in any second: {worst}")
    assert worst <= 50


def test_at_most_max_partitions_a_round_taken_round_robin(client: ProbeClient):
    prober = Prober(client, max_partitions=4, topics=re.compile("orders"))
    seen: list[set[tuple[str, int]]] = []
    for _ in range(3):
        report = prober.round()
        assert (report.partitions_probed, report.partitions_total) == (4, 12)
        seen.append({(a.topic, a.partition) for a in report.asked if a.kind is Kind.CURRENT})
    assert [len(s) for s in seen] == [4, 4, 4]
    assert set().union(*seen) == {("orders", p) for p in range(12)}


# ---- metrics and the command -----------------------------------------------------------------


def test_metrics_count_requests_and_confirmed_deviations(server: FencingServer, client: ProbeClient):
    server.cluster.misbehave(LIST_OFFSETS, "follower", 0)
    metrics = Metrics(CollectorRegistry(), job=False)
    report = probe_round(client)
    record(metrics, report, 1_700_000_000.0)
    value = metrics.registry.get_sample_value
    cluster = "fencing-test-cluster"
    assert (
        value("fencewatch_probe_deviations_total", {"cluster": cluster, "rule": "PROBE_NON_LEADER_SERVED"})
        == 15
    )
    for rule in set(PROBE_RULES) - {"PROBE_NON_LEADER_SERVED"}:
        assert value("fencewatch_probe_deviations_total", {"cluster": cluster, "rule": rule}) == 0
    deviating = value(
        "fencewatch_probe_requests_total", {"cluster": cluster, "api": LIST_OFFSETS, "outcome": "deviating"}
    )
    assert deviating == 3 + 3  # the follower request to each broker, and its confirmation
    assert (
        value("fencewatch_probe_requests_total", {"cluster": cluster, "api": FETCH, "outcome": "conforming"})
        > 0
    )
    assert value("fencewatch_probe_last_success_timestamp_seconds", {"cluster": cluster}) == 1_700_000_000.0
    # The probe alone exports no streaming-job series.
    assert value("fencewatch_query_running") is None


def test_once_prints_alerts_and_exits_3_on_a_deviation(server: FencingServer):
    server.cluster.misbehave(OFFSET_FOR_LEADER_EPOCH, "unknown", 0)
    done = fencewatch("--bootstrap-servers", server.bootstrap_servers, "--once", "--cluster", "lab")
    assert done.returncode == 3, done.stderr
    alerts = [orjson.loads(line) for line in done.stdout.splitlines()]
    assert {(a["rule"], a["cluster"], a["node"]) for a in alerts} == {
        ("PROBE_UNKNOWN_PARTITION_SERVED", "lab", n) for n in BROKERS
    }
    assert "deviations: PROBE_UNKNOWN_PARTITION_SERVED 3" in done.stderr
    assert re.search(r"^1 +OffsetForLeaderEpoch +v4 .* NONE! 1/1$", done.stderr, re.MULTILINE), done.stderr


def test_an_unreachable_cluster_is_one_line_and_exit_1():
    dead = f"127.0.0.1:{free_port()}"
    done = fencewatch("--bootstrap-servers", dead, "--once", "--timeout-seconds", "1")
    assert done.returncode == 1
    lines = done.stderr.splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith(f"fencewatch probe: cannot probe Kafka at {dead}: no answer within 1s")


def test_a_tls_setting_the_probe_cannot_use_is_one_line_and_exit_1(server: FencingServer):
    done = fencewatch(
        "--bootstrap-servers", server.bootstrap_servers, "--kafka-config", "ssl.keystore.location=k"
    )
    assert done.returncode == 1
    assert done.stderr.count("\n") == 1
    assert done.stderr.startswith(
        "fencewatch probe: the probe cannot use --kafka-config ssl.keystore.location"
    )
    assert server.requests() == []


def test_once_delivers_alerts_to_webhooks_filtered_by_probe_rule(server: FencingServer, tmp_path: Path):
    from webhooks.receiver import WebhookReceiver

    server.cluster.misbehave(LIST_OFFSETS, "follower", 0)
    server.cluster.misbehave(FETCH, "future", 0)
    with WebhookReceiver(0) as receiver:
        config = tmp_path / "hooks.toml"
        url = receiver.url("/hook")
        config.write_text(
            f'[[endpoint]]\nname = "oncall"\nurl = "{url}"\nrules = ["PROBE_NON_LEADER_SERVED"]\n'
        )
        done = fencewatch(
            *("--bootstrap-servers", server.bootstrap_servers, "--once", "--quiet"),
            *("--webhooks", str(config), "--webhook-outbox", str(tmp_path / "outbox.sqlite")),
        )
        assert done.returncode == 3, done.stderr
        bodies = [r["body"] for r in receiver.received if r["path"] == "/hook"]
    # Only the endpoint's rule: the 15 follower deviations, each once.
    assert len(bodies) == len({b["alert_id"] for b in bodies}) == 15
    assert {b["rule"] for b in bodies} == {"PROBE_NON_LEADER_SERVED"}


def test_interval_runs_as_a_canary_with_metrics_until_sigterm(server: FencingServer, tmp_path: Path):
    import signal
    import time
    import urllib.request

    server.cluster.misbehave(FETCH, "past", 0)
    argv = ["probe", "--bootstrap-servers", server.bootstrap_servers, "--interval", "0.3", "--cluster", "lab"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "fencewatch", *argv, "--metrics-port", "0", "--metrics-bind", "127.0.0.1"],
        stdout=subprocess.PIPE,
        stderr=(tmp_path / "stderr").open("w"),
        stdin=subprocess.DEVNULL,
        text=True,
    )
    try:
        deadline = time.monotonic() + 60
        port = None
        while port is None and time.monotonic() < deadline:
            found = re.search(
                r"metrics on http://127\.0\.0\.1:(\d+)/metrics", (tmp_path / "stderr").read_text()
            )
            port = int(found.group(1)) if found else None
            time.sleep(0.05)
        assert port is not None, (tmp_path / "stderr").read_text()

        def scrape() -> str:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as answer:
                return answer.read().decode()

        deviating = re.compile(
            r'^fencewatch_probe_requests_total\{api="Fetch",cluster="lab",outcome="deviating"\} (\S+)$', re.M
        )

        def deviating_requests(text: str) -> float:
            found = deviating.search(text)
            return float(found.group(1)) if found else 0.0

        text = scrape()
        while time.monotonic() < deadline and deviating_requests(text) < 12:
            time.sleep(0.1)
            text = scrape()
        # Each round: Fetch at a past epoch to 3 brokers, each confirmed: 6 deviating requests.
        assert deviating_requests(text) >= 12 and deviating_requests(text) % 6 == 0, text
        assert 'fencewatch_probe_deviations_total{cluster="lab",rule="PROBE_STALE_EPOCH_SERVED"}' in text
        assert "fencewatch_probe_last_success_timestamp_seconds" in text
        assert "fencewatch_query_running" not in text  # no streaming job here
    finally:
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 130
    alerts = [orjson.loads(line) for line in out.splitlines()]
    # The same 12 deviations every round: each alert printed once.
    assert len(alerts) == len({a["alert_id"] for a in alerts}) == 12


def test_a_canary_stopped_during_its_first_round_finishes_it_and_exits_130(
    server: FencingServer, tmp_path: Path
):
    """SIGTERM as soon as the canary serves its metrics, while its first round is
    under way: the round is finished and delivered, then the canary exits as
    Ctrl-C ends a command (a SIGTERM there used to kill it outright)."""
    import signal
    import time

    server.cluster.misbehave(FETCH, "past", 0)
    argv = ["probe", "--bootstrap-servers", server.bootstrap_servers, "--interval", "60", "--cluster", "lab"]
    stderr = tmp_path / "stderr"
    proc = subprocess.Popen(
        [sys.executable, "-m", "fencewatch", *argv, "--metrics-port", "0", "--metrics-bind", "127.0.0.1"],
        stdout=subprocess.PIPE,
        stderr=stderr.open("w"),
        stdin=subprocess.DEVNULL,
        text=True,
    )
    try:
        deadline = time.monotonic() + 60
        while "metrics on http://" not in stderr.read_text() and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 130, stderr.read_text()
    assert "fencewatch probe: cluster lab: " in stderr.read_text(), "the first round's table"
    alerts = [orjson.loads(line) for line in out.splitlines()]
    assert alerts and {a["rule"] for a in alerts} == {"PROBE_STALE_EPOCH_SERVED"}


def test_the_pacer_spaces_requests_to_one_broker_and_not_across_brokers():
    from probe.client import Pacer

    now = [100.0]
    pacer = Pacer(20.0, clock=lambda: now[0], sleep=lambda s: now.__setitem__(0, now[0] + s))
    for _ in range(21):
        pacer.wait(1)
    assert now[0] == pytest.approx(101.0)  # 21 requests: 20 gaps of 50 ms
    pacer.wait(2)  # another broker: no wait
    assert now[0] == pytest.approx(101.0)
    with pytest.raises(ValueError):
        Pacer(0)


def test_librdkafka_tls_and_sasl_settings_map_to_the_probe_client():
    from probe.client import client_settings

    mapped = client_settings(
        {
            "security.protocol": "sasl_ssl",
            "ssl.ca.location": "/ca.pem",
            "ssl.endpoint.identification.algorithm": "none",
            "sasl.mechanism": "SCRAM-SHA-512",
            "sasl.username": "probe",
            "sasl.password": "secret",
            "linger.ms": "5",  # a producer setting: the alerts topic's, not the probe's
        }
    )
    assert mapped == {
        "security_protocol": "SASL_SSL",
        "ssl_cafile": "/ca.pem",
        "ssl_check_hostname": False,
        "sasl_mechanism": "SCRAM-SHA-512",
        "sasl_plain_username": "probe",
        "sasl_plain_password": "secret",
    }
    with pytest.raises(ValueError, match=re.escape("--kafka-config sasl.oauthbearer.method")):
        client_settings({"sasl.oauthbearer.method": "oidc"})
