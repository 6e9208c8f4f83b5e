"""The ASGI application of the process's HTTP server: metrics, health and the dashboard.

``/metrics`` is prometheus_client's own ASGI exposition (content negotiation with OpenMetrics,
gzip, ``name[]`` filtering; ``HEAD`` too); ``/healthz`` answers 200 ``ok`` while the process
runs and its database answers, else 503 ``database unreachable``; ``/readyz`` answers 200
``ready`` while the tree serves and every supervised sibling and condition is up, else 503
``not ready``. These three need no credentials. ``POST /hooks/<task id>`` takes upstreams'
callbacks (:mod:`engine.web.hooks`): authenticated by their signature, never by the
dashboard's credentials. Every other path is the dashboard (when it is on), behind
:class:`Guard`.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final
from urllib.parse import quote

from prometheus_client import make_asgi_app
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse, RedirectResponse, Response
from starlette.routing import BaseRoute, Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from engine.metrics import Metrics
from engine.web.auth import (
    CSRF_COOKIE,
    authenticate,
    has_credentials,
    new_csrf_token,
    same_origin,
)
from engine.web.common import WebContext
from engine.web.config import DashboardConfig

if TYPE_CHECKING:
    # Type-only: the web layer serves the open Engine and sits below engine.service.
    from engine.service.engine import Engine

__all__ = ["Guard", "make_app"]

log = logging.getLogger(__name__)

_STATIC: Final = Path(__file__).parent / "static"
#: Paths that never need credentials.
_TYPES: Final = {
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".txt": "text/plain; charset=utf-8",
}
_OPEN: Final = frozenset({"/metrics", "/healthz", "/readyz"})
#: Upstreams' callbacks: signed, machine to machine (engine.web.hooks); never the guard's.
_HOOKS_PREFIX: Final = "/hooks/"
_SAFE_METHODS: Final = frozenset({"GET", "HEAD"})
_SECURITY_HEADERS: Final = (
    (
        b"content-security-policy",
        b"default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
        b"connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
    ),
    (b"x-content-type-options", b"nosniff"),
    (b"x-frame-options", b"DENY"),
    (b"referrer-policy", b"same-origin"),
    (b"cache-control", b"no-store"),
)


class _MetricsEndpoint:
    """prometheus_client's ASGI app for ``GET`` and ``HEAD``; 405 for other methods."""

    def __init__(self, metrics: Metrics) -> None:
        self._app = make_asgi_app(metrics.registry)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["method"] not in _SAFE_METHODS:
            response: Response = PlainTextResponse(
                "method not allowed\n", status_code=405, headers={"Allow": "GET, HEAD"}
            )
            await response(scope, receive, send)
            return
        await self._app(scope, receive, send)


def _health_routes(
    metrics: Metrics | None, ready: Callable[[], bool], alive: Callable[[], bool]
) -> list[BaseRoute]:
    async def healthz(request: Request) -> Response:
        if alive():
            return PlainTextResponse("ok\n")
        return PlainTextResponse("database unreachable\n", 503)

    async def readyz(request: Request) -> Response:
        try:
            ok = bool(ready())
        except Exception:
            log.exception("readiness check failed", extra={"event": "readiness_check_failed"})
            ok = False
        return PlainTextResponse("ready\n" if ok else "not ready\n", 200 if ok else 503)

    found: list[BaseRoute] = [
        Route("/healthz", healthz, methods=["GET"]),
        Route("/readyz", readyz, methods=["GET"]),
    ]
    if metrics is not None:
        found.append(Route("/metrics", _MetricsEndpoint(metrics)))
    return found


class Guard:
    """ASGI middleware in front of the dashboard: authentication, the same-origin check of
    every unsafe method, the CSRF cookie, and security headers (see :mod:`engine.web.auth`).

    ``/metrics``, ``/healthz``, ``/readyz`` pass through untouched; ``/static/`` and
    ``/login`` need no credentials but get the rest.
    """

    def __init__(self, app: ASGIApp, config: DashboardConfig) -> None:
        """Guard ``app`` with the credentials of ``config``."""
        self.app = app
        self.config = config

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Refuse, or pass the request on with ``state.identity`` and ``state.csrf`` set."""
        if (
            scope["type"] != "http"
            or scope["path"] in _OPEN
            or scope["path"].startswith(_HOOKS_PREFIX)
        ):
            await self.app(scope, receive, send)
            return
        request = Request(scope)
        path = scope["path"]
        identity = authenticate(self.config, request.headers, request.cookies)
        public = path.startswith("/static/") or path == "/login"
        refusal = None
        if identity is None and (not public or not has_credentials(self.config)):
            refusal = self._refuse(request)
        elif scope["method"] not in _SAFE_METHODS and not same_origin(
            request.headers, scope.get("scheme", "http")
        ):
            refusal = PlainTextResponse("cross-origin request refused\n", status_code=403)
        if refusal is not None:
            await refusal(scope, receive, self._secured(send, None))
            return
        csrf = request.cookies.get(CSRF_COOKIE)
        fresh = None if csrf else new_csrf_token()
        state = scope.setdefault("state", {})
        state["identity"] = identity
        state["csrf"] = csrf or fresh
        await self.app(scope, receive, self._secured(send, fresh))

    def _refuse(self, request: Request) -> Response:
        if not has_credentials(self.config):
            return PlainTextResponse(
                "this dashboard answers only to a loopback host name (localhost, 127.0.0.1)\n",
                status_code=403,
            )
        if self.config.token is not None and request.method in _SAFE_METHODS:
            return RedirectResponse(f"/login?next={quote(request.url.path)}", status_code=303)
        headers = {}
        if self.config.username is not None:
            headers["WWW-Authenticate"] = 'Basic realm="engine", charset="UTF-8"'
        return PlainTextResponse("authentication required\n", status_code=401, headers=headers)

    @staticmethod
    def _secured(send: Send, fresh_csrf: str | None) -> Send:
        async def wrapped(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", []))
                present = {name.lower() for name, _ in headers}
                headers += [(n, v) for n, v in _SECURITY_HEADERS if n not in present]
                if fresh_csrf is not None:
                    cookie = f"{CSRF_COOKIE}={fresh_csrf}; Path=/; HttpOnly; SameSite=Strict"
                    headers.append((b"set-cookie", cookie.encode()))
                message = {**message, "headers": headers}
            await send(message)

        return wrapped


def _dashboard_routes(ctx: WebContext) -> list[BaseRoute]:
    from engine.web.pages import catalogue, cluster, login, overview, review, tasks

    found: list[BaseRoute] = []
    for module in (overview, tasks, review, catalogue, cluster, login):
        found += module.routes(ctx)
    found.append(Route("/static/{name}", _static_endpoint(), methods=["GET"]))

    async def no_icon(request: Request) -> Response:
        return Response(status_code=204)  # browsers ask for one; there is none

    found.append(Route("/favicon.ico", no_icon, methods=["GET"]))
    return found


def _static_endpoint() -> Callable[[Request], Awaitable[Response]]:
    """The vendored files, read once: a few small files, served from memory (Starlette's
    ``StaticFiles`` waits on the client's disconnect after the body under trio)."""
    files = {
        path.name: (path.read_bytes(), _TYPES[path.suffix])
        for path in _STATIC.iterdir()
        if path.suffix in _TYPES
    }

    async def endpoint(request: Request) -> Response:
        found = files.get(request.path_params["name"])
        if found is None:
            return PlainTextResponse("not found\n", status_code=404)
        body, media_type = found
        return Response(body, media_type=media_type, headers={"Cache-Control": "max-age=300"})

    return endpoint


def make_app(
    *,
    metrics: Metrics | None,
    ready: Callable[[], bool],
    alive: Callable[[], bool] = lambda: True,
    engine: Engine | None = None,
    dashboard: DashboardConfig | None = None,
    hooks: Engine | None = None,
) -> Any:
    """The application: ``/metrics`` (when ``metrics`` is given), ``/healthz`` (``alive``),
    ``/readyz`` (``ready``), ``POST /hooks/<task id>`` for ``hooks``' tasks (when given), and
    the dashboard when both ``engine`` and ``dashboard`` are given."""
    routes = _health_routes(metrics, ready, alive)
    if hooks is not None:
        from engine.web.hooks import hook_routes

        routes += hook_routes(hooks)
    if engine is not None and dashboard is not None:
        routes += _dashboard_routes(WebContext(engine, dashboard))
        return Guard(Starlette(routes=routes), dashboard)
    return Starlette(routes=routes)
