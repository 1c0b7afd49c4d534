"""Human-readable summaries on stderr."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TextIO

from detectors.alerts import FIRING, POSSIBLE, RESOLVED
from detectors.clocks import ClockInterval, MetadataClock
from detectors.cluster import Counters
from detectors.render import tally
from detectors.sources import EnvelopeLineStats
from detectors.stats import explain_unverified


def _table(title: str, rows: Sequence[Sequence[str]], out: TextIO) -> None:
    if not rows:
        return
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    print(title, file=out)
    for row in rows:
        print(
            "  "
            + "  ".join(
                c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths, strict=True))
            ),
            file=out,
        )


def _by_status(
    columns: Sequence[str], violations: Mapping[str, Sequence[int]], resolutions: Mapping[str, Sequence[int]]
) -> list[tuple[str, ...]]:
    """Rows per rule, violations and then resolutions (timer alerts that ended)
    as sections of their own, each with its total: a resolution is never
    counted as a violation."""
    rows: list[tuple[str, ...]] = []
    for title, table in (("violations", violations), ("resolutions", resolutions)):
        rows.append((title, *columns))
        rows += [(rule, *map(str, counts)) for rule, counts in table.items()]
        totals = [sum(counts[i] for counts in table.values()) for i in range(len(columns))]
        rows.append((f"total {title}", *map(str, totals)))
    return rows


def print_summary(counters: Counters, dead_letters: int, out: TextIO) -> None:
    _table("events", [(k, str(v)) for k, v in sorted(counters.events.items())], out)
    unverified = sorted(counters.unverified.items())
    _table(
        "not judged",
        [
            ("dead letters", str(dead_letters)),
            ("duplicates", str(counters.duplicates)),
            ("late (beyond lateness)", str(counters.late)),
        ]
        + [(f"dead letters: {k}", str(v)) for k, v in sorted(counters.dead_letters.items())]
        + [(f"unverified: {k}", str(v)) for k, v in unverified],
        out,
    )
    if unverified:
        print("why unverified, and what to ship to avoid it", file=out)
        for key, _ in unverified:
            print(f"  {key}: {explain_unverified(key)}", file=out)
    violations = counters.alerts_by_rule(FIRING)
    resolutions = counters.alerts_by_rule(RESOLVED)
    _table(
        f"alerts: {tally(sum(violations.values()), sum(resolutions.values()))}",
        _by_status(
            ("count",),
            {rule: (n,) for rule, n in sorted(violations.items())},
            {rule: (n,) for rule, n in sorted(resolutions.items())},
        ),
        out,
    )
    possible = counters.alerts_by_rule(FIRING, POSSIBLE)
    if possible:
        _table(
            f"possible violations: {sum(possible.values())} (each holds for some clock offsets its node's "
            "evidence allows, not all: severity info, the condition in its message; --clock-bound-ms "
            "narrows the offsets)",
            [(rule, str(n)) for rule, n in sorted(possible.items())],
            out,
        )


def print_bound_contradictions(clusters: Mapping[str, Mapping[int, Sequence[float]]], out: TextIO) -> None:
    """One line per node whose clock evidence contradicts the bound given for it
    (``--clock-bound-ms``; ClusterState.node_interval): the bound is not used."""
    for cluster, nodes in sorted(clusters.items()):
        for node, (low, high, bound) in sorted(nodes.items()):
            measured = ClockInterval(low, high, measured=True).describe(node)
            print(
                f"CLOCK BOUND CONTRADICTED on {cluster}: {measured} by its evidence, outside the "
                f"--clock-bound-ms {int(bound)} given for it: the bound is wrong or the clock broke; "
                "verdicts use the evidence",
                file=out,
            )


def print_confusion(table: dict[tuple[str, str], dict[str, int]], out: TextIO) -> bool:
    """Print injected-versus-detected per rule, violations and resolutions apart
    (detectors.truth.confusion); True when they agree exactly."""
    counts = {key: (c["tp"], c["fp"], c["fn"]) for key, c in table.items()}
    _table(
        "ground truth (tp: injected and detected, fp: false alarm, fn: missed)",
        _by_status(
            ("tp", "fp", "fn"),
            # A status neither firing nor resolved (a hand-made truth file) stays visible, apart.
            {
                rule if status == FIRING else f"{rule} ({status})": n
                for (rule, status), n in counts.items()
                if status != RESOLVED
            },
            {rule: n for (rule, status), n in counts.items() if status == RESOLVED},
        ),
        out,
    )
    return all(c["fp"] == 0 and c["fn"] == 0 for c in table.values())


def replay_line_accounting(
    prog: str, files: int, lines: EnvelopeLineStats, duplicates: int, too_late: int, judged_dead: int
) -> str:
    """One line: what became of every line replay read, in counts that add up
    to the total. Of the envelopes, those neither duplicates, nor too late to
    judge (their grace window had closed), nor refused by the detector
    (``judged_dead``) were processed by the rules (the ones a rule could not
    verify among them: the summary's "not judged" table counts those)."""
    processed = lines.envelopes - duplicates - too_late - judged_dead
    return (
        f"{prog}: {files} file(s), {lines.lines} lines: {processed} envelopes processed, "
        f"{duplicates} duplicates, {too_late} too late to judge, "
        f"{lines.dead_letters + judged_dead} dead letters, {lines.blank_lines} blank lines"
    )


def print_clocks(
    clusters: Mapping[str, tuple[Mapping[int, ClockInterval], MetadataClock]],
    grace_ms: int,
    limit_ms: int,
    out: TextIO,
) -> None:
    """Each node's measured clock offset to the metadata log's, naming the nodes
    whose whole interval lies beyond the grace window or is wider than the
    clock limit, and the steps of the metadata log's own clock (detectors.clocks)."""
    for cluster, (offsets, metadata_clock) in sorted(clusters.items()):
        if not offsets and not metadata_clock.steps:
            continue
        print(
            f"clocks of {cluster} (measured from what each node's requests knew; verdicts allow for them)",
            file=out,
        )
        for node, interval in offsets.items():
            off = interval.low_ms > grace_ms or interval.high_ms < -grace_ms
            advice = ": outside the grace window, check its NTP (chrony/ntpd)" if off else ""
            if interval.width_ms > limit_ms:
                # Loose evidence, or bounds from before a controller took the log over
                # (ClockBook.taken_over) that nothing since has settled.
                advice = ": wider than the clock limit, its verdicts are counted clock uncertain"
            print(f"  {interval.describe(node)}{advice}", file=out)
        for offset, moved in metadata_clock.steps:
            where = f" at offset {offset}" if offset is not None else ""
            print(
                f"  the metadata log's clock stepped {moved / 1000:+.1f} s{where} (a controller "
                "fail-over onto another clock?): its time is made continuous across the step",
                file=out,
            )


def by_name(counts: dict[str, int]) -> str:
    """`` (A=1, B=2)``, sorted by name; "" for no counts."""
    return " (" + ", ".join(f"{k}={v}" for k, v in sorted(counts.items())) + ")" if counts else ""
