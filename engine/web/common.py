"""What every dashboard page shares: the context, template rendering, guarded forms, actors.

Templates are Jinja2 with autoescaping on for every template, so every value a page shows
(payloads, model names, error messages) is escaped; no template marks a value safe.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final
from urllib.parse import urlencode

import attrs
import jinja2
from starlette.datastructures import FormData
from starlette.requests import Request
from starlette.responses import HTMLResponse, PlainTextResponse, RedirectResponse, Response

from engine.web.auth import CSRF_COOKIE, CSRF_FIELD, Identity, csrf_ok
from engine.web.config import DashboardConfig

if TYPE_CHECKING:
    # Type-only: the web layer serves the open Engine and sits below engine.service.
    from engine.service.engine import Engine

__all__ = [
    "FormHandler",
    "WebContext",
    "actor_of",
    "guarded",
    "make_templates",
    "parse_uuid",
    "see_other",
]

_TEMPLATES: Final = Path(__file__).parent / "templates"
#: Bounds on a posted form: the bulk actions post one field per selected task.
_MAX_FIELDS: Final = 1100
_MAX_PART: Final = 1 << 20

#: A handler of a guarded POST: the request and its form, already checked.
FormHandler = Callable[[Request, FormData], Awaitable[Response]]


def _pretty(value: Any) -> str:
    return json.dumps(value, indent=2, ensure_ascii=False, sort_keys=True, default=str)


def _compact(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), default=str)


def _when(value: datetime | None) -> str:
    if value is None:
        return "-"
    return value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S")


def _seconds(value: float | None) -> str:
    if value is None:
        return "-"
    if value < 1:
        return f"{value * 1000:.0f} ms"
    if value < 120:
        return f"{value:.1f} s"
    return f"{value / 60:.1f} min"


def _shorten(value: Any, width: int = 80) -> str:
    text = value if isinstance(value, str) else _compact(value)
    return text if len(text) <= width else text[: width - 1] + "…"


def make_templates() -> jinja2.Environment:
    """The dashboard's template environment: autoescaped, with its filters."""
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(_TEMPLATES),
        autoescape=True,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters.update(
        pretty=_pretty, compact=_compact, when=_when, seconds=_seconds, shorten=_shorten
    )
    env.globals["CSRF_FIELD"] = CSRF_FIELD
    return env


@attrs.define
class WebContext:
    """The open engine and the rendering state every page uses."""

    engine: Engine
    config: DashboardConfig
    templates: jinja2.Environment = attrs.field(factory=make_templates)

    def render(self, request: Request, name: str, status: int = 200, **values: Any) -> Response:
        """Render template ``name`` with ``values`` plus the request's CSRF token and notice."""
        identity: Identity | None = request.state.identity
        page = self.templates.get_template(name).render(
            csrf=request.state.csrf,
            identity=identity,
            notice=request.query_params.get("notice"),
            path=request.url.path,
            **values,
        )
        return HTMLResponse(page, status_code=status)


def see_other(path: str, notice: str | None = None, **query: str) -> RedirectResponse:
    """A 303 redirect back to a page of the dashboard (after a POST), with a notice to show."""
    params = {k: v for k, v in query.items() if v}
    if notice:
        params["notice"] = notice
    return RedirectResponse(path + ("?" + urlencode(params) if params else ""), status_code=303)


def guarded(handler: FormHandler) -> Callable[[Request], Awaitable[Response]]:
    """Wrap a POST handler: the form is read (bounded) and its CSRF token checked first.

    Every state change of the dashboard is registered through this, so none can skip the
    check; the same-origin check happens before, in the guard middleware.
    """

    async def endpoint(request: Request) -> Response:
        form = await request.form(max_files=0, max_fields=_MAX_FIELDS, max_part_size=_MAX_PART)
        submitted = form.get(CSRF_FIELD)
        if not csrf_ok(
            request.cookies.get(CSRF_COOKIE), submitted if isinstance(submitted, str) else None
        ):
            return PlainTextResponse(
                "CSRF token missing or wrong: reload the page and try again\n", status_code=403
            )
        return await handler(request, form)

    return endpoint


def field(form: FormData, name: str) -> str:
    """A text field of ``form``, stripped ('' when absent or a file)."""
    value = form.get(name)
    return value.strip() if isinstance(value, str) else ""


def actor_of(request: Request, form: FormData) -> str:
    """Who makes a change: the basic-auth user, else the form's ``actor`` field, marked as
    coming through the dashboard."""
    identity: Identity | None = request.state.identity
    if identity is not None and identity.name:
        return identity.name
    named = field(form, "actor")
    return named or ""


def parse_uuid(text: str) -> uuid.UUID | None:
    """``text`` as a UUID, or None."""
    try:
        return uuid.UUID(text.strip())
    except ValueError:
        return None
