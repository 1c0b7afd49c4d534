"""Clock bounds read from Prometheus (``--clock-bounds-from-prometheus``):
what node_exporter's timex collector says of each host's clock, turned into
the bounds ``--clock-bound-ms`` gives by hand (DetectorConfig.clock_bounds).

node_exporter exports, per host, the kernel's NTP state (adjtimex(2)):
``node_timex_offset_seconds``, the clock's offset from the time server's, and
``node_timex_maxerror_seconds``, the most its time may be off. A host's clock
is then within ``|offset| + maxerror`` of true time: its error. A bound is on
a node's clock against the metadata log's, which is the active controller's,
itself off true time by its host's error; so a node's bound is its host's
error plus the largest error of every host mapped. That holds for whichever
controller is active as long as the controllers' hosts are mapped too; a bound
too tight is not trusted silently all the same: evidence that contradicts it
wins and is reported (ClusterState.node_interval).

Prometheus is asked once, through its HTTP API (``/api/v1/query``), when a
command starts. A Prometheus that cannot be asked ends the command in one line
(:class:`PrometheusUnreachable`); a node whose host has no series, or a value
that is no error, gets no bound from it, with a warning naming the node.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlparse

import httpx

OFFSET_SERIES = "node_timex_offset_seconds"
MAXERROR_SERIES = "node_timex_maxerror_seconds"
TIMEOUT_S = 10.0


class PrometheusUnreachable(Exception):
    """Prometheus could not be asked, or did not answer as its HTTP API does: the reason, in one line."""


@dataclass(frozen=True)
class ReadBounds:
    """Each node's bound in ms (node -> ms) and a warning per node that got none."""

    bounds: dict[int, int]
    warnings: list[str]


def check_url(url: str) -> str:
    """``url`` if it can name a Prometheus server (http or https, with a host), else ValueError."""
    parts = urlparse(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ValueError(f"{url!r} is not an http:// or https:// URL of a Prometheus server")
    return url.rstrip("/")


def read_bounds(url: str, instances: Mapping[int, str], timeout_s: float = TIMEOUT_S) -> ReadBounds:
    """The bound of each node of ``instances`` (node -> its host's ``instance``
    label) from the Prometheus at ``url``. Raises :class:`PrometheusUnreachable`."""
    errors: dict[int, float] = {}
    warnings: list[str] = []
    offsets = _values_by_instance(url, OFFSET_SERIES, timeout_s)
    maxerrors = _values_by_instance(url, MAXERROR_SERIES, timeout_s)
    for node, instance in sorted(instances.items()):
        missing = [
            name
            for name, got in ((OFFSET_SERIES, offsets), (MAXERROR_SERIES, maxerrors))
            if instance not in got
        ]
        if missing:
            warnings.append(
                f"node {node}: Prometheus has no {' or '.join(missing)} for instance {instance!r} "
                "(is node_exporter's timex collector scraped there?): no bound read for it"
            )
            continue
        offset, maxerror = offsets[instance], maxerrors[instance]
        if not (math.isfinite(offset) and math.isfinite(maxerror) and maxerror >= 0):
            warnings.append(
                f"node {node}: instance {instance!r} reports offset {offset} s and maximum error "
                f"{maxerror} s, which bound nothing: no bound read for it"
            )
            continue
        errors[node] = abs(offset) + maxerror
    largest = max(errors.values(), default=0.0)
    bounds = {node: math.ceil((error + largest) * 1000) for node, error in errors.items()}
    return ReadBounds(bounds, warnings)


def merged(
    given: tuple[tuple[int, int], ...], read: Mapping[int, int], every: int
) -> tuple[tuple[int, int], ...]:
    """``given`` (DetectorConfig.clock_bounds, ``every`` the node that stands for
    all) with the bounds ``read``: where both bound a node, the tighter wins."""
    named = {node: ms for node, ms in given if node != every}
    default = next((ms for node, ms in given if node == every), None)
    out = []
    for node, ms in sorted(read.items()):
        known = named.pop(node, default)
        out.append((node, ms if known is None else min(ms, known)))
    return (*out, *sorted(named.items()), *(((every, default),) if default is not None else ()))


def _values_by_instance(url: str, series: str, timeout_s: float) -> dict[str, float]:
    """The value of ``series`` per ``instance`` label, the largest in size where
    several scrape jobs export one instance's (the looser bound), or one that is
    no number at all (NaN: it bounds nothing)."""
    try:
        reply = httpx.get(f"{url}/api/v1/query", params={"query": series}, timeout=timeout_s)
    except httpx.HTTPError as exc:
        raise PrometheusUnreachable(f"cannot ask Prometheus at {url}: {exc or type(exc).__name__}") from None
    if reply.status_code != 200:
        raise PrometheusUnreachable(f"Prometheus at {url} answered {series} with HTTP {reply.status_code}")
    try:
        body: Any = reply.json()
        result = body["data"]["result"] if body.get("status") == "success" else None
    except (ValueError, KeyError, TypeError, AttributeError):
        result = None
    if not isinstance(result, list):
        raise PrometheusUnreachable(f"{url} did not answer {series} as Prometheus's HTTP API does")
    values: dict[str, float] = {}
    for sample in result:
        try:
            instance = str(sample["metric"]["instance"])
            value = float(sample["value"][1])
        except (KeyError, IndexError, TypeError, ValueError):
            continue  # a series without an instance names no host
        known = values.get(instance)
        if known is None or not math.isfinite(value) or (math.isfinite(known) and abs(value) > abs(known)):
            values[instance] = value
    return values
