"""``POST /hooks/<task id>``: upstreams finish their jobs by calling back.

Machine to machine: no dashboard session, cookie or CSRF token is asked for (the route is
outside the dashboard's guard), because the request is authenticated by its signature, which
the task's provider checks (``parse_callback``: for the HTTP kit an HMAC-SHA256 over
``timestamp + "." + body`` with the model's shared secret, within a timestamp tolerance).

=====  ======================================================================================
202    recorded: the callback is stored and the task's execution woken
200    authentic, but the task is already final: nothing changes
400    the body cannot be read (as the provider says)
401    no signature or timestamp, a wrong signature, a timestamp outside the tolerance
404    no such task, a simulation task, or a model that takes no callbacks
409    a replay: this delivery (its signature) was recorded for the task before
413    the body is larger than 1 MiB
503    this instance does not serve the task's model (another may), or the database is away
=====  ======================================================================================

A recorded callback is also a ``task.callback`` event in the task's history.
"""

from __future__ import annotations

import logging
import uuid
from typing import TYPE_CHECKING, Final

from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import BaseRoute, Route

from engine.domain.tasks import TaskEvent
from engine.errors import DatabaseError
from engine.providers.base import Callback, CallbackRefused, callback_poll_interval
from engine.tasks.callbacks import Recorded, record_callback

if TYPE_CHECKING:
    # Type-only: the web layer serves the open Engine and sits below engine.service.
    from engine.service.engine import Engine

__all__ = ["HOOKS_PREFIX", "MAX_CALLBACK_BYTES", "hook_routes"]

log = logging.getLogger(__name__)

#: The path under which callbacks arrive: ``/hooks/<task id>``.
HOOKS_PREFIX: Final = "/hooks/"
#: The largest callback body read.
MAX_CALLBACK_BYTES: Final = 1 << 20


def _answer(status: int, reason: str) -> Response:
    return PlainTextResponse(reason + "\n", status_code=status)


async def _body(request: Request) -> bytes | None:
    """The body, or None when it is larger than :data:`MAX_CALLBACK_BYTES`."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > MAX_CALLBACK_BYTES:
        return None
    body = b""
    async for chunk in request.stream():
        body += chunk
        if len(body) > MAX_CALLBACK_BYTES:
            return None
    return body


def hook_routes(engine: Engine) -> list[BaseRoute]:
    """The callback route of ``engine`` (see the module docstring)."""

    async def hook(request: Request) -> Response:
        try:
            task_id = uuid.UUID(request.path_params["task_id"])
        except ValueError:
            return _answer(404, "no such task")
        body = await _body(request)
        if body is None:
            return _answer(413, f"the callback is larger than {MAX_CALLBACK_BYTES} bytes")
        try:
            task = await engine.store.get(task_id)  # concurrent callbacks share one read
        except DatabaseError:
            return _answer(503, "the database is unavailable; try again")
        if task is None:
            return _answer(404, "no such task")
        if task.simulated:
            return _answer(404, "a simulation task takes no callbacks")
        provider = engine.runner.providers.get(task.model)
        if provider is None:
            return _answer(503, f"model {task.model!r} is not served by this instance")
        if callback_poll_interval(provider) is None:
            return _answer(404, f"model {task.model!r} takes no callbacks")
        try:
            callback: Callback = provider.parse_callback(request.headers, body)  # type: ignore[attr-defined]
        except CallbackRefused as refused:
            log.info(
                "callback refused",
                extra={
                    "event": "callback_refused",
                    "task_id": str(task_id),
                    "status": refused.status,
                    "reason": refused.reason,
                },
            )
            return _answer(refused.status, refused.reason)
        if task.is_final:
            return _answer(200, f"ignored: the task is already {task.status.value}")
        try:
            recorded = await record_callback(engine.db.tasks, task_id, callback)
            if recorded is Recorded.NOT_RECORDED:
                now = await engine.store.get_now(task_id)
        except DatabaseError:
            return _answer(503, "the database is unavailable; try again")
        if recorded is Recorded.NOT_RECORDED:
            if now is None:
                return _answer(404, "no such task")
            if now.is_final:
                return _answer(200, f"ignored: the task is already {now.status.value}")
            return _answer(409, "replayed: this callback was received before")
        engine.event_writer.emit(
            TaskEvent(
                task_id,
                "task.callback",
                status=task.status.value,
                phase=None if task.phase is None else task.phase.value,
                message="upstream callback received",
                payload={
                    "done": callback.result.done,
                    "upstream_id": callback.upstream_id,
                    "failed": callback.result.error is not None,
                },
                instance_id=engine.instance_id,
            )
        )
        return _answer(202, "recorded")

    return [Route(HOOKS_PREFIX + "{task_id}", hook, methods=["POST"])]
