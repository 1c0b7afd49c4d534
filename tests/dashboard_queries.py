"""The PromQL of the Grafana dashboards in dashboards/grafana/, ready for Prometheus.

``panel_queries(path)`` gives every panel target's expression with the Grafana
variables substituted, so that a test can run it against a real Prometheus
(the unit tier checks its syntax with promtool, the end-to-end tier runs it on
live metrics). ``selectors(expr)`` finds the series an expression reads, for
checks against the metrics the job exports (streaming/metrics.py).

A variable the substitution does not know raises ``KeyError``: a dashboard
that gains one must be taught here, or its panels could not be checked.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
GRAFANA_DIR = REPO_ROOT / "dashboards" / "grafana"

# $name, ${name}, ${name:format}, [[name]]
_VARIABLE = re.compile(r"\$\{(\w+)(?::[^}]*)?\}|\$(\w+)|\[\[(\w+)\]\]")


def all_dashboards() -> list[Path]:
    """Every dashboard JSON file under dashboards/grafana/ (provisioning files are YAML)."""
    return sorted(GRAFANA_DIR.rglob("*.json"))


def iter_panels(panels: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    """Every panel, including those nested in collapsed rows."""
    for panel in panels:
        yield panel
        yield from iter_panels(panel.get("panels", []))


def substitute(expr: str, values: dict[str, str]) -> str:
    """``expr`` with each Grafana variable replaced by ``values[name]`` (KeyError if unknown)."""

    def replace(match: re.Match[str]) -> str:
        name = next(g for g in match.groups() if g)
        return values[name]

    return _VARIABLE.sub(replace, expr)


def variable_values(
    cluster_regex: str = ".*", rate_interval: str = "1m", interval: str = "15s", range_: str = "1h"
) -> dict[str, str]:
    """What Grafana would put in place of each variable the dashboards use."""
    return {
        "cluster": cluster_regex,
        "__rate_interval": rate_interval,
        "__interval": interval,
        "__range": range_,
        "datasource": "prometheus",
    }


def panel_queries(
    path: Path | str,
    cluster_regex: str = ".*",
    rate_interval: str = "1m",
    *,
    interval: str = "15s",
    range_: str = "1h",
) -> list[tuple[str, str, str]]:
    """(panel title, refId, PromQL with variables substituted) for every target of every panel."""
    dashboard = json.loads(Path(path).read_text(encoding="utf-8"))
    values = variable_values(cluster_regex, rate_interval, interval, range_)
    queries = []
    for panel in iter_panels(dashboard.get("panels", [])):
        for target in panel.get("targets", []):
            if "expr" in target:
                queries.append((panel["title"], target["refId"], substitute(target["expr"], values)))
    return queries


# ---- what an expression reads --------------------------------------------------------------

_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`')
_GROUPING = re.compile(r"\b(by|without|on|ignoring|group_left|group_right)\s*\(([^)]*)\)")
_RANGE = re.compile(r"\[[^\]]*\]")
_IDENT = re.compile(r"(?<![\w.])([a-zA-Z_:][a-zA-Z0-9_:]*)")
_KEYWORDS = frozenset(
    {"and", "or", "unless", "offset", "bool", "by", "without", "on", "ignoring", "group_left", "group_right"}
)
_NUMBERS = frozenset({"inf", "nan", "Inf", "NaN"})
_MATCHER = re.compile(r'\s*([a-zA-Z_]\w*)\s*(=~|!~|!=|=)\s*("(?:[^"\\]|\\.)*")\s*,?')


@dataclass(frozen=True)
class Selector:
    """A series selector: the metric name and the label names its matchers use."""

    metric: str
    labels: frozenset[str]


def selectors(expr: str) -> list[Selector]:
    """The series selectors of a PromQL expression, in order.

    A small scanner rather than a parser (no Python PromQL parser exists):
    promtool checks the syntax; this finds metric names, the labels their
    matchers name, and (``grouping_labels``) the labels of by/on clauses.
    """
    found: list[Selector] = []
    # Matchers first, while strings are still intact: name{...} and {...}.
    pos = 0
    masked = []
    for match in re.finditer(r"([a-zA-Z_:][a-zA-Z0-9_:]*)?\s*\{", expr):
        if match.start() < pos:
            continue
        end = _matchers_end(expr, match.end())
        labels = frozenset(m.group(1) for m in _MATCHER.finditer(expr[match.end() : end - 1]))
        found.append(Selector(match.group(1) or "", labels))
        masked.append((match.start(), end))
        pos = end
    rest = _mask(expr, masked)
    rest = _STRING.sub(" ", rest)
    rest = _GROUPING.sub(" ", rest)
    rest = _RANGE.sub(" ", rest)
    for match in _IDENT.finditer(rest):
        name = match.group(1)
        after = rest[match.end() :].lstrip()
        if name in _KEYWORDS or name in _NUMBERS or after.startswith("("):
            continue
        found.append(Selector(name, frozenset()))
    return found


def grouping_labels(expr: str) -> set[str]:
    """Every label named in a by/without/on/ignoring/group_left/group_right clause."""
    return {
        label.strip()
        for match in _GROUPING.finditer(_STRING.sub('""', expr))
        for label in match.group(2).split(",")
        if label.strip()
    }


def _matchers_end(expr: str, start: int) -> int:
    """The index just after the ``}`` closing the matchers that begin at ``start``."""
    i = start
    while i < len(expr):
        if expr[i] in "\"'`":
            string = _STRING.match(expr, i)
            if string is None:
                raise ValueError(f"unterminated string in {expr!r}")
            i = string.end()
            continue
        if expr[i] == "}":
            return i + 1
        i += 1
    raise ValueError(f"unterminated {{ in {expr!r}")


def _mask(expr: str, spans: list[tuple[int, int]]) -> str:
    out, last = [], 0
    for start, end in spans:
        out.append(expr[last:start])
        out.append(" ")
        last = end
    out.append(expr[last:])
    return "".join(out)


# ---- the Prometheus tools ------------------------------------------------------------------

TOOL_PACKAGES = "prometheus prometheus-alertmanager"


def require_tool(name: str) -> str:
    """The path of promtool or amtool; fails the test (never skips) when it is missing."""
    import shutil

    import pytest

    path = shutil.which(name)
    if path is None:
        pytest.fail(
            f"{name} is not installed: install the Debian packages {TOOL_PACKAGES} "
            f"(apt-get install -y {TOOL_PACKAGES}); CI installs them",
            pytrace=False,
        )
    return path
