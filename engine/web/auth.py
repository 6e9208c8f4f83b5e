"""Who may use the dashboard, and the checks every state change passes.

- **Exposure** (:func:`check_exposure`): on a loopback address the dashboard may run without
  credentials; anywhere else the service refuses to start unless ``dashboard.token`` or
  ``dashboard.username`` and ``dashboard.password`` are set.
- **Authentication** (:func:`authenticate`): ``Authorization: Bearer <token>``, the session
  cookie the sign-in page sets for that token, or HTTP basic auth. Without credentials
  configured, every request is let in, but only with a loopback ``Host`` header, so a page on
  another site cannot reach the dashboard through DNS rebinding.
- **Same origin** (:func:`same_origin`): an unsafe method must come from the dashboard's own
  pages: ``Sec-Fetch-Site`` (when sent) is ``same-origin`` and ``Origin`` (or, without it,
  ``Referer``) names the host the request was sent to.
- **CSRF** (:func:`csrf_ok`): every form carries the token of the ``engine_csrf`` cookie
  (random, ``SameSite=Strict``, ``HttpOnly``), compared in constant time.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import ipaddress
import secrets
from collections.abc import Mapping
from typing import Final
from urllib.parse import urlsplit

import attrs

from engine.errors import ConfigError
from engine.web.config import DashboardConfig

__all__ = [
    "CSRF_COOKIE",
    "CSRF_FIELD",
    "SESSION_COOKIE",
    "Identity",
    "authenticate",
    "check_exposure",
    "csrf_ok",
    "is_loopback",
    "new_csrf_token",
    "same_origin",
    "session_value",
]

CSRF_COOKIE: Final = "engine_csrf"
CSRF_FIELD: Final = "csrf"
SESSION_COOKIE: Final = "engine_session"
_LOOPBACK_NAMES: Final = frozenset({"localhost", "localhost.localdomain", "ip6-localhost"})


@attrs.frozen
class Identity:
    """Who a request comes from: ``name`` is recorded as the actor when it is known."""

    method: str
    """``none`` (loopback without credentials), ``token``, ``session`` or ``basic``."""
    name: str | None = None
    """The basic-auth user name; None for the other methods (the form then names the actor)."""


def is_loopback(host: str) -> bool:
    """True for a loopback address or name (``127.0.0.1``, ``::1``, ``localhost``)."""
    bare = host.strip("[]").lower()
    if bare in _LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(bare).is_loopback
    except ValueError:
        return False


def has_credentials(config: DashboardConfig) -> bool:
    """True when a token or basic-auth credentials are configured."""
    return config.token is not None or (config.username is not None and config.password is not None)


def check_exposure(host: str, config: DashboardConfig) -> None:
    """Refuse a dashboard bound off loopback without credentials.

    Raises:
        ConfigError: ``host`` is not a loopback address and no credentials are configured.
    """
    if is_loopback(host) or has_credentials(config):
        return
    raise ConfigError(
        [
            f"dashboard: metrics.host = {host!r} is not a loopback address and the dashboard "
            "has no access control; set dashboard.token (ENGINE_DASHBOARD_TOKEN), or "
            "dashboard.username and dashboard.password, or dashboard.enabled = false to serve "
            "only /metrics, /healthz and /readyz there"
        ]
    )


def session_value(token: str) -> str:
    """The session cookie's value for ``token``: a keyed digest, so the cookie never holds the
    token itself, and changing the token ends every session."""
    return hmac.new(token.encode(), b"engine-dashboard-session", hashlib.sha256).hexdigest()


def _host_name(host_header: str) -> str:
    if host_header.startswith("["):
        return host_header[1:].partition("]")[0]
    return host_header.rpartition(":")[0] if host_header.count(":") == 1 else host_header


def authenticate(
    config: DashboardConfig, headers: Mapping[str, str], cookies: Mapping[str, str]
) -> Identity | None:
    """Who the request is from, or None when it must be refused (see the module docstring)."""
    if not has_credentials(config):
        host = _host_name(headers.get("host", ""))
        return Identity("none") if is_loopback(host) else None
    authorization = headers.get("authorization", "")
    scheme, _, value = authorization.partition(" ")
    if config.token is not None:
        if scheme.lower() == "bearer" and hmac.compare_digest(
            value.strip().encode(), config.token.encode()
        ):
            return Identity("token")
        cookie = cookies.get(SESSION_COOKIE)
        if cookie and hmac.compare_digest(cookie.encode(), session_value(config.token).encode()):
            return Identity("session")
    if config.username is not None and config.password is not None and scheme.lower() == "basic":
        try:
            user, _, password = base64.b64decode(value.strip()).decode().partition(":")
        except (binascii.Error, UnicodeDecodeError):
            return None
        user_ok = hmac.compare_digest(user.encode(), config.username.encode())
        password_ok = hmac.compare_digest(password.encode(), config.password.encode())
        if user_ok and password_ok:
            return Identity("basic", user)
    return None


def same_origin(headers: Mapping[str, str], scheme: str) -> bool:
    """True when an unsafe request comes from a page of the host it was sent to."""
    site = headers.get("sec-fetch-site")
    if site is not None and site != "same-origin":
        return False
    host = headers.get("host")
    if not host:
        return False
    expected = f"{scheme}://{host}".lower()
    origin = headers.get("origin")
    if origin is None or origin == "null":
        referer = headers.get("referer")
        if not referer:
            return False
        parts = urlsplit(referer)
        origin = f"{parts.scheme}://{parts.netloc}"
    return origin.lower() == expected


def new_csrf_token() -> str:
    """A fresh random CSRF token."""
    return secrets.token_urlsafe(32)


def csrf_ok(cookie: str | None, submitted: str | None) -> bool:
    """True when the form's token matches the cookie's (both present)."""
    if not cookie or not submitted:
        return False
    return hmac.compare_digest(cookie.encode(), submitted.encode())
