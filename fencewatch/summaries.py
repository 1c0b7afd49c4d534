"""Human-readable summaries on stderr."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TextIO

from detectors.cluster import Counters


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


def print_summary(counters: Counters, dead_letters: int, out: TextIO) -> None:
    _table("events", [(k, str(v)) for k, v in sorted(counters.events.items())], out)
    _table(
        "not judged",
        [
            ("dead letters", str(dead_letters)),
            ("duplicates", str(counters.duplicates)),
            ("late (beyond lateness)", str(counters.late)),
        ]
        + [(f"dead letters: {k}", str(v)) for k, v in sorted(counters.dead_letters.items())]
        + [(f"unverified: {k}", str(v)) for k, v in sorted(counters.unverified.items())],
        out,
    )
    alerts = sorted(counters.alerts_by_rule().items())
    _table(
        "alerts", [("rule", "count"), *((k, str(v)) for k, v in alerts)] if alerts else [("none", "0")], out
    )


def print_confusion(table: dict[str, dict[str, int]], out: TextIO) -> bool:
    """Print injected-versus-detected per rule; True when they agree exactly."""
    rows = [("rule", "tp", "fp", "fn")]
    rows += [(rule, str(c["tp"]), str(c["fp"]), str(c["fn"])) for rule, c in table.items()]
    totals = {k: sum(c[k] for c in table.values()) for k in ("tp", "fp", "fn")}
    rows.append(("total", str(totals["tp"]), str(totals["fp"]), str(totals["fn"])))
    _table("ground truth (tp: injected and detected, fp: false alarm, fn: missed)", rows, out)
    return totals["fp"] == 0 and totals["fn"] == 0
