"""Comparing alerts with a simulator's ground truth: the confusion counts per
rule, violations and resolutions apart."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from typing import Any

import orjson

from detectors.alerts import FIRING, POSSIBLE, STATUSES
from detectors.lines import DEFAULT_MAX_RECORD_BYTES, LongLine, read_lines, too_large_reason

MATCH_FIELDS = ("rule", "status", "cluster", "node", "ts_ms", "topic", "partition")


def status_of(record: Mapping[str, Any]) -> str:
    """``firing`` (a violation) or ``resolved`` (a timer alert ending); records
    without a status fire."""
    return str(record.get("status") or FIRING)


def match_key(record: Mapping[str, Any]) -> tuple[Any, ...]:
    """What identifies one violation (or one resolution) in both an alert and a ground-truth entry."""
    return tuple(status_of(record) if f == "status" else record.get(f) for f in MATCH_FIELDS)


def count_by_status(records: Iterable[Mapping[str, Any]]) -> dict[str, dict[str, int]]:
    """Per status (``firing``, ``resolved``), the records of each rule, rules sorted."""
    counts = Counter((status_of(r), str(r["rule"])) for r in records)
    table: dict[str, dict[str, int]] = {status: {} for status in STATUSES}
    for (status, rule), n in sorted(counts.items()):
        table.setdefault(status, {})[rule] = n
    return table


def is_possible(record: Mapping[str, Any]) -> bool:
    """A possible violation (detectors.alerts.POSSIBLE); alerts without the field are certain."""
    return record.get("confidence") == POSSIBLE


def confusion(
    alerts: Iterable[Mapping[str, Any]], truth: Iterable[Mapping[str, Any]]
) -> dict[tuple[str, str], dict[str, int]]:
    """Per (rule, status): ``tp`` injected and detected, ``fp`` detected but not
    injected, ``fn`` injected but not detected, of the certain alerts (possible
    ones: :func:`possible_counts`). Multiplicity counts. A timer rule's
    resolutions are rows of their own (status ``resolved``), never counted
    with its violations."""
    detected = Counter(match_key(a) for a in alerts if not is_possible(a))
    injected = Counter(match_key(t) for t in truth)
    table: dict[tuple[str, str], dict[str, int]] = {}
    for key in detected.keys() | injected.keys():
        row = table.setdefault((key[0], key[1]), {"tp": 0, "fp": 0, "fn": 0})
        both = min(detected[key], injected[key])
        row["tp"] += both
        row["fp"] += detected[key] - both
        row["fn"] += injected[key] - both
    return dict(sorted(table.items()))


def possible_counts(
    alerts: Iterable[Mapping[str, Any]], truth: Iterable[Mapping[str, Any]]
) -> tuple[int, int]:
    """The possible alerts that catch an injected violation no certain alert
    caught, and the others (false ones), multiplicity counting."""
    alerts = list(alerts)
    injected = Counter(match_key(t) for t in truth)
    injected.subtract(Counter(match_key(a) for a in alerts if not is_possible(a)))
    caught = false = 0
    for alert in alerts:
        if not is_possible(alert):
            continue
        key = match_key(alert)
        if injected[key] > 0:
            injected[key] -= 1
            caught += 1
        else:
            false += 1
    return caught, false


class TruthFileError(ValueError):
    """A ground-truth file that cannot be used; the message says where and why, in one line."""


def load_truth(path: str, max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES) -> list[dict[str, Any]]:
    """The records of a ground-truth JSONL file (``fencewatch simulate --truth``).

    Raises :class:`TruthFileError` naming the first unusable line, OSError if
    the file cannot be read. Blank lines are skipped."""
    records: list[dict[str, Any]] = []
    with open(path, "rb") as f:
        for number, line in enumerate(read_lines(f, max_record_bytes), start=1):
            where = f"{path} line {number}"
            if isinstance(line, LongLine):
                raise TruthFileError(too_large_reason(where, max_record_bytes, line.size))
            if not line.strip():
                continue
            try:
                record = orjson.loads(line)
            except orjson.JSONDecodeError as exc:
                raise TruthFileError(f"{where} is not JSON ({exc})") from None
            if not isinstance(record, dict) or not isinstance(record.get("rule"), str):
                raise TruthFileError(f"{where} is not a ground-truth record (a JSON object with a 'rule')")
            records.append(record)
    return records
