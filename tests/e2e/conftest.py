"""End-to-end tier: the whole pipeline with the real observability parts
(Prometheus, Alertmanager) around it. Shares the integration tier's helpers."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parents[1]
# The integration tier's helpers (child processes, topic reads) and the
# dashboards' query helper are plain modules beside the tests.
for path in (TESTS / "integration", TESTS, TESTS.parent):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

from streaming.broker import EmbeddedBroker  # noqa: E402


@pytest.fixture(scope="session")
def broker() -> Iterator[EmbeddedBroker]:
    with EmbeddedBroker() as running:
        yield running
