"""Which records of an alerts topic the incident report can draw: a SPEC 3 alert
has the fields a timeline and the summary need, of the types they need."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from detectors.alerts import FIRING, STATUSES

# The fields of SPEC 3 a timeline and the summary need; a record without them is no alert.
REQUIRED_FIELDS = ("alert_id", "rule", "severity", "ts_ms", "detected_ms", "message")


def not_an_alert(record: Any) -> str | None:
    """Why ``record`` cannot be reported as a SPEC 3 alert, or None."""
    if not isinstance(record, dict):
        return "not a JSON object"
    missing = [name for name in REQUIRED_FIELDS if name not in record]
    if missing:
        return f"no {', '.join(missing)}"
    if not all(isinstance(record[name], str) for name in ("alert_id", "rule", "severity", "message")):
        return "alert_id, rule, severity and message must be strings"
    if not all(isinstance(record[name], int) for name in ("ts_ms", "detected_ms")):
        return "ts_ms and detected_ms must be integers"
    if record.get("status", FIRING) not in STATUSES:
        return f"status must be one of {', '.join(STATUSES)}"
    if not _ints_or_null(record, ("node", "partition")):
        return "node and partition must be integers or null"
    links = record.get("links", [])
    if not isinstance(links, list) or not all(isinstance(link, str) for link in links):
        return "links must be a list of strings"
    evidence = record.get("evidence", [])
    if not isinstance(evidence, list) or not all(
        isinstance(e, dict) and isinstance(e.get("ts_ms"), int) and _ints_or_null(e, ("node", "offset"))
        for e in evidence
    ):
        return (
            "evidence must be a list of objects with an integer ts_ms, and node and offset integers or null"
        )
    return None


def _ints_or_null(record: dict[str, Any], names: Sequence[str]) -> bool:
    return all(record.get(name) is None or type(record.get(name)) is int for name in names)
