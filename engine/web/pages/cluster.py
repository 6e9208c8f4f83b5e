"""Instances (the registry) and queues at the River level: job counts, pause and resume."""

from __future__ import annotations

from typing import Final

from starlette.datastructures import FormData
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from engine.capacity.registry import list_instances
from engine.db.sqlfiles import QUERIES
from engine.queue.states import JobState
from engine.web.common import WebContext, guarded, see_other

__all__ = ["routes"]

_QUEUE_LIST: Final = QUERIES["queue_list"]
_JOBS_SHOWN: Final = 50


def routes(ctx: WebContext) -> list[Route]:
    """``GET /instances``, ``GET /queues`` and the pause and resume forms."""
    eng = ctx.engine

    async def instances(request: Request) -> Response:
        rows = await list_instances(eng.db.coordination)
        return ctx.render(request, "instances.html", instances=rows)

    async def queues(request: Request) -> Response:
        counts = await eng.queue.counts()
        paused = {r["name"]: r["paused_at"] for r in await eng.db.queue.fetch(_QUEUE_LIST)}
        names = sorted({*paused, *counts})
        state = request.query_params.get("state", "")
        chosen = JobState(state) if state in {s.value for s in JobState} else None
        jobs = await eng.queue.list(state=chosen, limit=_JOBS_SHOWN)
        return ctx.render(
            request,
            "queues.html",
            queues=[(n, paused.get(n), counts.get(n, {})) for n in names],
            states=[s.value for s in JobState],
            jobs=jobs,
            state=state,
        )

    async def pause(request: Request, form: FormData) -> Response:
        name = request.path_params["name"]
        await eng.queue.pause(name)
        return see_other("/queues", f"queue {name} paused")

    async def resume(request: Request, form: FormData) -> Response:
        name = request.path_params["name"]
        await eng.queue.resume(name)
        return see_other("/queues", f"queue {name} resumed")

    return [
        Route("/instances", instances, methods=["GET"]),
        Route("/queues", queues, methods=["GET"]),
        Route("/queues/{name}/pause", guarded(pause), methods=["POST"]),
        Route("/queues/{name}/resume", guarded(resume), methods=["POST"]),
    ]
