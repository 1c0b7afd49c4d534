"""The one-pass readers of a request body (detectors.requests: ``header``,
``partition_outcomes``) read exactly what the checked readers read: the same
header and outcomes for a body those accept, the same BadRecord for one they
refuse, whatever value sits in any field."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from detectors.envelope import BadRecord
from detectors.requests import (
    _SHAPES,
    FETCH,
    LIST_OFFSETS,
    OFFSET_FOR_LEADER_EPOCH,
    PRODUCE,
    _checked_header,
    _checked_outcomes,
    _omitted_error,
    header,
    partition_outcomes,
)

plain_int = st.integers(-5, 40)
MISSING = object()  # a key left out


@st.composite
def clean_bodies(draw: st.DrawFn, api_key: int) -> dict[str, Any]:
    """A well-formed body of ``api_key``: topics named every way Kafka's
    schemas name them, each with a few partitions, with or without a response."""
    shape = _SHAPES[api_key]

    def topics(topics_key: str, parts_key: str, index_key: str, field: str) -> list[dict[str, Any]]:
        out = []
        for _ in range(draw(st.integers(0, 2))):
            named = draw(st.sampled_from(["name", "topic", "topicName", "topicId", "both"]))
            topic: dict[str, Any] = {}
            if named in ("name", "topic", "topicName", "both"):
                topic["name" if named == "both" else named] = draw(st.sampled_from(["a", "b"]))
            if named in ("topicId", "both"):
                topic["topicId"] = draw(st.sampled_from(["id-a", "id-b"]))
            topic[parts_key] = [
                {index_key: draw(plain_int), field: draw(plain_int)} for _ in range(draw(st.integers(0, 3)))
            ]
            out.append(topic)
        return out

    body: dict[str, Any] = {
        "request": {
            shape.req_topics: topics(shape.req_topics, shape.req_parts, shape.req_index, "currentLeaderEpoch")
        }
    }
    if draw(st.booleans()):
        body["response"] = {
            shape.resp_topics: topics(shape.resp_topics, shape.resp_parts, shape.resp_index, "errorCode"),
            "errorCode": draw(plain_int),
        }
    return body


def places(obj: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every place in a JSON value: each key of an object, each element of a list."""
    out = []
    if isinstance(obj, dict):
        for key, value in obj.items():
            out.append((*path, key))
            out.extend(places(value, (*path, key)))
    elif isinstance(obj, list):
        for i, value in enumerate(obj):
            out.append((*path, i))
            out.extend(places(value, (*path, i)))
    return out


# What a spoiled place gets: the values a reader may take for an integer or a
# name by mistake (a bool is an int to isinstance), and the limits of Kafka's types.
TRICKY = [True, False, 1.0, "1", None, [], {}, 2**15, -(2**15) - 1, 2**31, -(2**31) - 1, 2**63]


@st.composite
def bodies(draw: st.DrawFn, api_key: int) -> dict[str, Any]:
    """A well-formed body with one place spoiled (a tricky value put there,
    or the key taken out), so each of the one-pass reader's checks is put to
    the test on its own, not hidden behind another failure."""
    body = draw(clean_bodies(api_key))
    where = places(body)
    if not where:
        return body
    place: tuple[Any, ...] = draw(st.sampled_from(where))
    *parent_path, last = place
    parent: Any = body
    for step in parent_path:
        parent = parent[step]
    value = draw(st.sampled_from([*TRICKY, MISSING]))
    if value is MISSING and isinstance(parent, dict):
        del parent[last]
    else:
        parent[last] = None if value is MISSING else value
    return body


def outcome_of(read: Any, *args: Any) -> Any:
    try:
        return read(*args)
    except BadRecord as exc:
        return ("BadRecord", exc.reason, exc.kind)


@settings(max_examples=600, deadline=None)
@given(data=st.data(), api_key=st.sampled_from([PRODUCE, FETCH, LIST_OFFSETS, OFFSET_FOR_LEADER_EPOCH]))
def test_partition_outcomes_read_what_the_checked_reader_reads(data, api_key):
    body = data.draw(bodies(api_key))
    omitted = _omitted_error(body) if api_key == FETCH else None
    assert outcome_of(partition_outcomes, api_key, body) == outcome_of(
        _checked_outcomes, _SHAPES[api_key], body, omitted
    )


@settings(max_examples=400, deadline=None)
@given(
    clean=st.fixed_dictionaries(
        {
            "requestApiKey": st.integers(0, 200),
            "requestApiVersion": st.integers(-(2**15), 2**15 - 1),
            "correlationId": st.integers(-(2**31), 2**31 - 1),
            "clientId": st.one_of(st.none(), st.text(max_size=3)),
        }
    ),
    spoiled=st.sampled_from(["requestApiKey", "requestApiVersion", "correlationId", "clientId", "", "*"]),
    value=st.sampled_from([*TRICKY, 201, -1, MISSING]),
)
def test_header_reads_what_the_checked_reader_reads(clean, spoiled, value):
    """A well-formed header with one field spoiled ("": none; "*": the header itself)."""
    fields = dict(clean)
    if spoiled in fields:
        if value is MISSING:
            del fields[spoiled]
        else:
            fields[spoiled] = value
    body = {"requestHeader": (None if value is MISSING else value) if spoiled == "*" else fields}
    assert outcome_of(header, body) == outcome_of(_checked_header, body)
