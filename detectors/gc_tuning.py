"""Garbage-collector settings for a process that holds a detector.

A detector keeps hundreds of thousands of small long-lived objects (view
histories, pending judgments, remembered record identities) and allocates a
few per event. CPython's default young-generation threshold (700 container
allocations) then starts a collection every few dozen events, and every tenth
of those walks the middle generation again; none of them finds garbage,
because reference counting already frees what the detector drops (it makes no
reference cycles per event). Measured on 200k simulated events in one process,
three alternating rounds (docs/performance.md, "Garbage collection"): 34-41 us
per event with the defaults, 31-32 us with a young threshold of 10,000, 29-31
us with the collector off. The collector stays on: a detector replaced by a newer snapshot
is a cycle (clusters and their pending judgments point at each other) that only
the collector frees.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager

# Container allocations between young-generation collections.
YOUNG_THRESHOLD = 10_000


def tune_for_detector() -> None:
    """Collect the young generation less often (never more often than now)."""
    young, middle, old = gc.get_threshold()
    gc.set_threshold(max(young, YOUNG_THRESHOLD), middle, old)


@contextmanager
def collector_paused() -> Iterator[None]:
    """No collection inside the block: unpickling a detector creates its whole
    object graph at once, and the collections that triggers walk every object
    made so far (a 2.3 MB snapshot: 466 ms median with them, 72 ms without)."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()
