"""The ``v1`` webhook signature: the exact bytes it covers, what a receiver
accepts and refuses, and the third-party verifier printed in docs/operations.md."""

from __future__ import annotations

import hashlib
import hmac
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from webhooks.signing import (
    ALERT_ID_HEADER,
    SIGNATURE_HEADER,
    TIMESTAMP_HEADER,
    MalformedHeader,
    Rejection,
    sign,
    signature,
    string_to_sign,
    verify,
)

SECRET = b"signing-test-secret"
BODY = b'{"alert_id": "3f9c0a7d51e2b4c86a10", "rule": "QUORUM_DOUBLE_VOTE"}'
NOW = 1_763_720_000
OPERATIONS = Path(__file__).resolve().parents[2] / "docs" / "operations.md"


def check(headers: dict[str, str], body: bytes = BODY, now: float = NOW, **kwargs: Any) -> Rejection | None:
    return verify(
        SECRET,
        headers.get(TIMESTAMP_HEADER),
        headers.get(ALERT_ID_HEADER),
        headers.get(SIGNATURE_HEADER),
        body,
        now,
        **kwargs,
    )


def test_the_signature_covers_version_timestamp_alert_id_and_body() -> None:
    assert string_to_sign("1763720000", "3f9c0a7d", b"{}") == b"v1:1763720000:3f9c0a7d:{}"
    headers = sign(SECRET, NOW, "3f9c0a7d", BODY)
    independent = hmac.new(SECRET, b"v1:1763720000:3f9c0a7d:" + BODY, hashlib.sha256).hexdigest()
    assert headers == {
        TIMESTAMP_HEADER: "1763720000",
        ALERT_ID_HEADER: "3f9c0a7d",
        SIGNATURE_HEADER: f"v1={independent}",
    }
    assert check(headers) is None


@pytest.mark.parametrize(
    "change",
    [
        {ALERT_ID_HEADER: "3f9c0a7e"},
        {TIMESTAMP_HEADER: str(NOW - 1)},
        {SIGNATURE_HEADER: "v1=" + "0" * 64},
    ],
    ids=["another alert id", "another timestamp", "another digest"],
)
def test_any_changed_part_fails_with_401(change: dict[str, str]) -> None:
    headers = {**sign(SECRET, NOW, "3f9c0a7d", BODY), **change}
    rejection = check(headers)
    assert rejection is not None and rejection.status == 401 and "does not match" in rejection.reason


def test_a_changed_body_or_another_secret_fails_with_401() -> None:
    headers = sign(SECRET, NOW, "3f9c0a7d", BODY)
    for rejection in (
        check(headers, body=BODY + b" "),
        check(sign(b"another-secret", NOW, "3f9c0a7d", BODY)),
    ):
        assert rejection is not None and rejection.status == 401 and "does not match" in rejection.reason


def test_bytes_cannot_move_between_the_alert_id_and_the_body() -> None:
    # With a ':' allowed in the id, ("a:b", "c") and ("a", "b:c") would sign the same bytes.
    with pytest.raises(MalformedHeader, match=ALERT_ID_HEADER):
        sign(SECRET, NOW, "a:b", b"c")
    headers = {**sign(SECRET, NOW, "a", b"b:c"), ALERT_ID_HEADER: "a:b"}
    rejection = check(headers, body=b"c")
    assert rejection is not None and rejection.status == 400


def test_the_window_is_inclusive_and_optional() -> None:
    headers = sign(SECRET, NOW, "x", BODY)
    assert check(headers, now=NOW + 300) is None
    late = check(headers, now=NOW + 301)
    assert late is not None and late.status == 401 and "301 s old" in late.reason
    early = check(headers, now=NOW - 301)
    assert early is not None and "301 s ahead" in early.reason
    assert check(headers, now=NOW + 10**9, max_skew_seconds=None) is None


def test_several_entries_verify_when_any_v1_entry_matches() -> None:
    good = signature(SECRET, NOW, "x", BODY)
    base = sign(SECRET, NOW, "x", BODY)
    for listed in (f"v2=abc, {good}", f"v1={'0' * 64},{good}", good.upper().replace("V1=", "v1=")):
        assert check({**base, SIGNATURE_HEADER: listed}) is None, listed


@pytest.mark.parametrize(
    ("header", "words"),
    [
        ("sha256=" + "0" * 64, "unknown signature scheme sha256: this receiver verifies v1"),
        ("v2=" + "0" * 64 + ",v3=1", "unknown signature scheme v2, v3"),
        ("", "scheme=hex"),
        ("v1", "scheme=hex"),
        ("V1=" + "0" * 64, "scheme=hex"),
        ("v1=xyz", "64 hex digits"),
    ],
)
def test_unreadable_or_unknown_signatures_get_400(header: str, words: str) -> None:
    rejection = check({**sign(SECRET, NOW, "x", BODY), SIGNATURE_HEADER: header})
    assert rejection is not None and rejection.status == 400 and words in rejection.reason


def test_an_unsigned_request_gets_401_whatever_else_it_carries() -> None:
    headers = {k: v for k, v in sign(SECRET, NOW, "x", BODY).items() if k != SIGNATURE_HEADER}
    assert check(headers) == Rejection(401, f"unsigned: {SIGNATURE_HEADER} is required")
    assert check({TIMESTAMP_HEADER: "9" * 401}) == Rejection(401, f"unsigned: {SIGNATURE_HEADER} is required")


@pytest.mark.parametrize("timestamp", ["9" * 13, "9" * 401, "-1", "+1763720000", "1e9", " 1763720000", "١٢٣"])
def test_timestamps_that_are_not_1_to_12_ascii_digits_get_400(timestamp: str) -> None:
    rejection = check({**sign(SECRET, NOW, "x", BODY), TIMESTAMP_HEADER: timestamp})
    assert rejection is not None and rejection.status == 400 and "1 to 12 ASCII digits" in rejection.reason


header_text = st.one_of(
    st.none(),
    st.text(max_size=600),
    st.binary(max_size=200).map(lambda raw: raw.decode("utf-8", "surrogateescape")),
)


@given(timestamp=header_text, alert_id=header_text, given_signature=header_text, body=st.binary(max_size=64))
def test_verify_never_raises_and_refuses_what_it_did_not_sign(
    timestamp: str | None, alert_id: str | None, given_signature: str | None, body: bytes
) -> None:
    rejection = verify(SECRET, timestamp, alert_id, given_signature, body, NOW)
    assert rejection is not None and rejection.status in (400, 401)
    assert "\n" not in rejection.reason and len(rejection.reason) < 300


def documented_verifier() -> Callable[..., bool]:
    """The ``verify`` function of the Python block in docs/operations.md, run as printed."""
    text = OPERATIONS.read_text(encoding="utf-8")
    blocks = re.findall(r"```python\n(.*?)```", text, flags=re.DOTALL)
    (source,) = [block for block in blocks if "def verify(" in block and "v1:" in block]
    namespace: dict[str, Any] = {}
    exec(compile(source, str(OPERATIONS), "exec"), namespace)
    return namespace["verify"]  # type: ignore[no-any-return]


def test_the_documented_verifier_accepts_what_fencewatch_signs_and_nothing_else() -> None:
    verify_as_documented = documented_verifier()
    now = int(time.time())
    headers = sign(SECRET, now, "3f9c0a7d51e2b4c86a10", BODY)
    assert verify_as_documented(SECRET, headers, BODY)
    assert not verify_as_documented(SECRET, {**headers, ALERT_ID_HEADER: "3f9c0a7d51e2b4c86a11"}, BODY)
    assert not verify_as_documented(SECRET, headers, BODY + b" ")
    assert not verify_as_documented(b"another-secret", headers, BODY)
    stale = sign(SECRET, now - 3600, "3f9c0a7d51e2b4c86a10", BODY)
    assert not verify_as_documented(SECRET, stale, BODY)
    assert not verify_as_documented(SECRET, {**headers, TIMESTAMP_HEADER: "9" * 401}, BODY)
    assert not verify_as_documented(SECRET, {**headers, SIGNATURE_HEADER: "v1=\udcff"}, BODY)
