"""The incident report in a real browser: Debian's Chromium driven by its
chromedriver through selenium (.ci/system-deps installs both).

``rendered(driver, path)`` opens a report and waits until every timeline is
drawn; the integration test asserts on what it returns. Run as a script it
writes a screenshot a reviewer can look at:

    .venv/bin/python tests/report_browser.py -o /tmp/report.png   # simulate, replay --report, screenshot
    .venv/bin/python tests/report_browser.py --report my-report.html -o /tmp/report.png
"""

from __future__ import annotations

import argparse
import contextlib
import shutil
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.support.ui import WebDriverWait

CHROMEDRIVER = "/usr/bin/chromedriver"
CHROMIUM = "/usr/bin/chromium"
RENDER_TIMEOUT_S = 120.0

# What the page shows; plotly marks a drawn chart's div "js-plotly-plot". The
# page draws a chart as it nears the viewport, so this scrolls to the first
# chart not drawn yet, as a reader scrolling down would.
_STATE_JS = """
const waiting = document.querySelector('.timeline-chart:not(.js-plotly-plot)');
if (waiting) waiting.scrollIntoView();
return {
  sections: document.querySelectorAll('section.alert-timeline').length,
  drawn: Array.from(document.querySelectorAll('section.alert-timeline'))
    .filter(s => s.querySelector('.js-plotly-plot .main-svg')).length,
  summary: Array.from(document.querySelectorAll('#summary tbody tr')).map(tr => [
    tr.dataset.rule, tr.dataset.severity,
    Number(tr.querySelector('td.firing').textContent), Number(tr.querySelector('td.resolved').textContent)]),
  leftOut: Array.from(document.querySelectorAll('p.left-out')).map(p => p.dataset.rule),
  externalScripts: document.querySelectorAll('script[src], link[href^="http"]').length,
  fetched: performance.getEntriesByType('resource').map(e => e.name),
  ready: document.readyState,
};
"""


@dataclass(frozen=True)
class PageState:
    sections: int
    drawn: int  # sections whose chart plotly has drawn
    summary: list[tuple[str, str, int, int]]  # (rule, severity, firing, resolved)
    left_out: list[str]
    external_scripts: int
    fetched: list[str]  # every resource the page loaded after the document itself
    console_errors: list[str]


def missing_browser() -> str | None:
    """What is missing to run Chromium here, or None."""
    absent = [p for p in (CHROMIUM, CHROMEDRIVER) if not Path(p).exists()]
    return f"{', '.join(absent)} missing: run  bash .ci/system-deps chromium" if absent else None


@contextlib.contextmanager
def chromium(width: int = 1300, height: int = 2400) -> Iterator[webdriver.Chrome]:
    """A headless Chromium that keeps the page's console log."""
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"):
        options.add_argument(flag)
    options.add_argument(f"--window-size={width},{height}")
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    try:
        yield driver
    finally:
        driver.quit()


def rendered(driver: webdriver.Chrome, path: Path, timeout_s: float = RENDER_TIMEOUT_S) -> PageState:
    """Open ``path`` and wait until every timeline section holds a drawn chart."""
    driver.get(path.resolve().as_uri())

    def all_drawn(d: webdriver.Chrome) -> dict[str, Any] | Literal[False]:
        state: dict[str, Any] = d.execute_script(_STATE_JS)
        done = state["ready"] == "complete" and state["drawn"] == state["sections"]
        return state if done else False

    state: dict[str, Any] = WebDriverWait(driver, timeout_s, poll_frequency=0.2).until(all_drawn)
    driver.execute_script("window.scrollTo(0, 0);")
    errors = [entry["message"] for entry in driver.get_log("browser") if entry["level"] == "SEVERE"]
    return PageState(
        sections=state["sections"],
        drawn=state["drawn"],
        summary=[tuple(row) for row in state["summary"]],
        left_out=state["leftOut"],
        external_scripts=state["externalScripts"],
        fetched=state["fetched"],
        console_errors=errors,
    )


def screenshot(report: Path, png: Path, width: int = 1300, height: int = 2400) -> PageState:
    """Render ``report`` and save the top ``height`` pixels as ``png``."""
    with chromium(width, height) as driver:
        state = rendered(driver, report)
        driver.save_screenshot(str(png))
    return state


def _demo_report(directory: Path, seed: int, events: int) -> Path:
    """`fencewatch simulate` then `fencewatch replay --report`, as a user runs them."""
    from fencewatch.cli import main as fencewatch

    events_file, report = directory / "sim.jsonl", directory / "report.html"
    assert fencewatch(["simulate", "--seed", str(seed), "--events", str(events), "-o", str(events_file)]) == 0
    with open(directory / "alerts.jsonl", "w") as out, contextlib.redirect_stdout(out):
        code = fencewatch(["replay", "--no-progress", "--report", str(report), str(events_file)])
    assert code == 0
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Screenshot an incident report in headless Chromium.")
    parser.add_argument("-o", "--output", required=True, help="the PNG to write")
    parser.add_argument("--report", help="an existing report (default: simulate and replay one)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--events", type=int, default=60000)
    parser.add_argument("--height", type=int, default=2400, help="pixels of the page to capture")
    args = parser.parse_args(argv)
    problem = missing_browser()
    if problem:
        print(f"report_browser: {problem}", file=sys.stderr)
        return 1
    work = Path(tempfile.mkdtemp(prefix="fencewatch-report-"))
    try:
        report = Path(args.report) if args.report else _demo_report(work, args.seed, args.events)
        state = screenshot(report, Path(args.output), height=args.height)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(
        f"{args.output}: {state.sections} timelines, {state.drawn} drawn, "
        f"{len(state.console_errors)} console errors {state.console_errors[:3]}"
    )
    return 0 if not state.console_errors and state.drawn == state.sections else 1


if __name__ == "__main__":
    raise SystemExit(main())
