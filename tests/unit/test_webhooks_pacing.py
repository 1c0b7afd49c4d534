"""When to try again, without a network: Retry-After parsing and capping, and the circuit breaker."""

from __future__ import annotations

import email.utils
import random

import pytest

from webhooks.pacing import Circuit, retry_after_seconds

NOW = 1_800_000_000.0
CAP = 300.0


@pytest.mark.parametrize(
    ("header", "seconds"),
    [
        ("120", 120.0),
        (" 7 ", 7.0),
        ("0", 0.0),
        ("99999999", CAP),
        ("9" * 5000, CAP),  # float() of it is inf; still the cap
        (email.utils.formatdate(NOW + 60, usegmt=True), 60.0),
        (email.utils.formatdate(NOW - 60, usegmt=True), 0.0),  # a date in the past: now
        ("Fri, 31 Dec 9999 23:59:59 GMT", CAP),
        ("Sun, 06 Nov 1994 08:49:37", 0.0),  # no zone: GMT, long past
    ],
)
def test_retry_after_in_both_forms_is_capped(header: str, seconds: float) -> None:
    assert retry_after_seconds(header, NOW, CAP) == seconds


@pytest.mark.parametrize(
    "header",
    [None, "", "soon", "-5", "1.5", "1e9", "²", "Fri, 31 Dec 99999 23:59:59 GMT", "Mon, 99 Foo 2026"],
)
def test_a_missing_or_malformed_retry_after_gives_none(header: str | None) -> None:
    assert retry_after_seconds(header, NOW, CAP) is None


class Ceiling(random.Random):
    def uniform(self, a: float, b: float) -> float:
        return b


def test_one_failing_row_never_opens_the_circuit() -> None:
    circuit = Circuit(3, 2.0, 60.0, Ceiling())
    for _ in range(10):
        assert circuit.row_failed(7, NOW) is None
    assert not circuit.is_held(NOW)


def test_different_rows_failing_in_a_row_open_it_and_each_probe_doubles_the_pause() -> None:
    circuit = Circuit(3, 2.0, 60.0, Ceiling())
    assert circuit.row_failed(1, NOW) is None
    assert circuit.row_failed(2, NOW) is None
    assert circuit.row_failed(3, NOW) == 2.0
    assert circuit.is_held(NOW + 1.9) and not circuit.is_held(NOW + 2.0)
    assert circuit.row_failed(4, NOW + 2.0) == 4.0  # the probe failed: open again at once
    assert circuit.row_failed(5, NOW + 6.0) == 8.0
    circuit.succeeded()
    assert circuit.row_failed(6, NOW + 14.0) is None  # a delivery closed it: counting starts over


def test_a_success_between_failures_keeps_it_closed() -> None:
    circuit = Circuit(3, 2.0, 60.0, Ceiling())
    for row in range(10):
        assert circuit.row_failed(row, NOW) is None
        if row % 2:
            circuit.succeeded()
    assert not circuit.is_held(NOW)


def test_a_hold_never_shortens_an_earlier_one() -> None:
    circuit = Circuit(3, 2.0, 60.0, Ceiling())
    circuit.hold(NOW + 30)
    circuit.hold(NOW + 10)
    assert circuit.held_until == NOW + 30
