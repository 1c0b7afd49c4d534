"""Merging the clock bounds read from Prometheus with those given by hand
(producers.prometheus_clock_bounds.merged): where both bound a node, the
tighter wins; a bound for every node still bounds the nodes Prometheus did
not. Reading them from a real Prometheus: tests/integration/test_prometheus_clock_bounds.py."""

from __future__ import annotations

import pytest

from detectors.config import ALL_NODES, DetectorConfig
from producers.prometheus_clock_bounds import check_url, merged


@pytest.mark.parametrize(
    ("given", "node", "expected"),
    [
        pytest.param((), 3, 200, id="read only"),
        pytest.param(((3, 100),), 3, 100, id="given tighter"),
        pytest.param(((3, 5000),), 3, 200, id="read tighter"),
        pytest.param(((ALL_NODES, 150),), 3, 150, id="every node's tighter"),
        pytest.param(((ALL_NODES, 150),), 2, 150, id="a node Prometheus did not bound"),
        pytest.param(((2, 50), (ALL_NODES, 900)), 2, 50, id="a named one it did not bound"),
        pytest.param(((2, 50),), 1, None, id="unbounded"),
    ],
)
def test_the_tighter_bound_wins(given, node, expected):
    config = DetectorConfig(clock_bounds=merged(given, {3: 200, 3000: 400}, ALL_NODES))
    assert config.clock_bound_of(node) == expected


@pytest.mark.parametrize("url", ["ftp://h:9090", "localhost:9090", "http://", "h"])
def test_a_url_that_names_no_http_server_is_refused(url):
    with pytest.raises(ValueError, match="is not an http:// or https:// URL"):
        check_url(url)


def test_a_url_loses_its_trailing_slash():
    assert check_url("http://127.0.0.1:9090/") == "http://127.0.0.1:9090"
