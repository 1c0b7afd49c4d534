"""The incident report: alerts and their timelines in, one self-contained HTML
page out (SPEC 4, ``fencewatch replay --report`` and ``fencewatch report``).

Pure: nothing here reads input or knows the detector. A :class:`Timeline` is
what one alert's chart shows (incidents.timelines gathers them); the
page is a summary per rule and severity, then, per rule, the first
``max_per_rule`` alerts each with its chart and evidence. plotly.js is inlined
once in the page's head, so the file opens offline and every chart reuses it.
"""

from __future__ import annotations

import html
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any
from urllib.parse import unquote_plus

import orjson
from plotly.offline import get_plotlyjs

from detectors.alerts import CERTAIN, FIRING, POSSIBLE, POSSIBLE_SEVERITY, RESOLVED, SEVERITIES
from detectors.render import alert_line, iso_utc

# A replay with thousands of alerts of one rule would make a page no browser
# opens quickly; the first ones of each rule show the pattern, the rest are counted.
DEFAULT_MAX_PER_RULE = 25

# What a lane's bar means: a broker's place in the partition, or its registration.
ROLE_COLOURS = {
    "leader": "#1f77b4",
    "in ISR": "#7fb8e6",
    "replica, out of ISR": "#d9d9d9",
    "quorum leader": "#1f77b4",
}
FENCING_COLOURS = {
    "fenced": "#d62728",
    "in controlled shutdown": "#ff9f40",
    "unregistered": "#7f7f7f",
}
LEGEND_DROP_PX = 40
# How an evidence or record mark is drawn: (symbol, colour, size).
MARK_STYLES = {
    "violation": ("x", "#d62728", 16),
    "view": ("diamond", "#2ca02c", 12),
    "record": ("circle", "#555555", 8),
}
MARK_NAMES = {"violation": "violation", "view": "view evidence", "record": "metadata record"}


@dataclass(frozen=True, slots=True)
class Span:
    """``lane`` was in ``state`` over ``[start_ms, end_ms)``. ``state`` is a key
    of ROLE_COLOURS (drawn as a wide bar) or FENCING_COLOURS (a thin bar on top)."""

    lane: str
    state: str
    start_ms: int
    end_ms: int
    text: str


@dataclass(frozen=True, slots=True)
class Mark:
    """One event on ``lane`` at ``ts_ms``; ``role`` is a key of MARK_STYLES:
    the alert's violation, its view evidence, or another record of the window."""

    lane: str
    ts_ms: int
    role: str
    text: str


@dataclass(frozen=True, slots=True)
class EpochStep:
    """From ``ts_ms`` on, the epoch was ``epoch`` (``text`` says what else held)."""

    ts_ms: int
    epoch: int
    text: str


@dataclass(frozen=True, slots=True)
class Timeline:
    """What one alert's chart shows, over ``[lo_ms, hi_ms]``. ``source`` tells the
    reader where the states come from (the detector's view, or the alert alone)."""

    subject: str
    lo_ms: int
    hi_ms: int
    grace_ms: int
    violation_ms: int
    source: str
    epoch_name: str = ""
    epochs: tuple[EpochStep, ...] = ()
    spans: tuple[Span, ...] = ()
    marks: tuple[Mark, ...] = ()
    lanes: tuple[str, ...] = ()  # top to bottom


@dataclass
class IncidentReport:
    """Alerts as they come, each with its timeline while its rule is under the cap.

    Only the drawn alerts are kept; the others are counted, so a replay with a
    million alerts needs no more memory than one with a few hundred."""

    title: str
    grace_ms: int
    max_per_rule: int = DEFAULT_MAX_PER_RULE
    counts: Counter[tuple[str, str, str]] = field(default_factory=Counter)  # (rule, severity, status)
    # Possible violations per rule (detectors.alerts.POSSIBLE), also counted in ``counts``
    # under their own severity.
    possible: Counter[str] = field(default_factory=Counter)
    drawn: dict[str, list[tuple[dict[str, Any], Timeline]]] = field(default_factory=dict)

    def add(self, alert: Mapping[str, Any], gather: Callable[[], Timeline]) -> None:
        """Count ``alert``; while its rule is under the cap, keep it with the
        timeline ``gather`` makes (called only then: gathering costs)."""
        rule = str(alert["rule"])
        if alert.get("confidence") == POSSIBLE:
            self.possible[rule] += 1
        self.counts[(rule, str(alert["severity"]), str(alert.get("status") or FIRING))] += 1
        drawn = self.drawn.setdefault(rule, [])
        if len(drawn) < self.max_per_rule:
            drawn.append((dict(alert), gather()))

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    def not_drawn(self, rule: str) -> int:
        counted = sum(n for (r, _, _), n in self.counts.items() if r == rule)
        return counted - len(self.drawn.get(rule, ()))

    def html(self) -> str:
        return render(self)


# ---- the page ---------------------------------------------------------------------


def render(report: IncidentReport) -> str:
    """The whole page as one string."""
    rules = sorted({rule for rule, _, _ in report.counts}, key=lambda r: (_worst(report, r), r))
    body = [
        f"<h1>{_e(report.title)}</h1>",
        f'<p class="lede">{report.total} alerts of {len(rules)} rules. Each timeline below shows the '
        f"states the detector judged against (grace window: {report.grace_ms} ms either side of the "
        "violation, shaded) and the evidence the alert carries. Times are UTC.</p>",
        _summary_table(report, rules),
    ]
    number = 0
    for rule in rules:
        body.append(f'<h2 id="rule-{_e(rule)}">{_e(rule)}</h2>')
        for alert, timeline in report.drawn.get(rule, ()):
            number += 1
            body.append(_alert_section(number, alert, timeline))
        left_out = report.not_drawn(rule)
        if left_out:
            body.append(
                f'<p class="left-out" data-rule="{_e(rule)}">{left_out} more alerts of this rule are not '
                f"drawn (the first {report.max_per_rule} are); the alert JSON lines hold them all.</p>"
            )
    return _PAGE.format(
        title=_e(report.title),
        plotlyjs=get_plotlyjs(),
        style=_STYLE,
        body="\n".join(body),
        draw=_DRAW_WHEN_SEEN,
    )


def _worst(report: IncidentReport, rule: str) -> int:
    return min(_severity_rank(s) for r, s, _ in report.counts if r == rule)


def _summary_table(report: IncidentReport, rules: Sequence[str]) -> str:
    rows = []
    for rule in rules:
        for severity in sorted({s for r, s, _ in report.counts if r == rule}, key=_severity_rank):
            firing = report.counts[(rule, severity, FIRING)]
            resolved = report.counts[(rule, severity, RESOLVED)]
            # Possible violations are raised at their own severity (POSSIBLE_SEVERITY).
            possible = report.possible[rule] if severity == POSSIBLE_SEVERITY else 0
            rows.append(
                f'<tr data-rule="{_e(rule)}" data-severity="{_e(severity)}">'
                f'<td><a href="#rule-{_e(rule)}">{_e(rule)}</a></td>'
                f'<td class="sev {_e(severity)}">{_e(severity)}</td>'
                f'<td class="firing">{firing}</td><td class="possible">{possible}</td>'
                f'<td class="resolved">{resolved}</td></tr>'
            )
    drawn = sum(len(v) for v in report.drawn.values())
    return (
        '<table id="summary"><thead><tr><th>rule</th><th>severity</th><th>firing</th>'
        '<th title="of the firing: possible violations, which hold for some clock offsets the '
        'evidence allows, not all">possible</th><th>resolved</th>'
        f"</tr></thead><tbody>{''.join(rows)}</tbody></table>"
        f'<p class="drawn">{drawn} timelines drawn.</p>'
    )


def _severity_rank(severity: str) -> int:
    return SEVERITIES.index(severity) if severity in SEVERITIES else len(SEVERITIES)


def _alert_section(number: int, alert: Mapping[str, Any], timeline: Timeline) -> str:
    links = " ".join(f'<a href="{_e(url)}">{_e(_link_name(url))}</a>' for url in alert.get("links", ()))
    condition = alert.get("clock_condition") if alert.get("confidence") == POSSIBLE else None
    text = str(condition.get("text", "")) if isinstance(condition, Mapping) else None
    figure = _chart(timeline, f"chart-{number}", text)
    possible = (
        f'<p class="possible">Possible violation: it {_e(text)}. Not every offset the clock evidence '
        "allows makes it one; a bound on this node's clock (--clock-bound-ms) may decide it.</p>"
        if text is not None
        else ""
    )
    confidence = str(alert.get("confidence") or CERTAIN)
    return (
        f'<section class="alert-timeline" data-alert-id="{_e(str(alert["alert_id"]))}" '
        f'data-rule="{_e(str(alert["rule"]))}" data-confidence="{_e(confidence)}">'
        f'<h3 class="sev {_e(str(alert["severity"]))}">{_e(alert_line(alert))}</h3>'
        f'<p class="meta">{_e(timeline.subject)} · alert {_e(str(alert["alert_id"]))} · detected '
        f"{_e(iso_utc(int(alert['detected_ms'])))} · {_e(timeline.source)} · {links}</p>"
        f"{possible}{figure}{_evidence_table(alert.get('evidence', ()))}</section>"
    )


def _link_name(url: str) -> str:
    """``KIP-841`` for a KIP's wiki page, else the URL's last part."""
    return unquote_plus(url.rstrip("/").rsplit("/", 1)[-1]).split(":", 1)[0]


def _evidence_table(evidence: Iterable[Mapping[str, Any]]) -> str:
    rows = "".join(
        f'<tr class="{_e(str(e.get("role")))}"><td>{_e(str(e.get("role")))}</td>'
        f"<td>{_e(str(e.get('kind')))}</td>"
        f"<td>{_e(iso_utc(int(e['ts_ms'])))}</td><td>{_e(_or_dash(e.get('node')))}</td>"
        f"<td>{_e(_or_dash(e.get('offset')))}</td><td>{_e(str(e.get('position', '')))}</td>"
        f"<td>{_e(str(e.get('summary', '')))}</td></tr>"
        for e in evidence
    )
    return (
        '<table class="evidence"><thead><tr><th>role</th><th>kind</th><th>time</th><th>node</th>'
        f"<th>offset</th><th>read at</th><th>what it says</th></tr></thead><tbody>{rows}</tbody></table>"
    )


def _or_dash(value: object) -> str:
    return "-" if value is None else str(value)


def _e(text: str) -> str:
    return html.escape(text, quote=True)


# ---- one chart --------------------------------------------------------------------
#
# Charts are plotly.js figure specs (traces and layout as plain data) handed to
# Plotly.newPlot: building them through plotly.py's graph objects validated
# every property and cost ~70 ms a chart, 29 s for a report of 415 timelines.


def _chart(timeline: Timeline, div_id: str, possible: str | None = None) -> str:
    """The chart's div and its spec, which _DRAW_WHEN_SEEN hands to plotly.js;
    ``possible``: a possible violation's condition, written over the chart."""
    data, layout = _figure(timeline)
    if possible is not None:
        layout["annotations"].append(
            {
                "x": 1.0,
                "y": 1.0,
                "xref": "paper",
                "yref": "paper",
                "xanchor": "right",
                "yanchor": "bottom",
                "showarrow": False,
                "text": f"POSSIBLE: {possible}",
                "font": {"size": 11, "color": "#6a1b9a"},
            }
        )
    spec = _json({"data": data, "layout": layout, "config": {"displaylogo": False, "responsive": True}})
    return (
        f'<div id="{_e(div_id)}" class="timeline-chart" style="height:{layout["height"]}px"></div>'
        f'<script type="application/json" id="{_e(div_id)}-spec">{spec}</script>'
    )


def _json(value: object) -> str:
    # "<" only occurs inside JSON strings, where \u003c means the same; so no
    # text of an alert can close the <script> element.
    return orjson.dumps(value).decode().replace("<", "\\u003c")


def _axis_time(ts_ms: int) -> str:
    # plotly.js has no time zones: a date string without one is drawn as written, here UTC.
    return datetime.fromtimestamp(ts_ms / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]


def _figure(timeline: Timeline) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Top: the epoch as a step line. Bottom: one lane per broker/node/log with
    its role bars, fencing bars and the evidence marks. The grace window around
    the violation is shaded across both. Without epochs (a timeline from
    evidence alone) only the lanes: an empty epoch axis would have no range."""
    lanes = {lane: len(timeline.lanes) - i for i, lane in enumerate(timeline.lanes)}
    two_rows = bool(timeline.epochs)
    lane_axes = {"xaxis": "x2", "yaxis": "y2"} if two_rows else {"xaxis": "x", "yaxis": "y"}
    data: list[dict[str, Any]] = []
    if timeline.epochs:
        steps = sorted(timeline.epochs, key=lambda s: s.ts_ms)
        data.append(
            {
                "type": "scatter",
                "x": [_axis_time(s.ts_ms) for s in steps] + [_axis_time(timeline.hi_ms)],
                "y": [s.epoch for s in steps] + [steps[-1].epoch],
                "hovertext": [s.text for s in steps] + [steps[-1].text],
                "hoverinfo": "x+text",
                "mode": "lines+markers",
                "line": {"shape": "hv", "color": "#444"},
                "name": timeline.epoch_name,
                "xaxis": "x",
                "yaxis": "y",
            }
        )
    for states, width in ((ROLE_COLOURS, 14), (FENCING_COLOURS, 5)):
        for state, colour in states.items():
            spans = [s for s in timeline.spans if s.state == state and s.lane in lanes]
            if spans:
                data.append({**_span_trace(spans, lanes, state, colour, width), **lane_axes})
    for role, (symbol, colour, size) in MARK_STYLES.items():
        marks = [m for m in timeline.marks if m.role == role and m.lane in lanes]
        if marks:
            data.append(
                {
                    "type": "scatter",
                    "x": [_axis_time(m.ts_ms) for m in marks],
                    "y": [lanes[m.lane] for m in marks],
                    "hovertext": [m.text for m in marks],
                    "hoverinfo": "x+text",
                    "mode": "markers",
                    "marker": {"symbol": symbol, "color": colour, "size": size, "line": {"width": 1}},
                    "name": MARK_NAMES[role],
                    **lane_axes,
                }
            )
    return data, _layout(timeline, lanes, two_rows)


def _layout(timeline: Timeline, lanes: Mapping[str, int], two_rows: bool) -> dict[str, Any]:
    height = (200 if two_rows else 120) + 34 * max(len(lanes), 1)
    top, bottom = 28, 40
    x_range = [_axis_time(timeline.lo_ms), _axis_time(timeline.hi_ms)]
    lane_axis = {
        "tickvals": list(lanes.values()),
        "ticktext": list(lanes),
        "range": [0.4, len(lanes) + 0.6],
        "gridcolor": "#eeeeee",
        "zeroline": False,
    }
    grace_lo = _axis_time(timeline.violation_ms - timeline.grace_ms)
    grace_hi = _axis_time(timeline.violation_ms + timeline.grace_ms)
    x_ref = "x2" if two_rows else "x"
    layout: dict[str, Any] = {
        "height": height,
        "margin": {"l": 150, "r": 20, "t": top, "b": bottom},
        "plot_bgcolor": "#fbfbfb",
        "hovermode": "closest",
        "font": {"family": "system-ui, sans-serif", "size": 12},
        # below the time axis' two lines of labels, whatever the chart's height
        "legend": {
            "orientation": "h",
            "x": 0,
            "y": -LEGEND_DROP_PX / (height - top - bottom),
            "yanchor": "top",
        },
        "shapes": [
            {
                "type": "rect",
                "xref": x_ref,
                "yref": "paper",
                "x0": grace_lo,
                "x1": grace_hi,
                "y0": 0,
                "y1": 1,
                "fillcolor": "#ffd54f",
                "opacity": 0.25,
                "line": {"width": 0},
                "layer": "below",
            },
            {
                "type": "line",
                "xref": x_ref,
                "yref": "paper",
                "x0": _axis_time(timeline.violation_ms),
                "x1": _axis_time(timeline.violation_ms),
                "y0": 0,
                "y1": 1,
                "line": {"color": "#d62728", "dash": "dot"},
            },
        ],
        "annotations": [
            {
                "x": grace_lo,
                "y": 1.0,
                "xref": x_ref,
                "yref": "paper",
                "xanchor": "left",
                "yanchor": "bottom",
                "showarrow": False,
                "text": f"grace window ±{timeline.grace_ms} ms",
                "font": {"size": 11, "color": "#8a6d00"},
            }
        ],
    }
    if two_rows:
        layout["xaxis"] = {
            "type": "date",
            "range": x_range,
            "matches": "x2",
            "showticklabels": False,
            "gridcolor": "#e5e5e5",
            "anchor": "y",
        }
        layout["yaxis"] = {
            "domain": [0.72, 1.0],
            "title": {"text": timeline.epoch_name},
            "dtick": 1,
            "gridcolor": "#e5e5e5",
            "anchor": "x",
        }
        layout["xaxis2"] = {"type": "date", "range": x_range, "gridcolor": "#e5e5e5", "anchor": "y2"}
        layout["yaxis2"] = {"domain": [0.0, 0.66], "anchor": "x2", **lane_axis}
    else:
        layout["xaxis"] = {"type": "date", "range": x_range, "gridcolor": "#e5e5e5", "anchor": "y"}
        layout["yaxis"] = {"anchor": "x", **lane_axis}
    return layout


def _span_trace(
    spans: Sequence[Span], lanes: Mapping[str, int], state: str, colour: str, width: int
) -> dict[str, Any]:
    xs: list[str | None] = []
    ys: list[int | None] = []
    texts: list[str | None] = []
    for s in spans:
        # None between spans breaks the line, so one trace draws them all.
        xs += [_axis_time(s.start_ms), _axis_time(s.end_ms), None]
        ys += [lanes[s.lane], lanes[s.lane], None]
        texts += [s.text, s.text, None]
    return {
        "type": "scatter",
        "x": xs,
        "y": ys,
        "hovertext": texts,
        "hoverinfo": "text",
        "mode": "lines",
        "name": state,
        "line": {"color": colour, "width": width},
    }


_STYLE = """
body { font-family: system-ui, sans-serif; margin: 1.5em auto; max-width: 1200px; color: #222; }
h1 { margin-bottom: 0.2em; } .lede { color: #555; }
table { border-collapse: collapse; margin: 0.6em 0; font-size: 13px; }
th, td { border: 1px solid #ddd; padding: 3px 8px; text-align: left; vertical-align: top; }
#summary td.firing, #summary td.resolved { text-align: right; }
.sev.critical { color: #b71c1c; } .sev.warning { color: #a15c00; } .sev.info { color: #1a5e9a; }
.possible { color: #6a1b9a; } section[data-confidence="possible"] h3 { font-style: italic; }
section.alert-timeline { border-top: 1px solid #ccc; padding-top: 0.6em; margin-top: 1.2em; }
section.alert-timeline h3 { font-size: 15px; margin: 0.2em 0; }
.meta { color: #666; font-size: 12px; margin: 0.2em 0; }
table.evidence tr.violation td { background: #fdecea; }
table.evidence tr.view td { background: #edf7ed; }
.left-out { font-style: italic; color: #555; }
"""

# Each chart is drawn when it comes within a screen of the viewport: drawing
# all 415 charts of a large report at load took 42 s in headless Chromium here.
_DRAW_WHEN_SEEN = """
(function () {
  function draw(div) {
    if (div.dataset.drawn) return;
    div.dataset.drawn = "1";
    var spec = JSON.parse(document.getElementById(div.id + "-spec").textContent);
    Plotly.newPlot(div, spec.data, spec.layout, spec.config);
  }
  var charts = document.querySelectorAll(".timeline-chart");
  if (!("IntersectionObserver" in window)) { charts.forEach(draw); return; }
  var near = new IntersectionObserver(function (entries) {
    entries.forEach(function (e) { if (e.isIntersecting) { near.unobserve(e.target); draw(e.target); } });
  }, { rootMargin: "100% 0px" });
  charts.forEach(function (c) { near.observe(c); });
})();
"""

_PAGE = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<title>{title}</title>
<style>{style}</style>
<script type="text/javascript">{plotlyjs}</script>
</head><body>
{body}
<script>{draw}</script>
</body></html>
"""
