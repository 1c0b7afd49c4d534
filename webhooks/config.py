"""Webhook endpoints, read from a TOML file and validated once.

One ``[[endpoint]]`` table per endpoint::

    [[endpoint]]
    name = "oncall"                  # unique; the only way an endpoint is named in logs and metrics
    url_env = "ONCALL_WEBHOOK_URL"   # or url_file = "/run/secrets/oncall-url", or url = "https://..."
    format = "alertmanager"          # json | alertmanager | slack
    rules = []                       # rule ids; empty: all
    severities = ["critical"]        # critical | warning | info; empty: all
    clusters = []                    # cluster names; empty: all
    rate_per_second = 5.0            # token bucket: sustained deliveries per second ...
    burst = 10                       # ... and how many may go at once after a quiet spell
    timeout_seconds = 5.0            # the whole request: connect, send, and the complete answer
    max_age_seconds = 86400          # an alert still undelivered this long after it was queued is parked
    max_attempts = 12                # an alert whose own attempts failed this often (e.g. 500s) is parked
    backoff_base_seconds = 1.0       # retry n waits a random 0..min(cap, base * 2**(n-1)) seconds
    backoff_cap_seconds = 300.0      # also the longest a server's Retry-After holds an endpoint back
    secret_env = "ONCALL_WEBHOOK_SECRET"   # or secret_file = "..."; optional: HMAC-SHA256 signing
    external_url = ""                # optional; alertmanager format only: its externalURL field

    [[endpoint]]
    name = "chat"
    url_file = "secrets/slack-url"   # relative paths are relative to this file
    format = "slack"
    severities = ["critical", "warning"]

Only ``name`` and one of ``url``/``url_env``/``url_file`` are required; the
other keys have the defaults shown. Secrets never sit in this file: the HMAC
secret comes only from ``secret_env`` or ``secret_file``, and a URL that is a
secret (a Slack webhook URL is) belongs in ``url_env`` or ``url_file``. Values
read from a file are stripped of surrounding whitespace. Neither the URL nor the
secret is ever logged or shown in an error message: endpoints are named by
``name``.
"""

from __future__ import annotations

import difflib
import math
import os
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from detectors import rules
from detectors.alerts import SEVERITIES
from detectors.probe_rules import PROBE_RULES

FORMATS = ("json", "alertmanager", "slack")

# key -> default, for the optional numeric keys.
NUMBER_DEFAULTS: dict[str, float] = {
    "rate_per_second": 5.0,
    "burst": 10,
    "timeout_seconds": 5.0,
    "max_age_seconds": 86400.0,
    "backoff_base_seconds": 1.0,
    "backoff_cap_seconds": 300.0,
}
# key -> default, for the optional whole-number keys.
COUNT_DEFAULTS: dict[str, int] = {"max_attempts": 12}
LIST_KEYS = ("rules", "severities", "clusters")
SOURCED_KEYS = ("url", "url_env", "url_file", "secret_env", "secret_file")
KNOWN_KEYS = ("name", "format", "external_url", *SOURCED_KEYS, *LIST_KEYS, *NUMBER_DEFAULTS, *COUNT_DEFAULTS)


class WebhookConfigError(ValueError):
    """The webhook config cannot be used; the message names the endpoint and key and says how to fix it."""


@dataclass(frozen=True, slots=True)
class Endpoint:
    """One webhook receiver and how alerts are delivered to it.

    ``url`` and ``secret`` are kept out of ``repr`` so that logging an endpoint
    never shows them. Empty filter sets accept everything. Times are seconds.
    """

    name: str
    url: str = field(repr=False)
    format: str = "json"
    rules: frozenset[str] = frozenset()
    severities: frozenset[str] = frozenset()
    clusters: frozenset[str] = frozenset()
    rate_per_second: float = NUMBER_DEFAULTS["rate_per_second"]
    burst: float = NUMBER_DEFAULTS["burst"]
    timeout_seconds: float = NUMBER_DEFAULTS["timeout_seconds"]
    max_age_seconds: float = NUMBER_DEFAULTS["max_age_seconds"]
    max_attempts: int = COUNT_DEFAULTS["max_attempts"]
    backoff_base_seconds: float = NUMBER_DEFAULTS["backoff_base_seconds"]
    backoff_cap_seconds: float = NUMBER_DEFAULTS["backoff_cap_seconds"]
    secret: bytes | None = field(default=None, repr=False)
    external_url: str = ""

    def accepts(self, alert: Mapping[str, Any]) -> bool:
        """Whether the endpoint's filters let ``alert`` (a SPEC 3 dict) through."""
        return (
            (not self.rules or alert.get("rule") in self.rules)
            and (not self.severities or alert.get("severity") in self.severities)
            and (not self.clusters or alert.get("cluster") in self.clusters)
        )


def load_endpoints(path: str | os.PathLike[str], environ: Mapping[str, str] | None = None) -> list[Endpoint]:
    """Read and validate every ``[[endpoint]]`` of the TOML file at ``path``.

    ``environ`` (default ``os.environ``) is where ``url_env``/``secret_env`` are
    looked up. Raises :class:`WebhookConfigError` on the first problem found.
    """
    config_path = Path(path)
    try:
        with config_path.open("rb") as f:
            doc = tomllib.load(f)
    except OSError as exc:
        raise WebhookConfigError(f"cannot read webhook config {config_path}: {exc.strerror}") from None
    except tomllib.TOMLDecodeError as exc:
        raise WebhookConfigError(f"webhook config {config_path} is not valid TOML: {exc}") from None
    where = f"webhook config {config_path}"
    unknown = sorted(set(doc) - {"endpoint"})
    if unknown:
        raise WebhookConfigError(
            f"{where}: unknown top-level key(s) {unknown}; the file holds only [[endpoint]] tables"
        )
    tables = doc.get("endpoint")
    if not isinstance(tables, list) or not tables or not all(isinstance(t, dict) for t in tables):
        raise WebhookConfigError(
            f"{where}: no endpoints; add at least one [[endpoint]] table with a name and a url"
        )
    env = os.environ if environ is None else environ
    endpoints: list[Endpoint] = []
    seen: set[str] = set()
    for index, table in enumerate(tables):
        endpoint = _endpoint(table, index, where, config_path.parent, env)
        if endpoint.name in seen:
            raise WebhookConfigError(
                f"{where}: two endpoints are named {endpoint.name!r}; names must be unique "
                "(they label the metrics and the outbox)"
            )
        seen.add(endpoint.name)
        endpoints.append(endpoint)
    return endpoints


def _endpoint(table: dict[str, Any], index: int, where: str, base: Path, env: Mapping[str, str]) -> Endpoint:
    name = table.get("name")
    if not isinstance(name, str) or not name.strip():
        raise WebhookConfigError(f"{where}: endpoint #{index + 1} needs a name (a non-empty string)")
    ctx = f"{where}: endpoint {name!r}"
    for key in sorted(set(table) - set(KNOWN_KEYS)):
        close = difflib.get_close_matches(key, KNOWN_KEYS, n=1)
        hint = f"did you mean {close[0]!r}?" if close else f"known keys: {', '.join(KNOWN_KEYS)}"
        if key == "secret":
            hint = "secrets never go in the config file; use secret_env or secret_file"
        raise WebhookConfigError(f"{ctx}: unknown key {key!r}; {hint}")

    fmt = table.get("format", "json")
    if fmt not in FORMATS:
        raise WebhookConfigError(f"{ctx}: format {fmt!r} is not one of {', '.join(FORMATS)}")

    url = _sourced(table, "url", ctx, base, env, required=True)
    assert url is not None
    if not url.startswith(("http://", "https://")):
        # The URL may be a secret: say where it came from, not what it is.
        raise WebhookConfigError(
            f"{ctx}: the url (from {_source_of(table, 'url')}) must start with http(s)://"
        )
    secret = _sourced(table, "secret", ctx, base, env, required=False)

    lists: dict[str, frozenset[str]] = {}
    for key in LIST_KEYS:
        value = table.get(key, [])
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise WebhookConfigError(f"{ctx}: {key} must be a list of strings (empty: all), got {value!r}")
        lists[key] = frozenset(value)
    bad = sorted(lists["severities"] - set(SEVERITIES))
    if bad:
        raise WebhookConfigError(f"{ctx}: unknown severities {bad}; use {', '.join(SEVERITIES)}")
    known_rules = [*rules.RULES, *PROBE_RULES]
    bad = sorted(lists["rules"] - set(known_rules))
    if bad:
        hints = [m for b in bad for m in difflib.get_close_matches(b, known_rules, n=1)]
        hint = f"; did you mean {hints}?" if hints else "; see docs/rules.md for the rule ids"
        raise WebhookConfigError(f"{ctx}: unknown rule ids {bad}{hint}")

    numbers = {key: _number(table, key, ctx) for key in NUMBER_DEFAULTS}
    if numbers["burst"] < 1:
        raise WebhookConfigError(
            f"{ctx}: burst must be at least 1 (deliveries at once), got {table['burst']}"
        )
    if numbers["backoff_cap_seconds"] < numbers["backoff_base_seconds"]:
        raise WebhookConfigError(
            f"{ctx}: backoff_cap_seconds ({numbers['backoff_cap_seconds']}) is below "
            f"backoff_base_seconds ({numbers['backoff_base_seconds']}); raise the cap or lower the base"
        )
    external_url = table.get("external_url", "")
    if not isinstance(external_url, str):
        raise WebhookConfigError(f"{ctx}: external_url must be a string, got {external_url!r}")

    return Endpoint(
        name=name,
        url=url,
        format=fmt,
        rules=lists["rules"],
        severities=lists["severities"],
        clusters=lists["clusters"],
        secret=secret.encode() if secret is not None else None,
        external_url=external_url,
        max_attempts=_count(table, "max_attempts", ctx),
        **numbers,
    )


def _source_of(table: Mapping[str, Any], what: str) -> str:
    for suffix, label in (("_env", "env var {}"), ("_file", "file {}")):
        if f"{what}{suffix}" in table:
            return label.format(table[f"{what}{suffix}"])
    return f"key {what!r}"


def _sourced(
    table: Mapping[str, Any], what: str, ctx: str, base: Path, env: Mapping[str, str], *, required: bool
) -> str | None:
    """The value of ``what`` given inline, as ``what_env`` or as ``what_file``: exactly one of them."""
    allowed = ("url", "url_env", "url_file") if what == "url" else ("secret_env", "secret_file")
    given = [k for k in allowed if k in table]
    if len(given) > 1:
        raise WebhookConfigError(f"{ctx}: give only one of {', '.join(given)}")
    if not given:
        if required:
            raise WebhookConfigError(
                f"{ctx}: no url; set url_env (an environment variable holding it), url_file, or url"
            )
        return None
    key = given[0]
    ref = table[key]
    if not isinstance(ref, str) or not ref:
        raise WebhookConfigError(f"{ctx}: {key} must be a non-empty string")
    if key.endswith("_env"):
        value = env.get(ref, "").strip()
        if not value:
            raise WebhookConfigError(
                f"{ctx}: {key} names environment variable {ref}, which is not set or empty; "
                f"export {ref} before starting the job"
            )
        return value
    if key.endswith("_file"):
        file = base / ref
        try:
            value = file.read_text(encoding="utf-8").strip()
        except (OSError, UnicodeDecodeError) as exc:
            reason = exc.strerror if isinstance(exc, OSError) else "not UTF-8 text"
            raise WebhookConfigError(f"{ctx}: {key} {file} cannot be read: {reason}") from None
        if not value:
            raise WebhookConfigError(f"{ctx}: {key} {file} is empty")
        return value
    return ref


def _number(table: Mapping[str, Any], key: str, ctx: str) -> float:
    value = table.get(key, NUMBER_DEFAULTS[key])
    # bool is an int in Python; `burst = true` is a mistake, not 1.
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not math.isfinite(value)
        or value <= 0
    ):
        raise WebhookConfigError(f"{ctx}: {key} must be a positive number, got {value!r}")
    return float(value)


def _count(table: Mapping[str, Any], key: str, ctx: str) -> int:
    value = table.get(key, COUNT_DEFAULTS[key])
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise WebhookConfigError(f"{ctx}: {key} must be a whole number of at least 1, got {value!r}")
    return value
