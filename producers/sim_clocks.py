"""Broken clocks for the simulator (``fencewatch simulate --clock NODE=SPEC``).

Every node's clock already runs off true time by a fixed random base skew
within ``SimConfig.skew_ms`` (producers.sim_model). A clock fault adds to that,
deliberately beyond the skew limit the detector's grace window allows:

- ``+3s``       ``ClockOffset``: a constant offset from the start;
- ``+8s@60s``   ``ClockStep``: no extra offset until 60 s of simulated time
  after the start, then +8 s;
- ``+5ms/s``    ``ClockDrift``: the clock gains 5 ms per simulated second from
  the start (``-5ms/s`` loses them); the offset is the drift's whole
  milliseconds so far, rounded toward zero.

An offset or rate takes a sign and the unit ``ms`` or ``s`` (``-250ms``,
``+1.5s``, ``+0.5ms/s``) and must come to a whole number of milliseconds (a
rate to a whole number of microseconds per second, ``ppm``); a time
(``@60s``, ``--failover-at 60000ms``) takes no sign. Several faults of one
node add up. ``Failover`` is a forced Raft election (``--failover-at``,
``--failover-to``), which hands the metadata log's clock to another controller;
its ``silence_ms`` (``--failover-silence``) is how long the metadata log then
writes nothing, as after a crashed controller (``controller.quorum.fetch.timeout.ms``).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from typing import Any

CLOCK_FORMS = (
    "NODE=+OFFSET (constant), NODE=+OFFSET@TIME (a step at TIME after the start) or "
    "NODE=+RATE/s (drift), e.g. 3=+3s, 3=-250ms@60s, 3001=+5ms/s; OFFSET and RATE take a sign "
    "and ms or s, TIME none"
)
TIME_FORMS = "a time after the start in ms or s, e.g. 60s or 60000ms"

_NUMBER = r"(\d+(?:\.\d+)?)(ms|s)"
_OFFSET = re.compile(rf"([+-]){_NUMBER}")
_STEP = re.compile(rf"([+-]){_NUMBER}@{_NUMBER}")
_DRIFT = re.compile(rf"([+-]){_NUMBER}/s")
_TIME = re.compile(_NUMBER)
_UNIT_MS = {"ms": 1, "s": 1000}


@dataclass(frozen=True)
class ClockOffset:
    """``node``'s clock runs ``offset_ms`` ahead (negative: behind) from the start."""

    node: int
    offset_ms: int

    def at(self, elapsed_ms: int) -> int:
        """The extra offset ``elapsed_ms`` of true time after the start."""
        return self.offset_ms

    @property
    def spec(self) -> str:
        return f"{self.offset_ms:+d}ms"

    def to_json(self) -> dict[str, Any]:
        return {"kind": "offset", "spec": self.spec, "offset_ms": self.offset_ms}


@dataclass(frozen=True)
class ClockStep:
    """From ``at_ms`` of true time after the start on, ``node``'s clock runs
    ``offset_ms`` ahead (negative: behind); before that, no extra offset."""

    node: int
    offset_ms: int
    at_ms: int

    def at(self, elapsed_ms: int) -> int:
        return self.offset_ms if elapsed_ms >= self.at_ms else 0

    @property
    def spec(self) -> str:
        return f"{self.offset_ms:+d}ms@{self.at_ms}ms"

    def to_json(self) -> dict[str, Any]:
        return {"kind": "step", "spec": self.spec, "offset_ms": self.offset_ms, "at_ms": self.at_ms}


@dataclass(frozen=True)
class ClockDrift:
    """``node``'s clock gains ``ppm`` microseconds per second of true time
    (negative: loses them) from the start: 1 ms/s is 1000 ppm."""

    node: int
    ppm: int

    def at(self, elapsed_ms: int) -> int:
        gained = abs(self.ppm) * max(0, elapsed_ms) // 1_000_000  # whole ms, toward zero
        return gained if self.ppm >= 0 else -gained

    @property
    def spec(self) -> str:
        return f"{'-' if self.ppm < 0 else '+'}{_trim(Decimal(abs(self.ppm)) / 1000)}ms/s"

    def to_json(self) -> dict[str, Any]:
        return {"kind": "drift", "spec": self.spec, "ppm": self.ppm}


ClockFault = ClockOffset | ClockStep | ClockDrift


@dataclass(frozen=True)
class Failover:
    """A forced Raft election ``at_ms`` of true time after the start; ``to``
    (a controller), if given, wins it, else the seed picks a voter other than
    the leader, as for a random election.

    ``silence_ms``: the leader is lost (crashed) at ``at_ms``, and for that
    long the metadata log writes nothing, no records and no NoOps, as in a
    real cluster whose voters wait out their fetch timeout
    (``controller.quorum.fetch.timeout.ms``, 2 s, or more) before they elect;
    the election (votes, quorum states: the leader history's true time) and
    the new leader's first records come at ``at_ms + silence_ms``. Brokers
    keep serving requests meanwhile; whatever needs the controller waits
    (producers.simulator). 0: no silence, the election at ``at_ms``."""

    at_ms: int
    to: int | None = None
    silence_ms: int = 0


def _trim(value: Decimal) -> str:
    text = format(value, "f")
    return text.rstrip("0").rstrip(".") if "." in text else text


def _whole(number: str, unit: str, scale: int, what: str) -> int:
    try:
        value = Decimal(number) * _UNIT_MS[unit] * scale
    except InvalidOperation:  # pragma: no cover - the patterns admit only decimals
        raise ValueError(f"{number}{unit} is not a number") from None
    if value != value.to_integral_value():
        raise ValueError(f"{number}{unit} is not a whole number of {what}")
    return int(value)


def parse_time_ms(text: str) -> int:
    """``60s``, ``1.5s``, ``60000ms``: whole milliseconds, no sign."""
    match = _TIME.fullmatch(text.strip())
    if match is None:
        raise ValueError(f"{text!r} is not a time")
    return _whole(match[1], match[2], 1, "milliseconds")


def parse_spec(node: int, spec: str) -> ClockFault:
    """One clock fault of ``node`` from the SPEC of ``NODE=SPEC``."""
    spec = spec.strip()
    if match := _OFFSET.fullmatch(spec):
        sign = -1 if match[1] == "-" else 1
        return ClockOffset(node, sign * _whole(match[2], match[3], 1, "milliseconds"))
    if match := _STEP.fullmatch(spec):
        sign = -1 if match[1] == "-" else 1
        offset = sign * _whole(match[2], match[3], 1, "milliseconds")
        return ClockStep(node, offset, _whole(match[4], match[5], 1, "milliseconds"))
    if match := _DRIFT.fullmatch(spec):
        sign = -1 if match[1] == "-" else 1
        # ms/s -> microseconds per second (ppm)
        return ClockDrift(node, sign * _whole(match[2], match[3], 1000, "microseconds per second"))
    raise ValueError(f"{spec!r} is not a clock fault")


def parse_clock(text: str) -> ClockFault:
    """``NODE=SPEC`` (``--clock``) as a clock fault. Raises ValueError with a
    one-line message that names the accepted forms."""
    node_text, sep, spec = text.partition("=")
    try:
        if not sep:
            raise ValueError("no NODE=")
        try:
            node = int(node_text.strip())
        except ValueError:
            raise ValueError(f"{node_text.strip()!r} is not a node id") from None
        return parse_spec(node, spec)
    except ValueError as exc:
        raise ValueError(f"--clock {text}: {exc} -- write {CLOCK_FORMS}") from None


class Clocks:
    """The clock faults of a run; ``start_ms`` is the true time steps and
    drifts count from."""

    def __init__(self, faults: Iterable[ClockFault], start_ms: int):
        self.faults = tuple(faults)
        self.start_ms = start_ms
        self._by_node: dict[int, list[ClockFault]] = {}
        for fault in self.faults:
            self._by_node.setdefault(fault.node, []).append(fault)

    def offset_ms(self, node: int, true_ms: int) -> int:
        """How far ``node``'s clock is moved by its faults at true time ``true_ms``
        (on top of its base skew); 0 for a node without faults."""
        faults = self._by_node.get(node)
        if not faults:
            return 0
        elapsed = true_ms - self.start_ms
        return sum(f.at(elapsed) for f in faults)

    def of(self, node: int) -> tuple[ClockFault, ...]:
        return tuple(self._by_node.get(node, ()))
