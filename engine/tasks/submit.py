"""Submitting tasks: validate everything first, then store the task and its job atomically.

Validation happens before anything is written, and one bad request rejects the whole call with
an :class:`~engine.errors.InvalidTask` naming every problem, so nothing is half-stored. The task
rows and their jobs are written in one transaction, or in the caller's.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import UTC, datetime

from engine.config import QueueConfig
from engine.db.bridge import Connection, Pool
from engine.db.sqlfiles import QUERIES
from engine.errors import InvalidTask
from engine.queue.insert import insert_tx, prepare
from engine.queue.job import InsertOpts
from engine.queue.states import GATEWAY_UNIQUE_STATES
from engine.queue.unique import UniqueOpts
from engine.tasks.jobs import TaskRunArgs
from engine.tasks.models import TaskRequest

__all__ = ["submit_tasks", "task_insert_opts", "validate_requests"]

_MODELS = QUERIES["model_get_many"]
_INSERT = QUERIES["task_insert_many"]

# Unique by task_id alone, as the Go worker's jobs: the model in a live task's args routes the
# job and must not change its key (a Go client inserting {"task_id"} dedupes against ours).
_GATEWAY_UNIQUE = UniqueOpts(by_args=("task_id",), by_queue=True, by_state=GATEWAY_UNIQUE_STATES)


def task_insert_opts(config: QueueConfig, run_at: datetime | None = None) -> InsertOpts:
    """The job options of a task: unique by task id over the live states; scheduled only
    when it is due later (as the Go worker's ``asyncTaskRecoveryInsertOpts``)."""
    scheduled = run_at if run_at is not None and run_at > datetime.now(UTC) else None
    return InsertOpts(
        queue=config.name,
        priority=config.insert_priority,
        max_attempts=config.insert_max_attempts,
        tags=config.insert_tags,
        unique=_GATEWAY_UNIQUE,
        scheduled_at=scheduled,
    )


def _payload_text(request: TaskRequest, max_bytes: int, problems: list[str], n: int) -> str:
    try:
        text = json.dumps(request.payload, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError) as exc:
        problems.append(f"request {n}: payload is not JSON ({exc})")
        return ""
    size = len(text.encode())
    if size > max_bytes:
        problems.append(
            f"request {n}: payload is {size} bytes; the limit is {max_bytes} "
            "(tasks.max_payload_bytes)"
        )
    return text


async def validate_requests(
    catalog: Pool | Connection, requests: Sequence[TaskRequest], max_payload_bytes: int
) -> list[str]:
    """Check every request; return the payload texts, raising InvalidTask on any problem."""
    problems: list[str] = []
    payloads: list[str] = []
    for n, request in enumerate(requests):
        identity = request.identity
        if not (identity.tenant_id or "").strip():
            problems.append(f"request {n}: identity.tenant_id is required")
        if not (identity.user_id or identity.gateway_user_id or "").strip():
            problems.append(f"request {n}: identity needs user_id or gateway_user_id")
        payloads.append(_payload_text(request, max_payload_bytes, problems, n))
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
        shown = problems[:20] + (
            [f"... and {len(problems) - 20} more"] if len(problems) > 20 else []
        )
        raise InvalidTask("task rejected; nothing was stored:\n  - " + "\n  - ".join(shown))
    return payloads


async def submit_tasks(
    conn: Connection,
    requests: Sequence[TaskRequest],
    *,
    queue: QueueConfig,
    max_payload_bytes: int,
    instance_id: str,
    notify_channel: str | None = None,
    catalog: Pool | None = None,
) -> None:
    """Validate, then store ``requests`` and their jobs on ``conn`` inside a transaction the
    caller holds (the task rows point at their jobs, which are unique per task). Models are
    looked up in ``catalog`` (the coordination database) when given, else on ``conn``."""
    if not requests:
        return
    payloads = await validate_requests(catalog or conn, requests, max_payload_bytes)
    params = [
        prepare(
            TaskRunArgs.for_task(r.id, r.model, r.run_mode),
            task_insert_opts(queue, r.run_at),
            kind=queue.job_kind,
        )
        for r in requests
    ]
    jobs = await insert_tx(conn, params, notify_channel)
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
