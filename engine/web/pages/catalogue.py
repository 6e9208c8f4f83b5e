"""Models and groups: limits, rates, enabled, slots in use and waiting, edited in place."""

from __future__ import annotations

from typing import Any, Final

from starlette.datastructures import FormData
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from engine.db.sqlfiles import QUERIES
from engine.web.common import WebContext, field, guarded, see_other
from engine.web.reads import scope_usage

__all__ = ["parse_limits", "routes"]

_MODEL_LIST: Final = QUERIES["model_list"]
_GROUP_LIST: Final = QUERIES["group_list"]


def parse_limits(form: FormData) -> tuple[int | None, int | None, float, bool]:
    """``(concurrency_limit, rate_limit, rate_interval, enabled)`` from an edit form; an empty
    limit is none.

    Raises:
        ValueError: a limit that is not a whole number >= 1, or an interval that is not > 0.
    """

    def whole(name: str) -> int | None:
        text = field(form, name)
        if not text:
            return None
        value = int(text)
        if value < 1:
            raise ValueError(f"{name.replace('_', ' ')} must be at least 1, or empty for none")
        return value

    interval_text = field(form, "rate_interval") or "1"
    interval = float(interval_text)
    if not 0 < interval < float("inf"):
        raise ValueError("rate interval must be a positive number of seconds")
    return whole("concurrency_limit"), whole("rate_limit"), interval, field(form, "enabled") == "on"


def _rows(records: list[Any], key: str, kind: str, usage: dict[str, tuple[int, int]]) -> list[Any]:
    out = []
    for r in records:
        used, waiting = usage.get(f"{kind}:{r[key]}", (0, 0))
        out.append({"row": r, "key": r[key], "used": used, "waiting": waiting})
    return out


def routes(ctx: WebContext) -> list[Route]:
    """``GET /models`` and the two edit forms."""
    eng = ctx.engine

    async def page(request: Request) -> Response:
        usage = await scope_usage(eng)
        models = _rows(await eng.db.coordination.fetch(_MODEL_LIST), "name", "model", usage)
        groups = _rows(await eng.db.coordination.fetch(_GROUP_LIST), "key", "group", usage)
        return ctx.render(request, "models.html", models=models, groups=groups)

    async def edit_model(request: Request, form: FormData) -> Response:
        name = request.path_params["name"]
        current = {r["name"]: r for r in await eng.db.coordination.fetch(_MODEL_LIST)}.get(name)
        if current is None:
            return see_other("/models", f"no model {name}")
        try:
            limit, rate, interval, enabled = parse_limits(form)
        except ValueError as exc:
            return see_other("/models", f"model {name}: {exc}")
        await eng.set_model(
            name,
            enabled=enabled,
            concurrency_limit=limit,
            provider=current["provider"],
            settings=current["settings"],
            rate_limit=rate,
            rate_interval=interval,
        )
        return see_other("/models", f"model {name} saved")

    async def edit_group(request: Request, form: FormData) -> Response:
        key = request.path_params["key"]
        known = {r["key"] for r in await eng.db.coordination.fetch(_GROUP_LIST)}
        if key not in known:
            return see_other("/models", f"no group {key}")
        try:
            limit, rate, interval, enabled = parse_limits(form)
        except ValueError as exc:
            return see_other("/models", f"group {key}: {exc}")
        await eng.set_group(
            key, enabled=enabled, concurrency_limit=limit, rate_limit=rate, rate_interval=interval
        )
        return see_other("/models", f"group {key} saved")

    return [
        Route("/models", page, methods=["GET"]),
        Route("/models/{name:path}", guarded(edit_model), methods=["POST"]),
        Route("/groups/{key:path}", guarded(edit_group), methods=["POST"]),
    ]
