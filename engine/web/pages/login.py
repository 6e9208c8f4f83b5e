"""Sign-in with the access token (``dashboard.token``): a session cookie then carries it."""

from __future__ import annotations

import hmac

from starlette.datastructures import FormData
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from engine.web.auth import SESSION_COOKIE, session_value
from engine.web.common import WebContext, field, guarded, see_other

__all__ = ["routes"]


def _local(path: str) -> str:
    """``path`` if it is a path of this site, else ``/`` (no open redirect)."""
    return path if path.startswith("/") and not path.startswith("//") else "/"


def routes(ctx: WebContext) -> list[Route]:
    """``GET /login``, ``POST /login`` and ``POST /logout``."""
    token = ctx.config.token

    async def page(request: Request) -> Response:
        return ctx.render(
            request,
            "login.html",
            next=_local(request.query_params.get("next", "/")),
            token_auth=token is not None,
        )

    async def sign_in(request: Request, form: FormData) -> Response:
        given = field(form, "token")
        target = _local(field(form, "next"))
        if token is None or not hmac.compare_digest(given.encode(), token.encode()):
            return see_other("/login", "wrong token", next=target)
        response = see_other(target)
        response.set_cookie(
            SESSION_COOKIE, session_value(token), httponly=True, samesite="strict", path="/"
        )
        return response

    async def sign_out(request: Request, form: FormData) -> Response:
        response = see_other("/login")
        response.delete_cookie(SESSION_COOKIE, path="/")
        return response

    return [
        Route("/login", page, methods=["GET"]),
        Route("/login", guarded(sign_in), methods=["POST"]),
        Route("/logout", guarded(sign_out), methods=["POST"]),
    ]
