"""Operators' decisions: resolving a task in manual review, and retrying a final one.

A task in ``manual_review`` was (or may have been) submitted upstream and the answer was lost,
so the engine never decides for it. An operator looks upstream and then, with
:func:`resolve_task`:

- marks it **succeeded** with the result found upstream (``task.resolved``);
- marks it **failed** with a reason (``task.resolved``, error code ``resolved_failed``);
- **resubmits** it: back to ``queued`` with a new job, ``submitted_at`` and ``upstream_ref``
  cleared, so the upstream call is made again and *may run upstream twice*
  (``task.resubmitted``).

Each decision is one transaction, fenced on the status: a task no longer in manual review (an
operator or another tab decided first) is refused with :class:`ReviewConflict`, and nothing
changes. The event's payload records who decided (``actor``) and why (``reason``).

:func:`retry_task` (``Engine.retry``, ``python -m engine tasks retry``) puts a failed,
cancelled or manual_review task back to ``queued`` as a fresh run with a new job, recorded as a
``task.retried`` event; failed and manual_review tasks also lose ``submitted_at`` and
``upstream_ref``, so the upstream call is made again. Fenced the same way: a task in any other
status is refused with :class:`~engine.errors.TaskError`, and nothing changes.

A resubmission or a retry gives the task its job in the same transaction
(:func:`engine.tasks.jobs.give_jobs`); if the task's previous job still runs (its run would not
pick the task up again) it is refused, and nothing changes.
"""

from __future__ import annotations

import enum
import uuid
from typing import TYPE_CHECKING, Any, Final

import attrs

from engine.db.bridge import Connection, Record
from engine.db.sqlfiles import QUERIES
from engine.domain.tasks import Task, TaskStatus
from engine.errors import TaskError, TaskNotFound
from engine.queue.states import JobState
from engine.tasks.jobs import TaskJob, give_jobs

if TYPE_CHECKING:
    from engine.tasks.host import OpenEngine as Engine

__all__ = [
    "RESOLVED_FAILED_CODE",
    "RETRYABLE",
    "Decision",
    "ReviewConflict",
    "is_reviewable",
    "resolve_task",
    "retry_task",
]

_RESOLVE: Final = QUERIES["task_resolve"]
_REQUEUE_FINAL: Final = QUERIES["task_requeue_final"]
_GET: Final = QUERIES["task_get"]

#: The ``error.code`` of a task an operator marked failed.
RESOLVED_FAILED_CODE: Final = "resolved_failed"
#: The statuses :func:`retry_task` puts back to queued.
RETRYABLE: Final = frozenset({TaskStatus.FAILED, TaskStatus.CANCELLED, TaskStatus.MANUAL_REVIEW})
_MAX_REASON: Final = 2000
_MAX_ACTOR: Final = 200


class Decision(enum.StrEnum):
    """What an operator decided for a manual-review task."""

    SUCCEEDED = "succeeded"
    FAILED = "failed"
    RESUBMIT = "resubmit"


class ReviewConflict(TaskError):
    """The task is not in manual review (any more); the decision was not applied."""


def _check_text(name: str, value: str, limit: int) -> str:
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"{name} must be a non-empty string")
    if len(value) > limit:
        raise ValueError(f"{name} must be at most {limit} characters")
    return value.strip()


async def resolve_task(
    engine: Engine,
    task_id: uuid.UUID,
    decision: Decision,
    *,
    reason: str,
    actor: str,
    result: Any = None,
) -> Task:
    """Apply ``decision`` to a manual-review task; return the task as committed.

    Args:
        engine: the open engine.
        task_id: the task.
        decision: succeeded (with ``result``), failed, or resubmit.
        reason: why, in words (required; recorded in the event, and as the error message of a
            task marked failed).
        actor: who decided (required; recorded in the event).
        result: the task's result when marked succeeded (any JSON value).

    Raises:
        ValueError: an empty ``reason`` or ``actor``, or a ``result`` with another decision.
        TaskNotFound: no such task.
        ReviewConflict: the task is not in manual review.
        TaskError: resubmit found the task's previous job still running.
    """
    reason = _check_text("reason", reason, _MAX_REASON)
    actor = _check_text("actor", actor, _MAX_ACTOR)
    if result is not None and decision is not Decision.SUCCEEDED:
        raise ValueError("a result goes only with marking a task succeeded")
    payload = {"actor": actor, "reason": reason, "decision": decision.value}
    rollback_timeout = engine.config.worker.enqueue_rollback_timeout
    async with engine.db.tasks.transaction(rollback_timeout=rollback_timeout) as conn:
        if decision is Decision.RESUBMIT:
            message = f"resubmitted by {actor}: {reason}"
            row = await conn.fetchrow(
                _REQUEUE_FINAL,
                task_id,
                ["manual_review"],
                "task.resubmitted",
                message,
                payload,
                engine.instance_id,
            )
        else:
            error = (
                {"code": RESOLVED_FAILED_CODE, "message": reason}
                if decision is Decision.FAILED
                else None
            )
            message = f"marked {decision.value} by {actor}: {reason}"
            row = await conn.fetchrow(
                _RESOLVE,
                task_id,
                decision.value,
                result,
                error,
                message,
                payload,
                engine.instance_id,
            )
        if row is None:
            current = await conn.fetchrow(_GET, task_id)
            if current is None:
                raise TaskNotFound(f"no task {task_id}")
            raise ReviewConflict(
                f"task {task_id} is {current['status']}, not manual_review: only a task in "
                "manual review can be resolved; nothing was changed"
            )
        if decision is Decision.RESUBMIT:
            return await _requeued(engine, conn, row, again="resubmit")
    return Task.from_record(row)


async def retry_task(engine: Engine, task_id: uuid.UUID) -> Task:
    """Put a failed, cancelled or manual_review task back to queued with a new job; return the
    task as committed (``river_job_id`` is its new job).

    One transaction on the tasks database: ``task_requeue_final`` resets the task and records
    ``task.retried``, then :func:`~engine.tasks.jobs.give_jobs` inserts its job (the options a
    submission uses) and points the task at it.

    Raises:
        TaskNotFound: no such task.
        TaskError: the task is not in a retryable status (:data:`RETRYABLE`), or its previous
            job still runs; nothing changed.
    """
    rollback_timeout = engine.config.worker.enqueue_rollback_timeout
    async with engine.db.tasks.transaction(rollback_timeout=rollback_timeout) as conn:
        row = await conn.fetchrow(
            _REQUEUE_FINAL,
            task_id,
            sorted(status.value for status in RETRYABLE),
            "task.retried",
            "retried by an operator",
            {},
            engine.instance_id,
        )
        if row is None:
            current = await conn.fetchrow(_GET, task_id)
            if current is None:
                raise TaskNotFound(f"no task {task_id}")
            raise TaskError(_not_retryable(task_id, TaskStatus(current["status"])))
        return await _requeued(engine, conn, row, again="retry")


def _not_retryable(task_id: uuid.UUID, status: TaskStatus) -> str:
    allowed = "only failed, cancelled and manual_review tasks can be retried"
    if status is TaskStatus.QUEUED:
        return f"task {task_id} is queued: it has not run yet, so there is nothing to retry"
    if status is TaskStatus.RUNNING:
        return f"task {task_id} is running: cancel it first if it must start over ({allowed})"
    return f"task {task_id} is {status.value}; {allowed}"


async def _requeued(engine: Engine, conn: Connection, row: Record, *, again: str) -> Task:
    """Give the task ``task_requeue_final`` just put back to queued (``row``) its new job, in
    that transaction; the task as it will be committed.

    Raises:
        TaskError: its previous job is still running (that run would not pick the task up
            again); ``again`` names what to do again once it finished.
    """
    # Due now (run_at None), not at the row's next_run_at: that is the database's clock, and a
    # client clock behind it would schedule the job instead of making it available.
    (inserted,) = await give_jobs(
        conn,
        [TaskJob(row["id"], row["model"], row["run_mode"])],
        queue=engine.config.queue,
        notify_channel=engine.queue.channels.insert,
    )
    if inserted.skipped and inserted.job.state is JobState.RUNNING:
        raise TaskError(  # the caller's transaction rolls back: the task stays as it was
            f"task {row['id']}: its previous job {inserted.job.id} is still running; "
            f"{again} again once it has finished"
        )
    # As committed: a worker may claim the task as soon as it is.
    return attrs.evolve(Task.from_record(row), river_job_id=inserted.job.id)


def is_reviewable(task: Task) -> bool:
    """True for a task an operator may resolve now."""
    return task.status is TaskStatus.MANUAL_REVIEW
