"""HMAC-SHA256 request signatures, shared by the sender and the receiver.

The signed message is ``f"{timestamp}.".encode() + body``, with ``timestamp``
the Unix seconds sent in ``X-Fencewatch-Timestamp``; the signature is sent as
``X-Fencewatch-Signature: sha256=<hex>``. Signing the timestamp lets a receiver
refuse old requests replayed by someone who captured one.
"""

from __future__ import annotations

import hashlib
import hmac

TIMESTAMP_HEADER = "X-Fencewatch-Timestamp"
SIGNATURE_HEADER = "X-Fencewatch-Signature"
ALERT_ID_HEADER = "X-Fencewatch-Alert-Id"
PREFIX = "sha256="


def signature(secret: bytes, timestamp_seconds: int, body: bytes) -> str:
    """The ``X-Fencewatch-Signature`` value for ``body`` sent at ``timestamp_seconds``."""
    digest = hmac.new(secret, f"{timestamp_seconds}.".encode() + body, hashlib.sha256).hexdigest()
    return PREFIX + digest


def sign(secret: bytes, timestamp_seconds: int, body: bytes) -> dict[str, str]:
    """The two signature headers."""
    return {
        TIMESTAMP_HEADER: str(timestamp_seconds),
        SIGNATURE_HEADER: signature(secret, timestamp_seconds, body),
    }


def verify(
    secret: bytes,
    timestamp: str | None,
    given: str | None,
    body: bytes,
    now_seconds: float,
    max_skew_seconds: float | None = 300.0,
) -> str | None:
    """Why the signature is not acceptable, or None when it is.

    ``max_skew_seconds`` bounds how far the timestamp may be from ``now_seconds``
    (None: any). The comparison takes constant time.
    """
    if not timestamp or not given:
        return f"missing {TIMESTAMP_HEADER} or {SIGNATURE_HEADER}"
    try:
        ts = int(timestamp)
    except ValueError:
        return f"{TIMESTAMP_HEADER} is not whole Unix seconds"
    if max_skew_seconds is not None and abs(now_seconds - ts) > max_skew_seconds:
        return f"{TIMESTAMP_HEADER} is more than {max_skew_seconds:g} s from now"
    if not hmac.compare_digest(signature(secret, ts, body).encode(), given.encode()):
        return "signature does not match"
    return None
