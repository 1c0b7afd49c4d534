"""A probe round as people and Prometheus read it: the conformance table (one row per
broker and API, one column per kind of probe) and the fencewatch_probe_* metrics."""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING, Protocol

from detectors.errors import error_name
from detectors.probe_rules import EXPECTED, PROBE_RULES, Asked, Kind, Verdict, judge
from probe.round import FAILED, UNSUPPORTED, RoundReport

if TYPE_CHECKING:
    from prometheus_client import Counter as CounterMetric
    from prometheus_client import Gauge

COLUMNS = tuple(Kind)


class ProbeMetrics(Protocol):
    """The fencewatch_probe_* series a round is counted in; streaming.metrics.Metrics
    has them, and the command passes it in (the probe does not import the job)."""

    probe_requests: CounterMetric
    probe_deviations: CounterMetric
    probe_last_success: Gauge


def _key(a: Asked) -> tuple[int, str, Kind, str, int]:
    return (a.node, a.api, a.kind, a.topic, a.partition)


def _cell(asked: list[Asked], confirmed: set[tuple[int, str, Kind, str, int]]) -> str:
    """``ok`` when every partition got Kafka's answer; else each other answer with how
    many partitions got it, marked ``!`` where the deviation was confirmed."""
    if not asked:
        return "-"
    wrong: Counter[str] = Counter()
    for a in asked:
        verdict, _ = judge(a.kind, a.answer)
        if verdict is not Verdict.CONFORMING:
            mark = "!" if _key(a) in confirmed else ""
            wrong[f"{a.answer_name}{mark}"] += 1
    if not wrong:
        return f"ok {len(asked)}"
    return ", ".join(f"{name} {n}/{len(asked)}" for name, n in sorted(wrong.items()))


def table(report: RoundReport) -> str:
    """The conformance table of ``report``, with a header line and a legend."""
    confirmed = {_key(a) for a in report.confirmed}
    rows: dict[tuple[int, str], dict[Kind, list[Asked]]] = {}
    for a in report.asked:
        rows.setdefault((a.node, a.api), {}).setdefault(a.kind, []).append(a)
    versions = {(a.node, a.api): a.version for a in report.asked}
    notes: dict[tuple[int, str], str] = {}
    for sent in report.requests:
        if sent.outcome in (FAILED, UNSUPPORTED) and not sent.confirmation:
            notes.setdefault((sent.node, sent.api), f"{sent.outcome}: {sent.reason}")
            rows.setdefault((sent.node, sent.api), {})
    header = ["broker", "api", "version", *(k.value for k in COLUMNS)]
    lines = [header]
    for (node, api), kinds in sorted(rows.items()):
        version = versions.get((node, api))
        cells = [str(node), api, f"v{version}" if version is not None else "-"]
        cells += [_cell(kinds.get(k, []), confirmed) for k in COLUMNS]
        if (node, api) in notes and not kinds:
            cells[3:] = [notes[(node, api)]]
        lines.append(cells)
    widths = [max(len(r[i]) for r in lines if i < len(r)) for i in range(len(header))]
    text = [
        f"cluster {report.cluster}: {report.partitions_probed} of {report.partitions_total} partitions, "
        f"{sum(1 for s in report.requests if s.outcome != UNSUPPORTED)} requests in "
        f"{report.elapsed_seconds:.2f} s"
    ]
    text += ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=False)).rstrip() for r in lines]
    for (node, api), note in sorted(notes.items()):
        if rows.get((node, api)):
            text.append(f"broker {node} {api}: {note}")
    expected = ", ".join(f"{k.value} {error_name(code)}" for k, code in EXPECTED.items())
    text.append(f"Kafka answers: {expected}; '!' a confirmed deviation")
    counts = report.rule_counts()
    if counts:
        text.append("deviations: " + ", ".join(f"{rule} {n}" for rule, n in sorted(counts.items())))
    else:
        text.append("deviations: none")
    if report.superseded:
        text.append(f"not deviations: {len(report.superseded)} answers an election in between explains")
    if report.unconfirmed:
        text.append(f"not confirmed: {len(report.unconfirmed)} answers the second asking did not repeat")
    return "\n".join(text)


def record(metrics: ProbeMetrics, report: RoundReport, now_seconds: float) -> None:
    """Count the round's requests and confirmed deviations; stamp a complete round."""
    cluster = report.cluster
    for rule in PROBE_RULES:
        # Every rule's series exists from the first round at 0, so increase() sees the first one.
        metrics.probe_deviations.labels(cluster=cluster, rule=rule)
    for sent in report.requests:
        metrics.probe_requests.labels(cluster=cluster, api=sent.api, outcome=sent.outcome).inc()
    for rule, n in report.rule_counts().items():
        metrics.probe_deviations.labels(cluster=cluster, rule=rule).inc(n)
    if report.complete:
        metrics.probe_last_success.labels(cluster=cluster).set(now_seconds)
