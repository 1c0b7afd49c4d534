"""The pipeline with its observability around it, all real: the embedded
broker, ``fencewatch simulate`` publishing faults, ``fencewatch run`` on local
Spark serving /metrics and posting webhooks, Prometheus (Debian's package)
scraping it with the shipped alert rules, Alertmanager (Debian's package) with
the shipped routing, and a local webhook receiver.

It checks that the job's webhooks deliver every alert, signed; that a shipped
Prometheus alert rule fires and Alertmanager posts it; that every dashboard
panel's PromQL returns data; and it plots each panel's results to PNG files
(``build/e2e/``, or $FENCEWATCH_E2E_ARTIFACTS) so a reviewer can see the
numbers move without a Grafana server.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
import yaml
from dashboard_queries import all_dashboards, panel_queries
from spark_cluster import ChildProcess, child_env, fencewatch_run, wait_until
from test_job import publish, read_topic, replay_alerts

from detectors.config import DetectorConfig
from streaming.broker import EmbeddedBroker, free_port
from webhooks.receiver import WebhookReceiver

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
SECRET, SECRET_ENV = "e2e-webhook-secret", "FENCEWATCH_E2E_WEBHOOK_SECRET"
WRONG_SECRET_ENV = "FENCEWATCH_E2E_WRONG_SECRET"
# Slow enough that the job's counters move across many scrapes (rates in the plots).
EVENTS, RATE = 36_000, 1_500
# Alerts of the probe beside the job (run --probe-interval) on the 1-partition topic it asks about.
PROBE_ALERTS = 4
# Alertmanager cannot sign, so its notifications go to a receiver without a secret.
ALERTMANAGER_PATH = "/alertmanager"
BAD_RECORDS = [b'{"cluster": "sim-1", "ts_ms": 1', b'{"cluster": "sim-1", "kind": "gossip"}']


def binary(name: str) -> str:
    path = shutil.which(name)
    assert path, f"{name} is not installed: apt-get install prometheus prometheus-alertmanager (.ci/run does)"
    return path


def toml_endpoint(**settings: object) -> str:
    # JSON strings, numbers and string arrays are valid TOML values.
    return "[[endpoint]]\n" + "".join(f"{k} = {json.dumps(v)}\n" for k, v in settings.items()) + "\n"


def webhooks_config(path: Path, receiver: WebhookReceiver, dead_port: int) -> Path:
    """Three formats to the receiver; one endpoint held back by its rate
    limit; and two that fail: one with the wrong secret (401: retried, its
    backlog grows) and one down whose alerts outlive a short max age (parked)."""
    fast = {"rate_per_second": 500.0, "burst": 100, "backoff_base_seconds": 0.2, "backoff_cap_seconds": 2.0}
    text = "".join(
        toml_endpoint(name=fmt, url=receiver.url(path), format=fmt, secret_env=SECRET_ENV, **fast)
        for fmt, path in (("json", "/hook"), ("alertmanager", "/am-format"), ("slack", "/slack"))
    )
    text += toml_endpoint(
        name="throttled", url=receiver.url("/throttled"), secret_env=SECRET_ENV, rate_per_second=2.0, burst=1
    )
    text += toml_endpoint(
        name="wrong-secret", url=receiver.url("/wrong"), secret_env=WRONG_SECRET_ENV, severities=["critical"]
    )
    text += toml_endpoint(
        name="down",
        url=f"http://127.0.0.1:{dead_port}/",
        severities=["critical"],
        max_age_seconds=3,
        backoff_base_seconds=0.5,
        backoff_cap_seconds=2.0,
    )
    path.write_text(text)
    return path


def prometheus_config(work: Path, metrics_port: int, alertmanager_port: int) -> Path:
    """The shipped prometheus.yml, pointed at this test's job and Alertmanager, at 1 s resolution."""
    config = yaml.safe_load((REPO / "dashboards/prometheus/prometheus.yml").read_text())
    config["global"].update(scrape_interval="1s", evaluation_interval="1s")
    config["rule_files"] = [str(REPO / "dashboards/prometheus" / f) for f in config["rule_files"]]
    config["alerting"]["alertmanagers"][0]["static_configs"] = [
        {"targets": [f"127.0.0.1:{alertmanager_port}"]}
    ]
    jobs = [job for job in config["scrape_configs"] if job["job_name"] == "fencewatch"]
    assert jobs, "the shipped prometheus.yml has no fencewatch scrape job"
    jobs[0]["static_configs"] = [{"targets": [f"127.0.0.1:{metrics_port}"]}]
    config["scrape_configs"] = jobs
    path = work / "prometheus.yml"
    path.write_text(yaml.safe_dump(config))
    return path


def alertmanager_config(work: Path, receiver: WebhookReceiver) -> Path:
    """The shipped alertmanager.yml with its webhooks pointed at the receiver and short waits."""
    config = yaml.safe_load((REPO / "dashboards/alertmanager/alertmanager.yml").read_text())
    for receiver_config in config["receivers"]:
        for hook in receiver_config.get("webhook_configs", []):
            hook["url"] = receiver.url(ALERTMANAGER_PATH)
    routes = [config["route"], *config["route"].get("routes", [])]
    for route in routes:
        route.update(group_wait="1s", group_interval="2s")
    path = work / "alertmanager.yml"
    path.write_text(yaml.safe_dump(config))
    return path


def query_range(prometheus: str, expr: str, start: float, end: float) -> list[dict[str, Any]]:
    reply = httpx.get(
        f"{prometheus}/api/v1/query_range", params={"query": expr, "start": start, "end": end, "step": "1s"}
    )
    body = reply.json()
    assert reply.status_code == 200 and body["status"] == "success", f"{expr}: {body}"
    return body["data"]["result"]


def plot(results: list[tuple[str, str, list[dict[str, Any]]]], start: float, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    columns = 3
    rows = (len(results) + columns - 1) // columns
    fig, axes = plt.subplots(rows, columns, figsize=(6 * columns, 3.2 * rows), squeeze=False)
    for ax, (title, expr, series) in zip(axes.flat, results, strict=False):
        for s in series[:8]:
            xs = [float(t) - start for t, _ in s["values"]]
            ys = [float(v) for _, v in s["values"]]
            label = ",".join(f"{k}={v}" for k, v in s["metric"].items() if k not in ("job", "instance"))
            ax.plot(xs, ys, label=label[:60] or "value")
        if not series:
            ax.text(0.5, 0.5, "no data", transform=ax.transAxes, ha="center")
        ax.set_title(title, fontsize=9)
        ax.set_xlabel("seconds since the job started", fontsize=7)
        ax.tick_params(labelsize=7)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=6, loc="upper left")
        ax.text(0.99, 0.01, expr[:90], transform=ax.transAxes, fontsize=5, ha="right", va="bottom", alpha=0.6)
    for ax in list(axes.flat)[len(results) :]:
        ax.axis("off")
    fig.tight_layout()
    fig.savefig(out, dpi=80)
    plt.close(fig)


@pytest.mark.timeout(900)
def test_metrics_dashboards_alert_rules_and_webhooks_end_to_end(
    broker: EmbeddedBroker, tmp_path: Path
) -> None:
    artifacts = Path(os.environ.get("FENCEWATCH_E2E_ARTIFACTS", REPO / "build" / "e2e"))
    artifacts.mkdir(parents=True, exist_ok=True)
    source, alerts_topic, dead_topic = "e2e-events", "e2e-alerts", "e2e-dead-letters"
    # The probe beside the job asks about this topic: tansu serves a future epoch (Fetch and
    # ListOffsets) and a partition it lacks (both APIs): PROBE_ALERTS alerts, the same each round.
    probed = "e2e-probed"
    broker.create_topics({source: 3, alerts_topic: 1, dead_topic: 1, probed: 1})
    metrics_port, prometheus_port, alertmanager_port = free_port(), free_port(), free_port()
    prometheus = f"http://127.0.0.1:{prometheus_port}"
    receiver = WebhookReceiver(0, secret=SECRET.encode())
    alertmanager_receiver = WebhookReceiver(0)
    env = child_env(**{SECRET_ENV: SECRET, WRONG_SECRET_ENV: "not-the-secret"})
    job = fencewatch_run(
        [
            *("--bootstrap-servers", broker.bootstrap_servers, "--topic", source),
            *("--checkpoint", str(tmp_path / "ck"), "--alerts-topic", alerts_topic),
            *("--dead-letter-topic", dead_topic, "--quiet", "--trigger-seconds", "1"),
            *("--idle-flush-ms", "3000", "--metrics-port", str(metrics_port), "--metrics-bind", "127.0.0.1"),
            # One bucket measures clocks: the clock offset panel and FencewatchClockSkew's metric.
            *("--buckets", "1", "--measure-clocks"),
            *("--webhooks", str(webhooks_config(tmp_path / "hooks.toml", receiver, free_port()))),
            *("--probe-interval", "2", "--probe-cluster", "sim-1", "--probe-topics", probed),
        ],
        tmp_path / "run.log",
        env,
    )
    prom = ChildProcess(
        [
            binary("prometheus"),
            f"--config.file={prometheus_config(tmp_path, metrics_port, alertmanager_port)}",
            f"--storage.tsdb.path={tmp_path / 'prometheus-data'}",
            f"--web.listen-address=127.0.0.1:{prometheus_port}",
        ],
        tmp_path / "prometheus.log",
    )
    alertmanager = ChildProcess(
        [
            binary("prometheus-alertmanager"),
            f"--config.file={alertmanager_config(tmp_path, alertmanager_receiver)}",
            f"--storage.path={tmp_path / 'alertmanager-data'}",
            f"--web.listen-address=127.0.0.1:{alertmanager_port}",
            "--cluster.listen-address=",
        ],
        tmp_path / "alertmanager.log",
    )
    simulator = ChildProcess(
        [
            *(sys.executable, "-m", "fencewatch", "simulate", "--seed", "5"),
            *("--events", str(EVENTS), "--fault-rate", "0.01", "--rate", str(RATE)),
            *("--bootstrap-servers", broker.bootstrap_servers, "--topic", source),
            *("--truth", str(tmp_path / "truth.jsonl")),
        ],
        tmp_path / "simulate.log",
    )
    children = [job, prom, alertmanager]
    try:
        for child in children:
            child.start()
        started = time.time()
        wait_until(lambda: _ready(prometheus), "Prometheus to be ready", 60, alive=[prom])
        wait_until(
            lambda: _scraped(prometheus), "Prometheus to scrape the job's /metrics", 120, alive=children
        )
        simulator.start()
        publish(broker, source, [(b"sim-1", bad) for bad in BAD_RECORDS])
        wait_until(lambda: not simulator.alive(), "the simulator to publish", 300, alive=children)
        assert simulator.proc is not None and simulator.proc.returncode == 0, simulator.log_tail()

        # What the job must raise: fencewatch replay's alerts on the topic's records.
        records = [value for _, value in read_topic(broker, source)]
        events = [orjson.loads(v) for v in records if v not in BAD_RECORDS]
        expected = replay_alerts(events, DetectorConfig(measure_clocks=True))
        assert len(expected) >= 10
        wait_until(
            lambda: _delivered(receiver, "/hook") >= len(expected) + PROBE_ALERTS,
            "every alert at /hook",
            300,
            children,
        )
        wait_until(
            lambda: _alertmanager_posted(alertmanager_receiver, "FencewatchCriticalViolation"),
            "Alertmanager to post FencewatchCriticalViolation",
            120,
            alive=children,
        )
        time.sleep(5)  # a few more scrapes with the job idle, so rates fall back in the plots
        end = time.time()

        hook = [r for r in receiver.received if r["path"] == "/hook"]
        probe = [r for r in hook if r["body"]["rule"].startswith("PROBE_")]
        assert sorted(r["body"]["alert_id"] for r in hook if r not in probe) == sorted(expected)
        assert len({r["body"]["alert_id"] for r in probe}) == len(probe) == PROBE_ALERTS
        assert all(r["headers"]["X-Fencewatch-Signature"].startswith("v1=") for r in hook)
        for path, fmt in (("/am-format", "alertmanager"), ("/slack", "slack")):
            assert _delivered(receiver, path) == len(expected) + PROBE_ALERTS, path
            assert {r["format"] for r in receiver.received if r["path"] == path} == {fmt}
        assert not any(r["path"] == "/wrong" for r in receiver.received), "a wrongly signed post was accepted"

        empty, results = [], []
        for dashboard in all_dashboards():
            for title, ref, expr in panel_queries(dashboard, cluster_regex="sim-1", rate_interval="10s"):
                series = query_range(prometheus, expr, started, end)
                results.append((f"{title} [{ref}]", expr, series))
                if not any(s["values"] for s in series):
                    empty.append(f"{dashboard.name}: {title} [{ref}]: {expr}")
            plot(results, started, artifacts / f"{dashboard.stem}.png")
        print(f"panel plots: {artifacts}")
        assert not empty, "panels without data:\n" + "\n".join(empty)
    finally:
        for child in (simulator, *children):
            child.stop(30)
        receiver.stop()
        alertmanager_receiver.stop()
        for name in ("run.log", "prometheus.log", "alertmanager.log", "simulate.log"):
            if (tmp_path / name).exists():
                shutil.copy(tmp_path / name, artifacts / name)


def _ready(prometheus: str) -> bool:
    try:
        return httpx.get(f"{prometheus}/-/ready").status_code == 200
    except httpx.HTTPError:
        return False


def _scraped(prometheus: str) -> bool:
    reply = httpx.get(f"{prometheus}/api/v1/query", params={"query": 'up{job="fencewatch"} == 1'})
    return bool(reply.json()["data"]["result"])


def _delivered(receiver: WebhookReceiver, path: str) -> int:
    return sum(1 for r in receiver.received if r["path"] == path)


def _alertmanager_posted(receiver: WebhookReceiver, alertname: str) -> bool:
    return any(
        a["labels"].get("alertname") == alertname
        for r in receiver.received
        if r["path"] == ALERTMANAGER_PATH
        for a in r["body"]["alerts"]
    )
