"""Comparing alerts with a simulator's ground truth: the confusion counts per rule."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from typing import Any

MATCH_FIELDS = ("rule", "status", "cluster", "node", "ts_ms", "topic", "partition")


def match_key(record: dict[str, Any]) -> tuple[Any, ...]:
    """What identifies one violation in both an alert and a ground-truth entry."""
    return tuple(record.get(f, "firing" if f == "status" else None) for f in MATCH_FIELDS)


def confusion(alerts: Iterable[dict[str, Any]], truth: Iterable[dict[str, Any]]) -> dict[str, dict[str, int]]:
    """Per rule: ``tp`` injected and detected, ``fp`` detected but not injected,
    ``fn`` injected but not detected. Multiplicity counts."""
    detected = Counter(match_key(a) for a in alerts)
    injected = Counter(match_key(t) for t in truth)
    table: dict[str, dict[str, int]] = {}
    for key in detected.keys() | injected.keys():
        row = table.setdefault(key[0], {"tp": 0, "fp": 0, "fn": 0})
        both = min(detected[key], injected[key])
        row["tp"] += both
        row["fp"] += detected[key] - both
        row["fn"] += injected[key] - both
    return dict(sorted(table.items()))
