"""Submitting tasks: validate everything first, then store the tasks and their jobs in one
statement.

The checks Python can make (fields, payloads, ids) come before any round trip, and one bad
request rejects the whole call with an :class:`~engine.errors.InvalidTask` naming every problem,
so nothing is half-stored. The catalogue check (each model known and enabled), the jobs, the
tasks and their first events are then one statement (``task_submit_many``, or
``task_submit_one`` for a single request): atomic as any statement is, on its own (one round
trip, its own transaction) or in the caller's transaction. When a model fails the check that
statement writes nothing and says which requests failed.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import datetime
from typing import Any, NoReturn

from engine.db.bridge import Statements
from engine.db.jsontext import compact_strict
from engine.db.sqlfiles import QUERIES
from engine.domain.tasks import Identity, TaskRequest
from engine.errors import InvalidTask
from engine.queue.config import QueueConfig
from engine.queue.insert import job_columns
from engine.queue.notifier import insert_payload
from engine.queue.states import JobState
from engine.tasks.config import TasksConfig
from engine.tasks.jobs import TaskJob
from engine.tasks.jsoncheck import bad_character, json_problem

__all__ = ["submit_statement", "submit_tasks", "validate_requests"]

_SUBMIT_ONE = QUERIES["task_submit_one"]
_SUBMIT_MANY = QUERIES["task_submit_many"]

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
        text = compact_strict(request.payload)
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


def validate_requests(requests: Sequence[TaskRequest], tasks: TasksConfig) -> list[str]:
    """Check every request in Python; return the payload texts, raising InvalidTask on any
    problem.

    Everything a database would refuse, or that could never run, is caught here, before
    anything is sent, as a permanent error: lengths (``tasks.max_field_length``, the
    catalogue's 200 for model names), NUL characters and lone surrogates, payload depth
    (``tasks.max_payload_depth``) and size (``tasks.max_payload_bytes``), ids (two requests
    with one id), ``run_at``. Whether each model is known and enabled is checked by the
    statement that stores them (:func:`submit_tasks`).
    """
    problems: list[str] = []
    payloads: list[str] = []
    for n, request in enumerate(requests):
        problems += _request_problems(request, tasks, n)
        payloads.append(_payload_text(request, tasks, problems, n))
    if not problems and len({r.id for r in requests}) != len(requests):
        problems.append("two requests have the same id")
    if problems:
        _reject(problems)
    return payloads


def _reject(problems: list[str]) -> NoReturn:
    shown = problems[:20] + ([f"... and {len(problems) - 20} more"] if len(problems) > 20 else [])
    raise InvalidTask("task rejected; nothing was stored:\n  - " + "\n  - ".join(shown))


def submit_statement(
    requests: Sequence[TaskRequest],
    payloads: Sequence[str],
    *,
    queue: QueueConfig,
    instance_id: str,
    notify_channel: str | None,
) -> tuple[str, list[Any]]:
    """The statement that stores validated ``requests`` (with their payload texts, from
    :func:`validate_requests`), and its parameters: ``task_submit_one`` for one request,
    ``task_submit_many`` for more (the same statement over arrays)."""
    jobs = [TaskJob(r.id, r.model, r.run_mode, r.run_at).params(queue) for r in requests]
    # The statement finds each task's job by its unique key (see task_submit_many).
    assert all(p.unique_key is not None for p in jobs)
    available = [p.queue for p in jobs if p.state is JobState.AVAILABLE]
    notify = (
        [insert_payload(q) for q in dict.fromkeys(available)] if notify_channel is not None else []
    )
    task_columns: list[list[Any]] = [
        [r.id for r in requests],
        [r.model for r in requests],
        [r.group_key for r in requests],
        [r.identity.as_dict() for r in requests],
        [r.run_mode.value for r in requests],
        list(payloads),
        [r.run_at for r in requests],
    ]
    job_part = job_columns(jobs)
    if len(requests) == 1:
        job_part = [column[0] for column in job_part]
        task_columns = [column[0] for column in task_columns]
    query = _SUBMIT_ONE if len(requests) == 1 else _SUBMIT_MANY
    return query, [*job_part, notify_channel or "", notify, *task_columns, instance_id]


async def submit_tasks(
    conn: Statements,
    requests: Sequence[TaskRequest],
    *,
    queue: QueueConfig,
    tasks: TasksConfig,
    instance_id: str,
    notify_channel: str | None = None,
) -> None:
    """Validate, then store ``requests`` and their jobs on ``conn`` in one statement (the task
    rows point at their jobs, which are unique per task; a live job of the same task is kept).

    On a pool, or a connection with no transaction open, the statement is its own
    transaction: one round trip. Inside the caller's transaction the tasks exist only if it
    commits.

    Raises:
        InvalidTask: a request is invalid, or names a model that is unknown or disabled;
            nothing was stored.
    """
    if not requests:
        return
    payloads = validate_requests(requests, tasks)
    query, args = submit_statement(
        requests, payloads, queue=queue, instance_id=instance_id, notify_channel=notify_channel
    )
    row = await conn.fetchrow(query, *args)
    assert row is not None
    found = {n: "unknown model {!r}" for n in row["unknown"]}
    found.update({n: "model {!r} is disabled" for n in row["disabled"]})
    if found:
        _reject(
            [f"request {n - 1}: " + found[n].format(requests[n - 1].model) for n in sorted(found)]
        )
