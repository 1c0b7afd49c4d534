"""A dict standing in for Spark's MapState in the stores' unit tests, recording
every read and write so a test can assert what a batch wrote (the real MapState is
exercised by the Spark tests: test_job.py, test_pending_state.py)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any


class RecordingMapState:
    def __init__(self) -> None:
        self.values: dict[Any, tuple[bytes]] = {}
        self.writes: list[tuple[str, Any]] = []
        self.reads: list[Any] = []

    def getValue(self, key: Any) -> tuple[bytes] | None:
        self.reads.append(key)
        return self.values.get(key)  # None for a missing key, as Spark's MapState answers

    def updateValue(self, key: Any, value: tuple[bytes]) -> None:
        self.writes.append(("update", key))
        self.values[key] = value

    def removeKey(self, key: Any) -> None:
        self.writes.append(("remove", key))
        del self.values[key]

    def iterator(self) -> Iterator[tuple[Any, tuple[bytes]]]:
        return iter(list(self.values.items()))
