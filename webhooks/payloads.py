"""Request bodies for the three webhook formats, built from one SPEC 3 alert dict.

- ``json``: the alert object itself, unchanged (``confidence`` and, for a
  possible violation, ``clock_condition`` included).
- ``alertmanager``: Alertmanager's webhook payload, version 4, carrying this
  one alert, so receivers written for Alertmanager (PagerDuty, Opsgenie,
  alertmanager-webhook bridges) take fencewatch alerts as they are. A possible
  violation has the label ``confidence="possible"`` and its condition as the
  ``clock_condition`` annotation.
- ``slack``: ``{"text": ...}``, one readable line, for Slack-style incoming webhooks.

The human text (Slack's line, the annotations) is detectors.render.alert_line,
as everywhere else an alert is shown.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any

import orjson

from detectors.alerts import FIRING, POSSIBLE, RESOLVED
from detectors.render import alert_line, iso_utc

# Alertmanager's "not ended" endsAt: Go's zero time.
ZERO_TIME = "0001-01-01T00:00:00Z"
# Labels identify an alert series: the same for its firing and its resolved
# alert (whose alert_id differs), so receivers pair them by fingerprint.
LABEL_FIELDS = ("cluster", "topic", "partition", "node")


def render(fmt: str, alert: Mapping[str, Any], receiver: str, external_url: str = "") -> bytes:
    """The body for ``fmt`` (json | alertmanager | slack); ``receiver`` is the endpoint name."""
    if fmt == "json":
        return orjson.dumps(alert)
    if fmt == "alertmanager":
        return orjson.dumps(alertmanager(alert, receiver, external_url))
    if fmt == "slack":
        return orjson.dumps({"text": slack_text(alert)})
    raise ValueError(f"unknown webhook format {fmt!r}")


def labels(alert: Mapping[str, Any]) -> dict[str, str]:
    """Alertmanager labels: strings only, absent fields left out (an empty label is no label)."""
    out = {"alertname": str(alert["rule"]), "rule": str(alert["rule"]), "severity": str(alert["severity"])}
    for key in LABEL_FIELDS:
        if alert.get(key) is not None:
            out[key] = str(alert[key])
    if alert.get("topic") is None and alert.get("topic_id") is not None:
        out["topic_id"] = str(alert["topic_id"])
    if alert.get("confidence") == POSSIBLE:
        # A label of its own, so routes can tell it apart; certain alerts keep
        # the labels (and fingerprints) they always had.
        out["confidence"] = POSSIBLE
    return out


def fingerprint(alert_labels: Mapping[str, str]) -> str:
    """16 hex digits identifying the label set, as Alertmanager's fingerprint does."""
    text = "\x1f".join(f"{k}\x1e{v}" for k, v in sorted(alert_labels.items()))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def alertmanager(alert: Mapping[str, Any], receiver: str, external_url: str = "") -> dict[str, Any]:
    """The Alertmanager webhook v4 payload for one alert."""
    status = str(alert.get("status") or FIRING)
    alert_labels = labels(alert)
    links = [str(link) for link in alert.get("links") or []]
    annotations = {
        "summary": str(alert["message"]),
        # The whole line: status, severity, rule, where, when; a receiver that
        # shows only annotations still tells a resolution from a new alert.
        "description": alert_line(alert),
        "alert_id": str(alert["alert_id"]),
    }
    condition = alert.get("clock_condition")
    if alert.get("confidence") == POSSIBLE and isinstance(condition, Mapping):
        annotations["clock_condition"] = str(condition.get("text", ""))
    if links:
        annotations["links"] = " ".join(links)
    ts_ms = int(alert["ts_ms"])
    if status == RESOLVED:
        # A resolved alert's evidence holds the event that fired it: its start.
        evidence_ts = [int(e["ts_ms"]) for e in alert.get("evidence") or [] if e.get("ts_ms") is not None]
        starts_at, ends_at = iso_utc(min([ts_ms, *evidence_ts])), iso_utc(ts_ms)
    else:
        starts_at, ends_at = iso_utc(ts_ms), ZERO_TIME
    fp = fingerprint(alert_labels)
    # One alert per notification: its group is the alert series, so a receiver
    # that keys incidents on groupKey resolves the one that fired.
    return {
        "version": "4",
        "groupKey": f'{{}}:{{fingerprint="{fp}"}}',
        "truncatedAlerts": 0,
        "status": status,
        "receiver": receiver,
        "groupLabels": {},
        "commonLabels": dict(alert_labels),
        "commonAnnotations": dict(annotations),
        "externalURL": external_url,
        "alerts": [
            {
                "status": status,
                "labels": alert_labels,
                "annotations": annotations,
                "startsAt": starts_at,
                "endsAt": ends_at,
                # The proposal the rule enforces is the closest thing to "what generated this".
                "generatorURL": links[0] if links else "",
                "fingerprint": fp,
            }
        ],
    }


def slack_text(alert: Mapping[str, Any]) -> str:
    """:func:`detectors.render.alert_line`, escaped for Slack."""
    # Slack reads &, < and > as markup (links, mentions); these must be escaped.
    return alert_line(alert).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
