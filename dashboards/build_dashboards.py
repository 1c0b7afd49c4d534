"""Build the Grafana dashboards in dashboards/grafana/ from this file.

    python dashboards/build_dashboards.py          # write the JSON
    python dashboards/build_dashboards.py --check  # exit 1 if the JSON on disk is stale

Every panel queries Prometheus through the ``${datasource}`` variable and is
filtered by the ``$cluster`` variable. The detector's metrics carry a
``cluster`` label; the job's own metrics (query progress, source lag, sinks,
webhooks) do not, so they are narrowed to the jobs (``job``, ``instance``)
that export a selected cluster. Counters are read with ``rate(...
[$__rate_interval])`` (or ``increase(...[$__range])`` for totals over the
time range). The metrics are defined in streaming/metrics.py; tests/unit/
test_dashboards.py checks every query against them and against promtool.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

GRAFANA_DIR = Path(__file__).resolve().parent / "grafana"

DS = {"type": "prometheus", "uid": "${datasource}"}
CLUSTER = 'cluster=~"$cluster"'
# The jobs that export one of the selected clusters: job-level metrics are joined on it.
JOBS = f"group by (job, instance) (fencewatch_events_total{{{CLUSTER}}})"
RATE = "[$__rate_interval]"
RANGE = "[$__range]"


def scoped(selector: str) -> str:
    """A job-level selector (or an expression keeping job and instance) narrowed to the
    selected clusters. Put it inside an aggregation's parentheses."""
    return f"{selector} and on (job, instance) {JOBS}"


# ---- panel builders ------------------------------------------------------------------------


def target(
    expr: str, legend: str = "", ref: str = "A", *, instant: bool = False, table: bool = False
) -> dict[str, Any]:
    return {
        "datasource": DS,
        "editorMode": "code",
        "expr": expr,
        "format": "table" if table else "time_series",
        "instant": instant,
        "legendFormat": legend or "__auto",
        "range": not instant,
        "refId": ref,
    }


def targets(*specs: tuple[str, str]) -> list[dict[str, Any]]:
    """Range targets A, B, C... from (expr, legend) pairs."""
    return [target(expr, legend, chr(ord("A") + i)) for i, (expr, legend) in enumerate(specs)]


def thresholds(*steps: tuple[float | None, str]) -> dict[str, Any]:
    return {"mode": "absolute", "steps": [{"color": color, "value": value} for value, color in steps]}


def timeseries(
    title: str,
    description: str,
    panel_targets: list[dict[str, Any]],
    *,
    unit: str = "short",
    stack: bool = False,
    bars: bool = False,
    min_zero: bool = True,
    steps: tuple[tuple[float | None, str], ...] | None = None,
) -> dict[str, Any]:
    """A time series panel; ``steps`` (thresholds) are drawn as dashed lines."""
    custom: dict[str, Any] = {
        "drawStyle": "bars" if bars else "line",
        "fillOpacity": 60 if bars else 10,
        "lineWidth": 1,
        "pointSize": 4,
        "showPoints": "never" if not bars else "auto",
        "spanNulls": False,
        "stacking": {"group": "A", "mode": "normal" if stack else "none"},
    }
    defaults: dict[str, Any] = {"custom": custom, "unit": unit}
    if min_zero:
        defaults["min"] = 0
    if steps:
        custom["thresholdsStyle"] = {"mode": "dashed"}
        defaults["thresholds"] = thresholds(*steps)
    return {
        "type": "timeseries",
        "title": title,
        "description": description,
        "datasource": DS,
        "fieldConfig": {"defaults": defaults, "overrides": []},
        "options": {
            "legend": {
                "calcs": ["lastNotNull", "max"],
                "displayMode": "table",
                "placement": "bottom",
                "showLegend": True,
            },
            "tooltip": {"mode": "multi", "sort": "desc"},
        },
        "targets": panel_targets,
    }


def stat(
    title: str,
    description: str,
    panel_targets: list[dict[str, Any]],
    *,
    unit: str = "none",
    steps: tuple[tuple[float | None, str], ...] = ((None, "green"), (1, "red")),
    mappings: list[dict[str, Any]] | None = None,
    decimals: int | None = 0,
    text_mode: str = "value_and_name",
    overrides: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    defaults: dict[str, Any] = {"mappings": mappings or [], "thresholds": thresholds(*steps), "unit": unit}
    if decimals is not None:
        defaults["decimals"] = decimals
    return {
        "type": "stat",
        "title": title,
        "description": description,
        "datasource": DS,
        "fieldConfig": {"defaults": defaults, "overrides": overrides or []},
        "options": {
            "colorMode": "background",
            "graphMode": "none",
            "justifyMode": "auto",
            "orientation": "auto",
            "reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
            "textMode": text_mode,
        },
        "targets": panel_targets,
    }


def table(
    title: str,
    description: str,
    expr: str,
    *,
    hide: tuple[str, ...] = ("Time",),
    rename: dict[str, str] | None = None,
    sort_by: str | None = None,
) -> dict[str, Any]:
    options: dict[str, Any] = {"cellHeight": "sm", "footer": {"show": False}, "showHeader": True}
    if sort_by:
        options["sortBy"] = [{"desc": True, "displayName": sort_by}]
    return {
        "type": "table",
        "title": title,
        "description": description,
        "datasource": DS,
        "fieldConfig": {"defaults": {"custom": {"align": "auto"}, "decimals": 0}, "overrides": []},
        "options": options,
        "targets": [target(expr, instant=True, table=True)],
        "transformations": [
            {
                "id": "organize",
                "options": {
                    "excludeByName": dict.fromkeys(hide, True),
                    "renameByName": rename or {},
                },
            }
        ],
    }


def row(title: str) -> dict[str, Any]:
    return {"type": "row", "title": title, "collapsed": False, "panels": []}


def layout(rows: list[tuple[dict[str, Any], list[tuple[dict[str, Any], int, int]]]]) -> list[dict[str, Any]]:
    """Give each panel an id and a gridPos: rows of (panel, width, height), wrapped at 24 columns."""
    panels: list[dict[str, Any]] = []
    y = 0
    for row_panel, members in rows:
        panels.append({**row_panel, "id": len(panels) + 1, "gridPos": {"h": 1, "w": 24, "x": 0, "y": y}})
        y += 1
        x, line_height = 0, 0
        for panel, width, height in members:
            if x + width > 24:
                x, y, line_height = 0, y + line_height, 0
            grid = {"h": height, "w": width, "x": x, "y": y}
            panels.append({**panel, "id": len(panels) + 1, "gridPos": grid})
            x += width
            line_height = max(line_height, height)
        y += line_height
    return panels


# ---- the overview dashboard ----------------------------------------------------------------

ALERTS_BODY_NOTE = (
    "Prometheus holds only counts. Each alert's body (node, partition, message and the evidence "
    "chain with source positions) is in the alerts topic (default fencewatch-alerts, keyed by "
    "cluster, header fencewatch-id = alert_id) and at the webhook receivers; see "
    "docs/operations.md and docs/rules.md."
)


def violations_row() -> list[tuple[dict[str, Any], int, int]]:
    # Certain violations; possible ones (detectors.alerts.POSSIBLE) have a panel of their own.
    firing = f'fencewatch_alerts_total{{{CLUSTER}, status="firing", confidence!="possible"}}'
    possible = f'fencewatch_alerts_total{{{CLUSTER}, status="firing", confidence="possible"}}'
    return [
        (
            timeseries(
                "Violations by rule",
                "New certain fencing violations per minute, by rule (firing alerts; resolved timer "
                "alerts and possible violations are not counted). " + ALERTS_BODY_NOTE,
                [target(f"60 * sum by (rule) (rate({firing}{RATE}))", "{{rule}}")],
                unit="suffix: /min",
                stack=True,
                bars=True,
            ),
            16,
            9,
        ),
        (
            stat(
                "Violations in range by severity",
                "Firing alerts raised during the dashboard's time range, by severity.",
                [target(f"sum by (severity) (increase({firing}{RANGE}))", "{{severity}}", instant=True)],
                overrides=[
                    {
                        "matcher": {"id": "byName", "options": "warning"},
                        "properties": [
                            {"id": "thresholds", "value": thresholds((None, "green"), (1, "orange"))}
                        ],
                    }
                ],
            ),
            8,
            9,
        ),
        (
            timeseries(
                "Possible violations by rule",
                "New possible violations per minute, by rule: each holds for some clock offsets its "
                "node's evidence allows, not all (severity info; they page no one). The alert's "
                "clock_condition says for which offsets; a bound on the node's clock "
                "(--clock-bound-ms) makes it certain or clears it. None is drawn as 0, not as no "
                "data: a cluster with well-bounded clocks has none. " + ALERTS_BODY_NOTE,
                [target(f"60 * sum by (rule) (rate({possible}{RATE})) or on() vector(0)", "{{rule}}")],
                unit="suffix: /min",
                stack=True,
                bars=True,
            ),
            24,
            6,
        ),
        (
            table(
                "Alerts raised in range",
                "How many alerts of each rule each cluster raised during the time range, most first; "
                "confidence says certain or possible. " + ALERTS_BODY_NOTE,
                "sort_desc(sum by (cluster, rule, severity, confidence) "
                f'(increase(fencewatch_alerts_total{{{CLUSTER}, status="firing"}}{RANGE})) > 0)',
                rename={"Value": "alerts"},
                sort_by="alerts",
            ),
            12,
            9,
        ),
        (
            table(
                "Firing Prometheus alerts",
                "Prometheus alert rules of dashboards/prometheus/rules/fencewatch.rules.yml that fire "
                "now (series ALERTS), for the selected clusters and for the job itself. Their runbooks "
                "are in docs/operations.md.",
                'ALERTS{alertname=~"Fencewatch.+", alertstate="firing", cluster=~"$cluster|"}',
                hide=("Time", "Value", "__name__", "alertstate"),
            ),
            12,
            9,
        ),
        (
            stat(
                "Open zombie-leader alerts",
                "QUORUM_ZOMBIE_LEADER alerts firing and not yet resolved, per cluster: a node still "
                "acts as Raft quorum leader after a newer leader exists or without a voter majority "
                "fetching from it. Resolved when it steps down.",
                [
                    target(
                        "sum by (cluster) "
                        f'(fencewatch_open_alerts{{{CLUSTER}, rule="QUORUM_ZOMBIE_LEADER"}})',
                        "{{cluster}}",
                        instant=True,
                    )
                ],
            ),
            24,
            4,
        ),
    ]


# FencewatchClockSkew's limit (dashboards/prometheus/rules/fencewatch.rules.yml), in seconds.
CLOCK_SKEW_LIMIT = 2


def cluster_row() -> list[tuple[dict[str, Any], int, int]]:
    def per_cluster(metric: str) -> str:
        return f"sum by (cluster) ({metric}{{{CLUSTER}}})"

    def clock_bound(agg: str, bound: str) -> str:
        return f'{agg} by (cluster, node) (fencewatch_clock_offset_seconds{{{CLUSTER}, bound="{bound}"}})'

    return [
        (
            timeseries(
                "Brokers by state",
                "Brokers per state in the replayed metadata log. fenced and controlled_shutdown are "
                "subsets of registered.",
                [
                    target(
                        f"sum by (cluster, state) (fencewatch_brokers{{{CLUSTER}}})",
                        "{{cluster}} {{state}}",
                    )
                ],
            ),
            12,
            8,
        ),
        (
            timeseries(
                "Detector state size",
                "Partitions, live topics and brokers in the detector's view, and request outcomes "
                "waiting for their grace window before they are judged.",
                targets(
                    (per_cluster("fencewatch_tracked_partitions"), "{{cluster}} partitions"),
                    (per_cluster("fencewatch_tracked_topics"), "{{cluster}} topics"),
                    (per_cluster("fencewatch_tracked_brokers"), "{{cluster}} brokers"),
                    (per_cluster("fencewatch_pending_judgments"), "{{cluster}} pending judgments"),
                ),
            ),
            12,
            8,
        ),
        (
            timeseries(
                "Clock offsets vs the metadata log",
                "Each node's clock minus the metadata log's (the active controller's): the interval, low "
                "to high, that fencewatch measured from causal evidence in Kafka's logs "
                "(fencewatch_clock_offset_seconds). fencewatch corrects its verdicts by it. A node "
                "without evidence yet is not shown: its 0 is an assumption, not a measurement. Alert "
                f"FencewatchClockSkew fires when a node's whole interval lies beyond ±{CLOCK_SKEW_LIMIT} s "
                "(the dashed lines) for 5 minutes: check NTP/chrony on that node.",
                targets(
                    (clock_bound("max", "low"), "{{cluster}} node {{node}} low"),
                    (clock_bound("min", "high"), "{{cluster}} node {{node}} high"),
                ),
                unit="s",
                min_zero=False,
                steps=((None, "red"), (-CLOCK_SKEW_LIMIT, "green"), (CLOCK_SKEW_LIMIT, "red")),
            ),
            24,
            8,
        ),
    ]


def input_row() -> list[tuple[dict[str, Any], int, int]]:
    def rate_by(metric: str, by: str) -> str:
        return f"sum by ({by}) (rate({metric}{{{CLUSTER}}}{RATE}))"

    return [
        (
            timeseries(
                "Events judged by kind and API",
                "Events per second the detector judged, by envelope kind and, for request-log "
                "events, Kafka API.",
                [target(rate_by("fencewatch_events_total", "kind, api"), "{{kind}} {{api}}")],
                unit="suffix: ev/s",
                stack=True,
            ),
            12,
            8,
        ),
        (
            timeseries(
                "Dead letters by reason",
                "Records sent to the dead-letter topic per second, by reason class. They were never "
                "checked; the dead-letter topic holds each one with its full reason and position.",
                [target(rate_by("fencewatch_dead_letters_total", "reason"), "{{reason}}")],
                unit="suffix: rec/s",
                stack=True,
            ),
            12,
            8,
        ),
        (
            timeseries(
                "Unverified events by reason",
                "Events per second that could not be checked because the view lacked their "
                "partition, topic, broker or segment (a dump that started late). Never alerted.",
                [target(rate_by("fencewatch_unverified_events_total", "reason"), "{{reason}}")],
                unit="suffix: ev/s",
                stack=True,
            ),
            12,
            8,
        ),
        (
            timeseries(
                "Late events and duplicate records",
                "Events that arrived later than the lateness allowance (raise --lateness-ms if this "
                "is steady), and metadata records seen again and skipped.",
                targets(
                    (rate_by("fencewatch_late_events_total", "cluster"), "{{cluster}} late"),
                    (rate_by("fencewatch_duplicate_records_total", "cluster"), "{{cluster}} duplicates"),
                ),
                unit="suffix: ev/s",
            ),
            12,
            8,
        ),
        (
            timeseries(
                "Event time behind wall clock",
                "Now minus the event time (ts_ms) of the newest event processed, per cluster: how old "
                "the newest fact the detector knows is. Simulated clusters run on simulated time.",
                [
                    target(
                        f"time() - max by (cluster) (fencewatch_newest_event_timestamp_seconds{{{CLUSTER}}})",
                        "{{cluster}}",
                    )
                ],
                unit="s",
                min_zero=False,
            ),
            24,
            7,
        ),
    ]


def job_row() -> list[tuple[dict[str, Any], int, int]]:
    lag_note = "of the jobs that export the selected clusters, per event topic."
    running = [
        {"options": {"0": {"color": "red", "index": 0, "text": "stopped"}}, "type": "value"},
        {"options": {"1": {"color": "green", "index": 1, "text": "running"}}, "type": "value"},
    ]
    return [
        (
            stat(
                "Streaming query",
                "Whether each job's Spark streaming query runs (fencewatch_query_running).",
                [target(f"min({scoped('fencewatch_query_running')})", "query", instant=True)],
                mappings=running,
                steps=((None, "red"), (1, "green")),
                text_mode="value",
            ),
            6,
            4,
        ),
        (
            stat(
                "Since last micro-batch",
                "Seconds since the newest micro-batch completed or the query last reported itself idle. "
                "Alert FencewatchNoBatchCompleted fires past 10 minutes.",
                [
                    target(
                        f"time() - max({scoped('fencewatch_last_batch_timestamp_seconds')})",
                        "since last batch",
                        instant=True,
                    )
                ],
                unit="s",
                steps=((None, "green"), (60, "orange"), (300, "red")),
                text_mode="value",
            ),
            6,
            4,
        ),
        (
            stat(
                "Query failures in range",
                "Streaming query terminations with an error during the time range.",
                [
                    target(
                        f"sum({scoped(f'increase(fencewatch_query_failures_total{RANGE})')})",
                        "failures",
                        instant=True,
                    )
                ],
                text_mode="value",
            ),
            6,
            4,
        ),
        (
            stat(
                "Version",
                "fencewatch version of each job (fencewatch_build_info).",
                [
                    target(
                        f"count by (version) ({scoped('fencewatch_build_info')})", "{{version}}", instant=True
                    )
                ],
                steps=((None, "blue"),),
                text_mode="name",
            ),
            6,
            4,
        ),
        (
            timeseries(
                "Source lag (records)",
                "Records in the event topic not processed yet, " + lag_note,
                [target(f"max by (topic) ({scoped('fencewatch_source_lag_events')})", "{{topic}}")],
            ),
            12,
            8,
        ),
        (
            timeseries(
                "Source lag (seconds)",
                "How long the oldest unprocessed record has been waiting (0 when caught up), " + lag_note,
                [target(f"max by (topic) ({scoped('fencewatch_source_lag_seconds')})", "{{topic}}")],
                unit="s",
            ),
            12,
            8,
        ),
        (
            timeseries(
                "Micro-batch duration",
                "Wall time of the micro-batches: quantiles estimated from the histogram "
                "fencewatch_batch_duration_seconds, and the mean.",
                targets(
                    (
                        "histogram_quantile(0.5, sum by (le) "
                        f"({scoped(f'rate(fencewatch_batch_duration_seconds_bucket{RATE})')}))",
                        "p50",
                    ),
                    (
                        "histogram_quantile(0.99, sum by (le) "
                        f"({scoped(f'rate(fencewatch_batch_duration_seconds_bucket{RATE})')}))",
                        "p99",
                    ),
                    (
                        f"sum({scoped(f'rate(fencewatch_batch_duration_seconds_sum{RATE})')}) / "
                        f"sum({scoped(f'rate(fencewatch_batch_duration_seconds_count{RATE})')})",
                        "mean",
                    ),
                ),
                unit="s",
            ),
            12,
            8,
        ),
        (
            timeseries(
                "Input vs processing rate",
                "Spark's arrival and processing rates over the newest micro-batch, and records read "
                "from the event topic per second. Processing below input for long means lag grows.",
                targets(
                    (f"sum({scoped('fencewatch_input_events_per_second')})", "input (Spark)"),
                    (f"sum({scoped('fencewatch_processed_events_per_second')})", "processed (Spark)"),
                    (
                        f"sum by (topic) ({scoped(f'rate(fencewatch_source_events_total{RATE})')})",
                        "read from {{topic}}",
                    ),
                ),
                unit="suffix: rec/s",
            ),
            12,
            8,
        ),
        (
            timeseries(
                "Records delivered to sinks",
                "Alerts and dead letters written to their topics per second (first deliveries only: "
                "records re-sent after a restart are skipped).",
                [
                    target(
                        f"sum by (sink) ({scoped(f'rate(fencewatch_sink_records_total{RATE})')})",
                        "{{sink}}",
                    )
                ],
                unit="suffix: rec/s",
            ),
            24,
            7,
        ),
    ]


def webhook_row() -> list[tuple[dict[str, Any], int, int]]:
    def rate_by(metric: str, by: str) -> str:
        return f"sum by ({by}) ({scoped(f'rate({metric}{RATE})')})"

    def max_by(metric: str) -> str:
        return f"max by (endpoint) ({scoped(metric)})"

    return [
        (
            timeseries(
                "Webhook deliveries",
                "Alerts delivered per second, per endpoint of the job's webhooks config.",
                [target(rate_by("fencewatch_webhook_deliveries_total", "endpoint"), "{{endpoint}}")],
                unit="suffix: /s",
            ),
            8,
            8,
        ),
        (
            timeseries(
                "Failed delivery attempts",
                "Failed attempts per second by endpoint and reason (timeout, connection, http_3xx, "
                "http_4xx, http_5xx). Failed alerts stay in the outbox: retried with backoff, or parked "
                "(see Parked alerts).",
                [
                    target(
                        rate_by("fencewatch_webhook_failures_total", "endpoint, reason"),
                        "{{endpoint}} {{reason}}",
                    )
                ],
                unit="suffix: /s",
            ),
            8,
            8,
        ),
        (
            timeseries(
                "Rate-limited deliveries",
                "Deliveries held back by an endpoint's rate limit (rate_per_second, burst), per second.",
                [target(rate_by("fencewatch_webhook_rate_limited_total", "endpoint"), "{{endpoint}}")],
                unit="suffix: /s",
            ),
            8,
            8,
        ),
        (
            timeseries(
                "Parked alerts",
                "Alerts each endpoint's delivery gave up on, kept in the outbox with their last answer "
                "until an operator resends them: list them with `fencewatch webhooks parked --outbox "
                "FILE`, resend with `fencewatch webhooks resend`. Anything above 0 needs a look.",
                [target(max_by("fencewatch_webhook_parked"), "{{endpoint}}")],
            ),
            12,
            8,
        ),
        (
            timeseries(
                "Parkings by reason",
                "Alerts parked per second, by endpoint and reason: rejected (a 4xx), redirect (a 3xx), "
                "unrenderable, retries_exhausted (max_attempts failures of its own), max_age.",
                [
                    target(
                        rate_by("fencewatch_webhook_parkings_total", "endpoint, reason"),
                        "{{endpoint}} {{reason}}",
                    )
                ],
                unit="suffix: /s",
            ),
            12,
            8,
        ),
        (
            timeseries(
                "Outbox backlog",
                "Alerts waiting in the durable outbox for each endpoint.",
                [target(max_by("fencewatch_webhook_backlog"), "{{endpoint}}")],
            ),
            12,
            8,
        ),
        (
            timeseries(
                "Oldest pending alert",
                "Age of the oldest alert waiting for each endpoint (0 when none waits). Past the "
                "endpoint's max_age_seconds an alert is parked.",
                [target(max_by("fencewatch_webhook_oldest_pending_seconds"), "{{endpoint}}")],
                unit="s",
            ),
            12,
            8,
        ),
    ]


def probe_row() -> list[tuple[dict[str, Any], int, int]]:
    deviations = f"fencewatch_probe_deviations_total{{{CLUSTER}}}"
    last_success = f"fencewatch_probe_last_success_timestamp_seconds{{{CLUSTER}}}"
    return [
        (
            timeseries(
                "Probe deviations",
                "Deviations from Apache Kafka's fencing answers that fencewatch probe (or run "
                "--probe-interval) confirmed, by rule (docs/rules.md, Probe rules): a broker served a read "
                "at a stale or future currentLeaderEpoch, as a follower, or of a partition that does not "
                "exist, or answered another fencing error. Anything above 0 needs a look.",
                [
                    target(
                        f"sum by (cluster, rule) (increase({deviations}{RATE}))",
                        "{{cluster}} {{rule}}",
                    )
                ],
                bars=True,
            ),
            8,
            8,
        ),
        (
            timeseries(
                "Probe requests by outcome",
                "Probe requests per second by API and outcome: conforming, deviating, other_error (an "
                "answer that is no fencing answer), failed (no answer), unsupported (an API the broker "
                "does not take with currentLeaderEpoch, never sent).",
                [
                    target(
                        f"sum by (api, outcome) (rate(fencewatch_probe_requests_total{{{CLUSTER}}}{RATE}))",
                        "{{api}} {{outcome}}",
                    )
                ],
                unit="suffix: /s",
            ),
            8,
            8,
        ),
        (
            timeseries(
                "Since the last complete probe round",
                "Seconds since a probe round last got an answer to every request. It grows while brokers "
                "time out or refuse the probe; FencewatchProbeFailing fires past 15 minutes.",
                [
                    target(
                        f"time() - max by (cluster) ({last_success})",
                        "{{cluster}}",
                    )
                ],
                unit="s",
            ),
            8,
            8,
        ),
    ]


def overview() -> dict[str, Any]:
    panels = layout(
        [
            (row("Violations"), violations_row()),
            (row("Cluster view"), cluster_row()),
            (row("Input"), input_row()),
            (row("Streaming job"), job_row()),
            (row("Webhook delivery"), webhook_row()),
            (row("Fencing probe"), probe_row()),
        ]
    )
    return {
        "annotations": {
            "list": [
                {
                    "builtIn": 1,
                    "datasource": {"type": "grafana", "uid": "-- Grafana --"},
                    "enable": True,
                    "hide": True,
                    "iconColor": "rgba(0, 211, 255, 1)",
                    "name": "Annotations & Alerts",
                    "type": "dashboard",
                },
                {
                    "datasource": DS,
                    "enable": True,
                    "expr": 'ALERTS{alertname="FencewatchCriticalViolation", alertstate="firing", '
                    f"{CLUSTER}}}",
                    "iconColor": "red",
                    "name": "Critical violations",
                    "step": "60s",
                    "tagKeys": "cluster,rule",
                    "textFormat": "{{rule}} on {{cluster}}",
                    "titleFormat": "Critical violation",
                    "useValueForTime": False,
                },
            ]
        },
        "description": "fencewatch: fencing violations, detector state, streaming job health and webhook "
        "delivery. Generated by dashboards/build_dashboards.py.",
        "editable": True,
        "fiscalYearStartMonth": 0,
        "graphTooltip": 1,
        "links": [],
        "liveNow": False,
        "panels": panels,
        "refresh": "30s",
        "schemaVersion": 39,
        "tags": ["fencewatch", "kafka"],
        "templating": {
            "list": [
                {
                    "current": {},
                    "hide": 0,
                    "includeAll": False,
                    "label": "Data source",
                    "multi": False,
                    "name": "datasource",
                    "options": [],
                    "query": "prometheus",
                    "refresh": 1,
                    "regex": "",
                    "skipUrlSync": False,
                    "type": "datasource",
                },
                {
                    "allValue": ".*",
                    "current": {"selected": True, "text": ["All"], "value": ["$__all"]},
                    "datasource": DS,
                    "definition": "label_values(fencewatch_events_total, cluster)",
                    "hide": 0,
                    "includeAll": True,
                    "label": "Cluster",
                    "multi": True,
                    "name": "cluster",
                    "options": [],
                    "query": {
                        "qryType": 1,
                        "query": "label_values(fencewatch_events_total, cluster)",
                        "refId": "PrometheusVariableQueryEditor-VariableQuery",
                    },
                    "refresh": 2,
                    "regex": "",
                    "skipUrlSync": False,
                    "sort": 1,
                    "type": "query",
                },
            ]
        },
        "time": {"from": "now-6h", "to": "now"},
        "timepicker": {},
        "timezone": "",
        "title": "fencewatch overview",
        "uid": "fencewatch-overview",
        "version": 1,
        "weekStart": "",
    }


DASHBOARDS = {"fencewatch-overview.json": overview}


def render(dashboard: dict[str, Any]) -> str:
    return json.dumps(dashboard, indent=2, sort_keys=True) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if a dashboard on disk is stale")
    args = parser.parse_args(argv)
    stale = []
    for name, build in DASHBOARDS.items():
        path = GRAFANA_DIR / name
        text = render(build())
        if args.check:
            if not path.exists() or path.read_text(encoding="utf-8") != text:
                stale.append(path)
        else:
            path.write_text(text, encoding="utf-8")
            print(f"wrote {path}")
    for path in stale:
        print(f"{path} is stale: run python dashboards/build_dashboards.py", file=sys.stderr)
    return 1 if stale else 0


if __name__ == "__main__":
    raise SystemExit(main())
