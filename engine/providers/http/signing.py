"""Signed callbacks: HMAC-SHA256 over ``timestamp + "." + body``, with a timestamp tolerance.

The upstream sends the Unix time it signed at in one header (``X-Webhook-Timestamp`` by
default) and the hex HMAC-SHA256 of ``f"{timestamp}.".encode() + body`` under the shared
secret in another (``X-Webhook-Signature``; a ``sha256=`` prefix is accepted). Binding the
timestamp into the signature means an old delivery cannot be made fresh; the tolerance refuses
one signed longer ago (or further ahead, a skewed clock) than that many seconds; and a fresh
one sent twice is refused by its delivery key (:func:`delivery_key`), which the engine records.
"""

from __future__ import annotations

import hashlib
import hmac
import math
from collections.abc import Mapping

from engine.providers.base import CallbackRefused

__all__ = ["delivery_key", "sign", "verify"]

_PREFIX = "sha256="


def sign(secret: str, timestamp: str, body: bytes) -> str:
    """The hex signature of ``body`` sent at ``timestamp`` (what an upstream computes)."""
    message = timestamp.encode("ascii") + b"." + body
    return hmac.new(secret.encode(), message, hashlib.sha256).hexdigest()


def delivery_key(signature: str) -> str:
    """The name a delivery is recorded under: a hash of its signature (the signature itself
    is never stored)."""
    return hashlib.sha256(signature.strip().lower().encode("ascii", "replace")).hexdigest()


def _header(headers: Mapping[str, str], name: str) -> str | None:
    value = headers.get(name)
    if value is None:
        value = headers.get(name.lower())
    return value


def verify(
    secret: str,
    headers: Mapping[str, str],
    body: bytes,
    *,
    signature_header: str,
    timestamp_header: str,
    tolerance: float,
    now: float,
) -> str:
    """Check a callback's signature and timestamp; its delivery key when authentic.

    The signature is compared in constant time, and checked before the timestamp, so a
    forger learns nothing about the clock.

    Raises:
        CallbackRefused: (401) a header is missing, the signature is wrong, or the timestamp
            is not a number or outside ``tolerance`` seconds of ``now`` (Unix seconds).
    """
    signature = _header(headers, signature_header)
    timestamp = _header(headers, timestamp_header)
    if not signature:
        raise CallbackRefused(f"no signature: the {signature_header} header is missing")
    if not timestamp:
        raise CallbackRefused(f"no timestamp: the {timestamp_header} header is missing")
    given = signature.strip()
    if given.lower().startswith(_PREFIX):
        given = given[len(_PREFIX) :]
    try:
        expected = sign(secret, timestamp.strip(), body)
    except UnicodeEncodeError:
        raise CallbackRefused("the timestamp is not a number") from None
    if not hmac.compare_digest(expected.encode(), given.lower().encode("ascii", "replace")):
        raise CallbackRefused("bad signature")
    try:
        sent = float(timestamp.strip())
    except ValueError:
        raise CallbackRefused("the timestamp is not a number") from None
    if not math.isfinite(sent):
        raise CallbackRefused("the timestamp is not a number")
    if sent < now - tolerance:
        raise CallbackRefused(f"stale timestamp: signed more than {tolerance:g} s ago")
    if sent > now + tolerance:
        raise CallbackRefused(f"timestamp in the future by more than {tolerance:g} s")
    return delivery_key(given)
