"""The overview: tasks by status and model, throughput, queues, admissions, capacity, leader.

The live part is a fragment (``/fragments/overview``) that htmx reloads every few seconds.
"""

from __future__ import annotations

from typing import Any, Final

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from engine.capacity.registry import list_instances, load_capacity
from engine.db.sqlfiles import QUERIES
from engine.domain.tasks import TaskStatus
from engine.queue.states import JobState
from engine.web.common import WebContext
from engine.web.reads import live_by_model, scope_usage, throughput

__all__ = ["overview_values", "routes"]

_LEADER_GET: Final = QUERIES["leader_get"]


async def overview_values(ctx: WebContext) -> dict[str, Any]:
    """Everything the overview shows, read now."""
    eng = ctx.engine
    counts = await eng.counts()
    instances = await list_instances(eng.db.coordination)
    pressure: dict[str, int] = {}
    for info in instances:
        pressure[info.pressure_state] = pressure.get(info.pressure_state, 0) + 1
    minutes = await throughput(eng)
    usage = await scope_usage(eng)
    return {
        "statuses": [(s.value, counts.get(s.value, 0)) for s in TaskStatus],
        "by_model": await live_by_model(eng),
        "minutes": minutes,
        "peak": max([m["total"] for m in minutes] or [1]),
        "queues": await eng.queue.counts(),
        "job_states": [s.value for s in JobState],
        "waiting": {scope: w for scope, (_, w) in usage.items() if w},
        "capacity": await load_capacity(eng.db.coordination, eng.config.worker.hard_limit),
        "leader": await eng.db.queue.fetchrow(_LEADER_GET),
        "instances": len(instances),
        "pressure": sorted(pressure.items()),
    }


def routes(ctx: WebContext) -> list[Route]:
    """``GET /`` and ``GET /fragments/overview``."""

    async def page(request: Request) -> Response:
        return ctx.render(request, "overview.html", **await overview_values(ctx))

    async def fragment(request: Request) -> Response:
        return ctx.render(request, "_overview.html", **await overview_values(ctx))

    return [
        Route("/", page, methods=["GET"]),
        Route("/fragments/overview", fragment, methods=["GET"]),
    ]
