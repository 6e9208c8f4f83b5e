"""Tasks: the filtered, cursor-paged list with bulk retry and cancel, and one task's detail."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from typing import Any, Final

from starlette.datastructures import FormData
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from engine.domain.tasks import Task, TaskEvent, TaskStatus
from engine.errors import EngineError, TaskError
from engine.web.common import WebContext, field, guarded, parse_uuid, see_other
from engine.web.reads import Cursor, TaskFilter, find_by_upstream_ref, task_page

__all__ = ["phase_times", "routes"]

_PAGE_SIZE: Final = 50
#: How far back an upstream-reference lookup looks when the filter gives no start.
_REF_WINDOW: Final = timedelta(days=7)
_FILTER_KEYS: Final = ("status", "model", "tenant", "group", "since", "until")
_RETRYABLE: Final = frozenset({TaskStatus.FAILED, TaskStatus.CANCELLED})


def _time(text: str) -> datetime | None:
    """A ``datetime-local`` or ISO value, read as UTC when it names no offset."""
    if not text:
        return None
    try:
        value = datetime.fromisoformat(text)
    except ValueError:
        return None
    return value if value.tzinfo else value.replace(tzinfo=UTC)


def _filters(request: Request) -> tuple[TaskFilter, dict[str, str]]:
    q = request.query_params
    raw = {k: q.get(k, "").strip() for k in _FILTER_KEYS}
    status = raw["status"] if raw["status"] in {s.value for s in TaskStatus} else None
    return (
        TaskFilter(
            status=status,
            model=raw["model"] or None,
            tenant_id=raw["tenant"] or None,
            group_key=raw["group"] or None,
            since=_time(raw["since"]),
            until=_time(raw["until"]),
        ),
        raw,
    )


def phase_times(task: Task, events: list[TaskEvent]) -> tuple[list[dict[str, Any]], list[Any]]:
    """The timeline (each event with the time until the next one) and the time per phase.

    An interval belongs to the phase (or, without one, the status) its opening event names;
    the last one runs to the task's end, or to now while it is live.
    """
    # By time, not by id: events are written in batches, so one may land after a later one.
    events = sorted(events, key=lambda e: (e.at is None, e.at))
    end = task.finished_at or datetime.now(UTC)
    rows: list[dict[str, Any]] = []
    totals: dict[str, float] = {}
    for i, event in enumerate(events):
        nxt = events[i + 1].at if i + 1 < len(events) else end
        spent = None
        if event.at is not None and nxt is not None:
            spent = max(0.0, (nxt - event.at).total_seconds())
            label = event.phase or event.status or event.type
            totals[label] = totals.get(label, 0.0) + spent
        rows.append({"event": event, "spent": spent})
    return rows, sorted(totals.items(), key=lambda kv: -kv[1])


def routes(ctx: WebContext) -> list[Route]:
    """The tasks list, its bulk actions, and the detail page with retry and cancel."""
    eng = ctx.engine

    async def list_page(request: Request) -> Response:
        filters, raw = _filters(request)
        lookup = request.query_params.get("q", "").strip()
        cursor = Cursor.parse(request.query_params.get("after"))
        if lookup:
            task_id = parse_uuid(lookup)
            if task_id is not None and await eng.get(task_id) is not None:
                return see_other(f"/tasks/{task_id}")
            since = filters.since or datetime.now(UTC) - _REF_WINDOW
            tasks = await find_by_upstream_ref(eng, lookup, since)
            following = None
        else:
            tasks = await task_page(eng, filters, cursor, _PAGE_SIZE)
            following = Cursor.after(tasks, _PAGE_SIZE)
        query = {k: v for k, v in raw.items() if v}
        return ctx.render(
            request,
            "tasks.html",
            tasks=tasks,
            raw=raw,
            lookup=lookup,
            statuses=[s.value for s in TaskStatus],
            next_query={**query, "after": following.text()} if following else None,
            first_query=query if cursor else None,
        )

    async def detail(request: Request) -> Response:
        task_id = parse_uuid(request.path_params["task_id"])
        task = None if task_id is None else await eng.get(task_id)
        if task is None or task_id is None:
            return ctx.render(request, "missing.html", status=404, what="task")
        events = await eng.events(task_id)
        timeline, phases = phase_times(task, events)
        job = None if task.river_job_id is None else await eng.queue.get(task.river_job_id)
        return ctx.render(
            request,
            "task.html",
            task=task,
            timeline=timeline,
            phases=phases,
            job=job,
            retryable=task.status in _RETRYABLE,
            cancellable=not task.is_final,
        )

    async def retry_one(task_id: uuid.UUID) -> str:
        task = await eng.get(task_id)
        if task is not None and task.status is TaskStatus.MANUAL_REVIEW:
            return f"{task_id}: in manual review; decide it on the review page"
        try:
            retried = await eng.retry(task_id)
        except TaskError as exc:
            return str(exc)
        return f"{task_id}: queued again (job {retried.river_job_id})"

    async def cancel_one(task_id: uuid.UUID) -> str:
        try:
            task = await eng.cancel(task_id)
        except EngineError as exc:
            return str(exc)
        return f"{task_id}: {task.status.value}"

    async def bulk(request: Request, form: FormData) -> Response:
        action = field(form, "action")
        ids = [parse_uuid(v) for v in form.getlist("ids") if isinstance(v, str)]
        chosen = [i for i in ids if i is not None]
        if action not in ("retry", "cancel") or not chosen:
            return see_other("/tasks", "choose tasks and an action")
        run = retry_one if action == "retry" else cancel_one
        outcomes = [await run(task_id) for task_id in chosen]
        return see_other("/tasks", f"{action}: " + "; ".join(outcomes))

    async def retry(request: Request, form: FormData) -> Response:
        task_id = parse_uuid(request.path_params["task_id"])
        if task_id is None:
            return see_other("/tasks", "no such task")
        return see_other(f"/tasks/{task_id}", await retry_one(task_id))

    async def cancel(request: Request, form: FormData) -> Response:
        task_id = parse_uuid(request.path_params["task_id"])
        if task_id is None:
            return see_other("/tasks", "no such task")
        return see_other(f"/tasks/{task_id}", await cancel_one(task_id))

    return [
        Route("/tasks", list_page, methods=["GET"]),
        Route("/tasks/bulk", guarded(bulk), methods=["POST"]),
        Route("/tasks/{task_id}", detail, methods=["GET"]),
        Route("/tasks/{task_id}/retry", guarded(retry), methods=["POST"]),
        Route("/tasks/{task_id}/cancel", guarded(cancel), methods=["POST"]),
    ]
