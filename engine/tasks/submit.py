"""Submitting tasks: validate everything first, then store the task and its job atomically.

Validation happens before anything is written, and one bad request rejects the whole call with
an :class:`~engine.errors.InvalidTask` naming every problem, so nothing is half-stored. The task
rows and their jobs are written in one transaction, or in the caller's.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Sequence
from datetime import datetime
from typing import NoReturn

from engine.db.bridge import Connection, Pool
from engine.db.sqlfiles import QUERIES
from engine.domain.tasks import Identity, TaskRequest
from engine.errors import InvalidTask
from engine.queue.config import QueueConfig
from engine.tasks.config import TasksConfig
from engine.tasks.jobs import TaskJob, insert_task_jobs
from engine.tasks.jsoncheck import bad_character, json_problem

__all__ = ["submit_tasks", "validate_requests"]

_MODELS = QUERIES["model_get_many"]
_INSERT = QUERIES["task_insert_many"]

#: The catalogue's limit on model names (engine_model.name).
_MODEL_MAX = 200


def _field_problem(value: object, field: str, limit: int) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str):
        return f"{field} must be text, not {type(value).__name__}"
    if len(value) > limit:
        setting = "" if field == "model" else " (tasks.max_field_length)"
        return f"{field} is {len(value)} characters; the limit is {limit}{setting}"
    bad = bad_character(value)
    return None if bad is None else f"{field} holds {bad}"


def _payload_text(request: TaskRequest, tasks: TasksConfig, problems: list[str], n: int) -> str:
    problem = json_problem(request.payload, tasks.max_payload_depth)
    if problem is not None:
        setting = " (tasks.max_payload_depth)" if "nested" in problem else ""
        problems.append(f"request {n}: payload {problem}{setting}")
        return ""
    try:
        text = json.dumps(request.payload, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError) as exc:
        problems.append(f"request {n}: payload is not JSON ({exc})")
        return ""
    size = len(text.encode())
    if size > tasks.max_payload_bytes:
        problems.append(
            f"request {n}: payload is {size} bytes; the limit is {tasks.max_payload_bytes} "
            "(tasks.max_payload_bytes)"
        )
    return text


def _request_problems(request: TaskRequest, tasks: TasksConfig, n: int) -> list[str]:
    """Everything wrong with one request but its payload and its model's catalogue entry."""
    found: list[str | None] = [_field_problem(request.model, "model", _MODEL_MAX)]
    # Typed, but callers are other people's code: check what the database would refuse.
    identity: object = request.identity
    if not isinstance(identity, Identity):
        return [f"request {n}: identity must be an engine.Identity, not {type(identity).__name__}"]
    for name, value in identity.as_dict().items():
        found.append(_field_problem(value, f"identity.{name}", tasks.max_field_length))
    found.append(_field_problem(request.group_key, "group_key", tasks.max_field_length))
    task_id: object = request.id
    if not isinstance(task_id, uuid.UUID):
        found.append(f"id must be a uuid.UUID, not {type(task_id).__name__}")
    run_at: object = request.run_at
    if run_at is not None and (not isinstance(run_at, datetime) or run_at.utcoffset() is None):
        found.append("run_at must be a timezone-aware datetime")
    problems = [f"request {n}: {p}" for p in found if p is not None]
    if not problems:
        if not (identity.tenant_id or "").strip():
            problems.append(f"request {n}: identity.tenant_id is required")
        if not (identity.user_id or identity.gateway_user_id or "").strip():
            problems.append(f"request {n}: identity needs user_id or gateway_user_id")
    return problems


async def validate_requests(
    catalog: Pool | Connection, requests: Sequence[TaskRequest], tasks: TasksConfig
) -> list[str]:
    """Check every request; return the payload texts, raising InvalidTask on any problem.

    Everything a database would refuse, or that could never run, is caught here, before
    anything is written, as a permanent error: lengths (``tasks.max_field_length``, the
    catalogue's 200 for model names), NUL characters and lone surrogates, payload depth
    (``tasks.max_payload_depth``) and size (``tasks.max_payload_bytes``), ids, ``run_at``.
    """
    problems: list[str] = []
    payloads: list[str] = []
    for n, request in enumerate(requests):
        problems += _request_problems(request, tasks, n)
        payloads.append(_payload_text(request, tasks, problems, n))
    if problems:
        _reject(problems)
    names = sorted({r.model for r in requests})
    rows = {r["name"]: r for r in await catalog.fetch(_MODELS, names)}
    for n, request in enumerate(requests):
        row = rows.get(request.model)
        if row is None:
            problems.append(f"request {n}: unknown model {request.model!r}")
        elif not row["enabled"]:
            problems.append(f"request {n}: model {request.model!r} is disabled")
    if len({r.id for r in requests}) != len(requests):
        problems.append("two requests have the same id")
    if problems:
        _reject(problems)
    return payloads


def _reject(problems: list[str]) -> NoReturn:
    shown = problems[:20] + ([f"... and {len(problems) - 20} more"] if len(problems) > 20 else [])
    raise InvalidTask("task rejected; nothing was stored:\n  - " + "\n  - ".join(shown))


async def submit_tasks(
    conn: Connection,
    requests: Sequence[TaskRequest],
    *,
    queue: QueueConfig,
    tasks: TasksConfig,
    instance_id: str,
    notify_channel: str | None = None,
    catalog: Pool | None = None,
) -> None:
    """Validate, then store ``requests`` and their jobs on ``conn`` inside a transaction the
    caller holds (the task rows point at their jobs, which are unique per task). Models are
    looked up in ``catalog`` (the coordination database) when given, else on ``conn``."""
    if not requests:
        return
    payloads = await validate_requests(catalog or conn, requests, tasks)
    jobs = await insert_task_jobs(
        conn,
        [TaskJob(r.id, r.model, r.run_mode, r.run_at) for r in requests],
        queue=queue,
        notify_channel=notify_channel,
    )
    await conn.execute(
        _INSERT,
        [r.id for r in requests],
        [r.model for r in requests],
        [r.group_key for r in requests],
        [r.identity.as_dict() for r in requests],
        [r.run_mode.value for r in requests],
        payloads,
        [r.run_at for r in requests],
        [j.job.id for j in jobs],
        instance_id,
    )
