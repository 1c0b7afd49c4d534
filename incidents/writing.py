"""Writing the incident report's page to a file so a reader never opens half of it,
and saying what was written (``fencewatch replay --report``, ``fencewatch report``)."""

from __future__ import annotations

import os
import sys

from incidents.page import IncidentReport


def write_report(prog: str, report: IncidentReport, path: str) -> int:
    """Write the page beside ``path`` and rename it over, so a reader never
    opens half a report. Returns the exit code."""
    page = report.html()
    partial_path = f"{path}.partial"
    try:
        with open(partial_path, "w", encoding="utf-8") as f:
            f.write(page)
        os.replace(partial_path, path)
    except OSError as exc:
        print(f"{prog}: cannot write the report {path}: {exc.strerror}", file=sys.stderr)
        return 1
    drawn = sum(len(v) for v in report.drawn.values())
    print(
        f"{prog}: wrote {path} ({len(page.encode()) // 1024} KiB): {report.total} alerts, {drawn} timelines",
        file=sys.stderr,
    )
    return 0
