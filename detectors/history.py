"""A value's history in event time, so judgments can ask what the view held
at any moment of a grace window, whatever order the sources arrived in."""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Generic, TypeVar

T = TypeVar("T")

# The times at which a state changed inside the windows asked for, collected
# while a verdict's dependence on a clock is looked into
# (detectors.cluster.ClusterState.judge): one judgment at a time, in one thread.
_changes: list[int] | None = None


@contextmanager
def watching_changes() -> Iterator[list[int]]:
    """Collect, into the list given, the times of every change of state inside
    the windows :meth:`History.window` is asked for meanwhile."""
    global _changes
    outer, _changes = _changes, []
    try:
        yield _changes
    finally:
        _changes = outer


class History(Generic[T]):
    """States keyed by the ``ts_ms`` they took effect, in the order they were
    appended.

    Appends come from one ordered source (the metadata log, one broker's log).
    That order is authoritative: a record whose timestamp runs behind its
    predecessor's (CreateTime after a controller failover to a node with a
    slower clock) takes effect at its predecessor's time instead of being
    moved before it, so ``latest`` is always the newest record.
    """

    __slots__ = ("_states", "_times")

    def __init__(self, ts_ms: int, state: T):
        self._times: list[int] = [ts_ms]
        self._states: list[T] = [state]

    @classmethod
    def of(cls, times: list[int], states: list[T]) -> History[T]:
        """The history of ``states``, taking effect at ``times`` (as :meth:`items` gives them)."""
        history = cls.__new__(cls)
        history._times, history._states = times, states
        return history

    def items(self) -> tuple[list[int], list[T]]:
        """Its times and states, oldest first (not copies)."""
        return self._times, self._states

    def append(self, ts_ms: int, state: T) -> None:
        self._times.append(max(ts_ms, self._times[-1]))
        self._states.append(state)

    @property
    def latest(self) -> T:
        return self._states[-1]

    @property
    def latest_ts_ms(self) -> int:
        return self._times[-1]

    @property
    def first_ts_ms(self) -> int:
        return self._times[0]

    def at(self, ts_ms: int) -> T | None:
        """The state in effect at ``ts_ms``; None before the first known state."""
        i = bisect_right(self._times, ts_ms)
        return self._states[i - 1] if i else None

    def window(self, lo_ms: int, hi_ms: int) -> list[T]:
        """Every state in effect at some moment of ``[lo_ms, hi_ms]``."""
        start = max(bisect_right(self._times, lo_ms) - 1, 0)
        stop = bisect_right(self._times, hi_ms)
        if _changes is not None:
            _changes.extend(self._times[start + 1 : stop])
        return self._states[start:stop]

    def prune(self, before_ms: int) -> None:
        """Forget states superseded before ``before_ms``; the one in effect then stays."""
        i = bisect_right(self._times, before_ms) - 1
        if i > 0:
            del self._times[:i]
            del self._states[:i]

    def __len__(self) -> int:
        return len(self._times)
