"""Manual review: the tasks whose submission outcome is unknown, and the three decisions.

*Mark succeeded* takes the result found upstream (JSON), *mark failed* takes the reason as the
error, and *resubmit* makes the upstream call again, so it asks for an explicit confirmation
that the work may run upstream twice. Each is :meth:`Engine.resolve
<engine.service.engine.Engine.resolve>`, recorded as an event with who and why.
"""

from __future__ import annotations

import json
from typing import Final

from starlette.datastructures import FormData
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from engine.errors import EngineError
from engine.web.common import WebContext, actor_of, field, guarded, parse_uuid, see_other
from engine.web.reads import Cursor, manual_review_page

__all__ = ["routes"]

_PAGE_SIZE: Final = 25


def routes(ctx: WebContext) -> list[Route]:
    """``GET /review`` and ``POST /review/{task_id}``."""
    eng = ctx.engine

    async def page(request: Request) -> Response:
        cursor = Cursor.parse(request.query_params.get("after"))
        tasks = await manual_review_page(eng, cursor, _PAGE_SIZE)
        following = Cursor.after(tasks, _PAGE_SIZE)
        return ctx.render(
            request,
            "review.html",
            tasks=tasks,
            next_after=following.text() if following else None,
            paged=cursor is not None,
        )

    async def decide(request: Request, form: FormData) -> Response:
        task_id = parse_uuid(request.path_params["task_id"])
        back = field(form, "back") if field(form, "back").startswith("/") else "/review"
        if task_id is None:
            return see_other(back, "no such task")
        decision = field(form, "decision")
        reason = field(form, "reason")
        actor = actor_of(request, form)
        if not reason or not actor:
            return see_other(back, f"{task_id}: give your name and a reason")
        result = None
        if decision == "succeeded":
            try:
                result = json.loads(field(form, "result") or "null")
            except json.JSONDecodeError as exc:
                return see_other(back, f"{task_id}: the result is not valid JSON: {exc}")
        elif decision == "resubmit" and field(form, "may_run_twice") != "yes":
            return see_other(
                back, f"{task_id}: confirm that resubmitting may run the task upstream twice"
            )
        elif decision not in ("failed", "resubmit"):
            return see_other(back, f"{task_id}: choose a decision")
        try:
            task = await eng.resolve(
                task_id,
                succeeded=decision == "succeeded",
                result=result,
                failed=decision == "failed",
                resubmit=decision == "resubmit",
                reason=reason,
                actor=actor,
            )
        except (EngineError, ValueError) as exc:
            return see_other(back, f"{task_id}: {exc}")
        done = "resubmitted" if decision == "resubmit" else f"marked {task.status.value}"
        return see_other(back, f"{task_id}: {done}")

    return [
        Route("/review", page, methods=["GET"]),
        Route("/review/{task_id}", guarded(decide), methods=["POST"]),
    ]
