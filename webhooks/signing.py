"""Versioned HMAC-SHA256 request signatures, shared by the sender and the receiver.

Scheme ``v1``. A signed request carries three headers::

    X-Fencewatch-Timestamp: 1763720000                   Unix seconds, 1 to 12 ASCII digits
    X-Fencewatch-Alert-Id:  3f9c0a7d51e2b4c86a10      1 to 128 of A-Z a-z 0-9 . _ -
    X-Fencewatch-Signature: v1=<64 hex digits>

and the signature is the lowercase hex HMAC-SHA256, keyed with the shared
secret, of the bytes::

    b"v1:" + timestamp + b":" + alert_id + b":" + body

with ``timestamp`` and ``alert_id`` exactly as sent in their headers and
``body`` the raw request body. Neither header may hold ``:``, so the string
splits one way only: a signature over one (timestamp, alert id, body) verifies
no other. Signing the timestamp bounds how long a captured request can be
replayed; signing the alert id stops it being replayed under a new id, which a
receiver that de-duplicates by id would record again.

The signature header is a comma-separated list of ``scheme=value`` entries, as
Stripe's is, so that a sender can move to a new scheme (or sign with an old
and a new secret during a rotation) without breaking receivers: a receiver
accepts the request when any entry of a scheme it knows verifies, and answers
400 naming the schemes when it knows none of them.
"""

from __future__ import annotations

import hashlib
import hmac
import re
from dataclasses import dataclass

TIMESTAMP_HEADER = "X-Fencewatch-Timestamp"
SIGNATURE_HEADER = "X-Fencewatch-Signature"
ALERT_ID_HEADER = "X-Fencewatch-Alert-Id"
SCHEME = "v1"

# Twelve digits reach the year 33658; a longer "timestamp" is an attack or a bug,
# and bounding it keeps the arithmetic on it exact and cheap.
_TIMESTAMP = re.compile(r"[0-9]{1,12}")
_ALERT_ID = re.compile(r"[A-Za-z0-9._-]{1,128}")
_ENTRY = re.compile(r"([a-z0-9]{1,16})=([^,]*)")
_HEX_DIGEST = re.compile(r"[0-9a-fA-F]{64}")


class MalformedHeader(ValueError):
    """A signing header that cannot be read; ``str()`` is a one-line reason."""


@dataclass(frozen=True)
class Rejection:
    """Why a request is refused: ``status`` 400 (a header cannot be read) or
    401 (unsigned, or the signature does not prove the request authentic)."""

    status: int
    reason: str


def string_to_sign(timestamp: str, alert_id: str, body: bytes) -> bytes:
    """The bytes a ``v1`` signature covers."""
    return f"{SCHEME}:{timestamp}:{alert_id}:".encode("ascii") + body


def signature(secret: bytes, timestamp_seconds: int, alert_id: str, body: bytes) -> str:
    """The ``X-Fencewatch-Signature`` value for ``body`` about ``alert_id`` sent at ``timestamp_seconds``."""
    timestamp = str(timestamp_seconds)
    check_timestamp(timestamp)
    check_alert_id(alert_id)
    return f"{SCHEME}={_digest(secret, timestamp, alert_id, body)}"


def sign(secret: bytes, timestamp_seconds: int, alert_id: str, body: bytes) -> dict[str, str]:
    """The three signing headers: timestamp, alert id and signature."""
    return {
        TIMESTAMP_HEADER: str(timestamp_seconds),
        ALERT_ID_HEADER: alert_id,
        SIGNATURE_HEADER: signature(secret, timestamp_seconds, alert_id, body),
    }


def check_timestamp(text: str) -> int:
    """``X-Fencewatch-Timestamp`` as Unix seconds; MalformedHeader if it is not 1-12 ASCII digits."""
    if not _TIMESTAMP.fullmatch(text):
        raise MalformedHeader(
            f"{TIMESTAMP_HEADER} must be whole Unix seconds, 1 to 12 ASCII digits (got {_describe(text)})"
        )
    return int(text)


def check_alert_id(text: str) -> str:
    """``X-Fencewatch-Alert-Id`` unchanged; MalformedHeader if it is not 1-128 of A-Z a-z 0-9 . _ -."""
    if not _ALERT_ID.fullmatch(text):
        raise MalformedHeader(
            f"{ALERT_ID_HEADER} must be 1 to 128 of A-Z a-z 0-9 . _ - (got {_describe(text)})"
        )
    return text


def v1_signatures(header: str) -> list[str]:
    """The ``v1`` digests (lowercase hex) listed in an ``X-Fencewatch-Signature`` value.

    MalformedHeader if the value is not ``scheme=value`` entries, if a ``v1``
    entry is not 64 hex digits, or if no entry is ``v1``.
    """
    entries = [entry.strip() for entry in header.split(",")]
    parsed = [_ENTRY.fullmatch(entry) for entry in entries]
    if not all(parsed):
        raise MalformedHeader(
            f"{SIGNATURE_HEADER} must be scheme=hex entries such as {SCHEME}=<64 hex digits> "
            f"(got {_describe(header)})"
        )
    pairs = [(match.group(1), match.group(2)) for match in parsed if match]
    digests = [value for scheme, value in pairs if scheme == SCHEME]
    if not digests:
        schemes = sorted({scheme for scheme, _ in pairs})
        named = ", ".join(schemes[:3]) + (f" and {len(schemes) - 3} more" if len(schemes) > 3 else "")
        raise MalformedHeader(f"unknown signature scheme {named}: this receiver verifies {SCHEME}")
    if not all(_HEX_DIGEST.fullmatch(digest) for digest in digests):
        raise MalformedHeader(f"a {SCHEME} signature must be 64 hex digits")
    return [digest.lower() for digest in digests]


def verify(
    secret: bytes,
    timestamp: str | None,
    alert_id: str | None,
    given: str | None,
    body: bytes,
    now_seconds: float,
    max_skew_seconds: float | None = 300.0,
) -> Rejection | None:
    """Why a request with these header values (None: absent) is refused, or None when
    its signature proves it authentic and recent.

    ``max_skew_seconds`` bounds how far the timestamp may be from ``now_seconds``
    (None: any). The digests are compared in constant time.
    """
    if given is None:
        return Rejection(401, f"unsigned: {SIGNATURE_HEADER} is required")
    try:
        if timestamp is None or alert_id is None:
            missing = TIMESTAMP_HEADER if timestamp is None else ALERT_ID_HEADER
            raise MalformedHeader(f"a signed request needs {missing}")
        seconds = check_timestamp(timestamp)
        check_alert_id(alert_id)
        digests = v1_signatures(given)
    except MalformedHeader as exc:
        return Rejection(400, str(exc))
    expected = _digest(secret, timestamp, alert_id, body)
    # Every listed digest is compared, so the time taken says nothing about which matched.
    matches = [hmac.compare_digest(expected, digest) for digest in digests]
    if not any(matches):
        return Rejection(401, "signature does not match (another secret, or the timestamp, alert id or body)")
    skew = now_seconds - seconds
    if max_skew_seconds is not None and abs(skew) > max_skew_seconds:
        return Rejection(
            401,
            f"{TIMESTAMP_HEADER} is {abs(skew):.0f} s {'old' if skew > 0 else 'ahead'}, outside the "
            f"{max_skew_seconds:g} s window (a replayed request, or a clock that is off)",
        )
    return None


def _digest(secret: bytes, timestamp: str, alert_id: str, body: bytes) -> str:
    return hmac.new(secret, string_to_sign(timestamp, alert_id, body), hashlib.sha256).hexdigest()


def _describe(text: str) -> str:
    """A header value for an error line: itself when short and printable, else its length."""
    if len(text) <= 24 and text.isascii() and text.isprintable():
        return repr(text)
    return f"{len(text)} characters"
