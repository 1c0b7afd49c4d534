"""Clock bounds read from a real Prometheus (``--clock-bounds-from-prometheus``,
producers.prometheus_clock_bounds): Debian's Prometheus scrapes two small
node_exporter-like exporters started here, each serving one host's
``node_timex_offset_seconds`` and ``node_timex_maxerror_seconds``; replay
asks it once at the start.

The input is the sparse incident of tests/unit/test_possible_violations.py
(a metadata dump and broker 3's few dozen requests, its interval seconds
wide): a StopReplica applied 4 s after its epoch was superseded is a
possible violation on the evidence alone, and a certain one once broker 3's
clock is bounded to 200 ms, which the two hosts' clock errors of 100 ms each
give (broker 3's host's plus the controller host's)."""

from __future__ import annotations

import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import orjson
import pytest
import yaml
from spark_cluster import ChildProcess, child_env, wait_until

from detectors.errors import KafkaError
from producers import shapes as s
from producers.prometheus_clock_bounds import read_bounds
from streaming.broker import free_port

pytestmark = pytest.mark.integration

CLUSTER = "c1"
ORDERS_ID, EVENTS_ID = "qG8hUlWTTJ2eRb_bFvWRXg", "Zq0aYbB5Rj2xWk9cD3e4fA"
BROKER = 3


class Exporter:
    """One host's clock as node_exporter's timex collector exports it, on a port of its own."""

    def __init__(self, offset_s: float, maxerror_s: float) -> None:
        text = (
            "# TYPE node_timex_offset_seconds gauge\n"
            f"node_timex_offset_seconds {offset_s}\n"
            "# TYPE node_timex_maxerror_seconds gauge\n"
            f"node_timex_maxerror_seconds {maxerror_s}\n"
        ).encode()

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.end_headers()
                self.wfile.write(text)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.instance = f"127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


@pytest.fixture
def prometheus(tmp_path: Path) -> Iterator[tuple[str, Exporter, Exporter]]:
    """A Prometheus scraping broker 3's host (offset -30 ms, maximum error 70 ms)
    and the controller's (+10 ms, 90 ms) every second: its URL and the two exporters."""
    binary = shutil.which("prometheus")
    assert binary, "prometheus is not installed: apt-get install prometheus (.ci/run does)"
    broker_host, controller_host = Exporter(-0.03, 0.07), Exporter(0.01, 0.09)
    config = tmp_path / "prometheus.yml"
    config.write_text(
        yaml.safe_dump(
            {
                "global": {"scrape_interval": "1s"},
                "scrape_configs": [
                    {
                        "job_name": "node",
                        "static_configs": [{"targets": [broker_host.instance, controller_host.instance]}],
                    }
                ],
            }
        )
    )
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    prom = ChildProcess(
        [
            binary,
            f"--config.file={config}",
            f"--storage.tsdb.path={tmp_path / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        tmp_path / "prometheus.log",
    )
    prom.start()
    try:
        wait_until(lambda: _both_scraped(url), "Prometheus to scrape both hosts' clocks", 120, alive=[prom])
        yield url, broker_host, controller_host
    finally:
        prom.kill()
        broker_host.server.shutdown()
        controller_host.server.shutdown()


def _both_scraped(url: str) -> bool:
    try:
        reply = httpx.get(f"{url}/api/v1/query", params={"query": "node_timex_maxerror_seconds"})
    except httpx.HTTPError:
        return False
    return reply.status_code == 200 and len(reply.json()["data"]["result"]) == 2


def test_each_mapped_nodes_bound_is_its_hosts_error_plus_the_largest(prometheus):
    url, broker_host, controller_host = prometheus
    read = read_bounds(url, {BROKER: broker_host.instance, 3000: controller_host.instance, 2: "nowhere:9100"})
    # 30 + 70 ms for broker 3's host, 10 + 90 ms for the controller's: each plus the larger, 100 ms.
    assert read.bounds == {BROKER: 200, 3000: 200}
    assert read.warnings == [
        "node 2: Prometheus has no node_timex_offset_seconds or node_timex_maxerror_seconds for "
        "instance 'nowhere:9100' (is node_exporter's timex collector scraped there?): no bound read for it"
    ]


def test_replay_with_bounds_from_prometheus_makes_the_incidents_verdict_certain(prometheus, tmp_path):
    url, broker_host, controller_host = prometheus
    incident = tmp_path / "incident.jsonl"
    incident.write_bytes(b"".join(orjson.dumps(env) + b"\n" for env in sparse_incident()))
    alone = replay(tmp_path, str(incident))
    assert alone.returncode == 0, alone.stderr
    assert confidences(alone) == [("STOP_REPLICA_STALE_EPOCH_APPLIED", "possible")]
    mapped = (
        *("--clock-bounds-from-prometheus", url),
        *("--clock-bound-instance", f"{BROKER}={broker_host.instance}"),
        *("--clock-bound-instance", f"3000={controller_host.instance}"),
        *("--clock-bound-instance", "2=nowhere:9100"),
    )
    bounded = replay(tmp_path, str(incident), *mapped)
    assert bounded.returncode == 0, bounded.stderr
    assert confidences(bounded) == [("STOP_REPLICA_STALE_EPOCH_APPLIED", "certain")]
    assert [line for line in bounded.stderr.splitlines() if "warning" in line] == [
        "fencewatch: warning: node 2: Prometheus has no node_timex_offset_seconds or "
        "node_timex_maxerror_seconds for instance 'nowhere:9100' (is node_exporter's timex collector "
        "scraped there?): no bound read for it"
    ]
    # A looser bound given by hand does not loosen it; the tighter wins either way.
    loose = replay(tmp_path, str(incident), *mapped, "--clock-bound-ms", "3=5000")
    assert confidences(loose) == [("STOP_REPLICA_STALE_EPOCH_APPLIED", "certain")]


def test_a_url_where_no_prometheus_answers_ends_replay_in_one_line(prometheus, tmp_path):
    _, broker_host, _ = prometheus
    incident = tmp_path / "incident.jsonl"
    incident.write_bytes(b"".join(orjson.dumps(env) + b"\n" for env in sparse_incident()))
    dead = f"http://127.0.0.1:{free_port()}"
    for url, why in (
        (dead, f"cannot ask Prometheus at {dead}: "),
        # node_exporter itself, given by mistake: it answers, but not as Prometheus's API does.
        (
            f"http://{broker_host.instance}",
            "did not answer node_timex_offset_seconds as Prometheus's HTTP API does",
        ),
    ):
        done = replay(
            tmp_path, str(incident), "--clock-bounds-from-prometheus", url, "--clock-bound-instance", "3=h:1"
        )
        assert done.returncode == 1
        [line] = done.stderr.strip().splitlines()
        assert line.startswith("fencewatch: --clock-bounds-from-prometheus: ") and why in line, line
        assert line.endswith("-- check the URL and that Prometheus runs")


def confidences(done: subprocess.CompletedProcess[str]) -> list[tuple[str, str]]:
    """Each alert replay printed (one JSON object a line on stdout): its rule and confidence."""
    alerts = [orjson.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    return [(alert["rule"], alert["confidence"]) for alert in alerts]


def replay(cwd: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "fencewatch", "replay", *argv],
        cwd=cwd,
        env=child_env(),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=300,
    )


def sparse_incident() -> list[dict[str, object]]:
    """The incident's envelopes in time order (tests/unit/test_possible_violations.py):
    the cluster set up at 1 s, ``events-0`` at leader epoch 5 at 10 s, ``orders-0``
    moved to leader epoch 1 at 20 s; broker 3 fetches ``events-0`` once a second
    from 14 s and applies a StopReplica for epoch 0 of ``orders-0`` at 24 s."""
    records = [
        s.feature_level(21),
        *(s.register_broker(broker, epoch, fenced=False) for broker, epoch in {1: 10, 2: 11, 3: 12}.items()),
        s.topic("orders", ORDERS_ID),
        s.partition(ORDERS_ID, 0, [1, 2, 3], [1, 2, 3], 1),
    ]
    envelopes = [s.envelope(CLUSTER, "metadata", 1000, body, offset=i + 1) for i, body in enumerate(records)]
    events = [
        s.topic("events", EVENTS_ID),
        s.partition(EVENTS_ID, 0, [1, 2, 3], [1, 2, 3], 1, leader_epoch=5),
    ]
    envelopes += [
        s.envelope(CLUSTER, "metadata", 10_000, body, offset=7 + i) for i, body in enumerate(events)
    ]
    envelopes.append(
        s.envelope(CLUSTER, "metadata", 20_000, s.partition_change(ORDERS_ID, 0, leader=2), offset=9)
    )
    for i in range(36):
        fetch = s.fetch("events", 0, 0, epoch=5)
        fetch["requestHeader"] = {**fetch["requestHeader"], "correlationId": i + 1}
        envelopes.append(s.envelope(CLUSTER, "request", 14_000 + 1_000 * i, fetch, node=BROKER))
    stop = s.stop_replica("orders", 0, 0, KafkaError.NONE)
    envelopes.append(s.envelope(CLUSTER, "request", 24_000, stop, node=BROKER))
    return sorted(envelopes, key=lambda env: env["ts_ms"])  # type: ignore[arg-type,return-value]
