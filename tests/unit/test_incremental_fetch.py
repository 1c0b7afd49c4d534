"""An incremental fetch's response (KIP-227 fetch sessions) leaves out every
partition without news and without error, so a partition it asked for and
was not answered was read without error (``detectors.requests._omitted_error``).
The entries are Kafka 4.4.0 brokers' own (``incremental-fetches.log``, written
by tests/data/make_kafka_samples.py): before this was read so, each such
partition counted as unverified, *partition has no response entry*.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from detectors.errors import KafkaError
from detectors.requests import FETCH, partition_outcomes
from detectors.rules.fetch import judged

REAL = Path(__file__).resolve().parents[1] / "data" / "native" / "kafka-4.4.0-cluster"


def entries() -> list[dict[str, Any]]:
    out = []
    for line in (REAL / "incremental-fetches.log").read_text().splitlines():
        out.append(
            json.loads(line[line.index("Completed request:") + len("Completed request:") : line.rindex(" (")])
        )
    return out


def omitted(body: dict[str, Any]) -> set[tuple[str, int]]:
    asked = {(t["topicId"], p["partition"]) for t in body["request"]["topics"] for p in t["partitions"]}
    answered = {
        (t["topicId"], p["partitionIndex"]) for t in body["response"]["responses"] for p in t["partitions"]
    }
    return asked - answered


def test_the_real_samples_are_incremental_fetches_with_a_partition_left_out():
    bodies = entries()
    assert bodies
    for body in bodies:
        assert body["request"]["sessionEpoch"] > 0 and omitted(body)


@pytest.mark.parametrize("index", range(3))
def test_a_partition_left_out_of_an_incremental_response_was_read_without_error(index: int):
    bodies = entries()
    if index >= len(bodies):
        pytest.skip(f"{len(bodies)} sample(s)")
    body = bodies[index]
    outcomes = partition_outcomes(FETCH, body)
    left_out = omitted(body)
    for outcome in outcomes:
        if (outcome.topic_id, outcome.partition) in left_out:
            assert outcome.error == KafkaError.NONE
    # Judged at the epoch it was read at, not set aside as unverified.
    assert all(o.error is not None for o in judged(outcomes))


@pytest.mark.parametrize(
    ("change", "why"),
    [
        (lambda b: b["response"].update(errorCode=70), "the response failed as a whole"),
        (lambda b: b["response"].update(throttleTimeMs=100), "a throttled response is sent empty"),
        (lambda b: b["request"].update(sessionEpoch=0), "a full fetch answers every partition"),
        (lambda b: b["request"].update(sessionEpoch=-1), "a sessionless fetch answers every partition"),
    ],
)
def test_otherwise_a_partition_without_a_response_entry_stays_unknown(change, why):
    body = copy.deepcopy(entries()[0])
    change(body)
    left_out = omitted(body)
    outcomes = partition_outcomes(FETCH, body)
    assert [o.error for o in outcomes if (o.topic_id, o.partition) in left_out] == [None] * len(left_out), why
