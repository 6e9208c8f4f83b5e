"""Run one task on a provider without a database, exactly as the engine's job handler runs it.

:func:`run_provider` hands the task to the engine's own :class:`~engine.tasks.runner.TaskRunner`
(its ``work``, the decision table of ``engine/tasks/runner.py``), whose store and event writer
are replaced by in-memory ones holding that one task. So prepare → submit → poll → finalize
runs, and each answer and exception maps to the outcome the engine records, by the same code:

| the provider                                   | the task                                    |
|------------------------------------------------|---------------------------------------------|
| answers every step                             | ``succeeded``, ``result`` from finalize     |
| raises ``ProviderError(msg, code=c)``          | ``failed``, error ``{"code": c, ...}``      |
| polls ``PollResult(done=True, error=msg)``     | ``failed``, code ``upstream_failed``        |
| raises ``AmbiguousSubmission`` in submit       | ``manual_review``, ``ambiguous_submission`` |
| raises its own exception in submit             | ``manual_review`` (it may have arrived)     |
| raises its own exception in prepare, poll or   | ``failed``, code ``provider_exception``,    |
| finalize                                       | naming the type and the phase               |
| finalizes a result the database cannot store   | ``failed``, code ``result_not_storable``    |
| (not JSON, NaN, a NUL character)               |                                             |
| anything else                                  | ``failed``, code ``internal_error``         |

A task given with an ``upstream_ref`` resumes polling (no prepare, no submit), and one with
``submitted_at`` but no reference goes to manual review without any provider call, as a run
after a crash would.
"""

from __future__ import annotations

import json
import math
import uuid
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any, NoReturn, cast

import attrs
import trio

from engine.db.bridge import Pool
from engine.domain.tasks import Task, TaskPhase, TaskStatus
from engine.providers.base import PollResult, Provider
from engine.queue.job import Job, JobSnooze
from engine.queue.states import JobState
from engine.tasks.jobs import TaskRunArgs
from engine.tasks.leases import LeaseKeeper
from engine.tasks.runner import TaskRunner
from engine.tasks.store import EventWriter, TaskStore, storable_outcome
from engine.testing.factories import make_task

__all__ = ["run_provider"]

_INSTANCE: str = "engine.testing"
_LEASE_TTL = 60.0


class _NoDatabase:
    """Stands where the runner expects a pool: a run here has no database, and a code path
    that would need one says so instead of failing obscurely."""

    def __getattr__(self, name: str) -> NoReturn:
        raise RuntimeError(
            f"run_provider has no database (the run used Pool.{name}); run the task on an "
            "engine instead (engine.testing.open_test_engine, or the engine_running fixture)"
        )


_NO_DATABASE = cast(Pool, _NoDatabase())


class _MemoryStore(TaskStore):
    """The runner's store for one task, in memory, with the SQL's fencing: a write names the
    execution token and changes nothing once another holds the task."""

    def __init__(self, task: Task) -> None:
        super().__init__(_NO_DATABASE, _INSTANCE, lease_ttl=_LEASE_TTL)
        self.task = task

    def _update(self, **changes: Any) -> None:
        self.task = attrs.evolve(self.task, updated_at=datetime.now(UTC), **changes)

    def _holds(self, task_id: uuid.UUID, token: uuid.UUID) -> bool:
        return task_id == self.task.id and self.task.execution_token == token

    async def get(self, task_id: uuid.UUID) -> Task | None:
        await trio.lowlevel.checkpoint()
        return self.task if task_id == self.task.id else None

    async def get_now(self, task_id: uuid.UUID) -> Task | None:
        return await self.get(task_id)

    async def claim(self, task_id: uuid.UUID, token: uuid.UUID) -> Task | None:
        await trio.lowlevel.checkpoint()
        task = self.task
        if (
            task_id != task.id
            or task.status not in (TaskStatus.QUEUED, TaskStatus.RUNNING)
            or task.cancel_requested_at is not None
        ):
            return None  # as the claim finds it: final, or being cancelled
        now = datetime.now(UTC)
        self._update(
            status=TaskStatus.RUNNING,
            phase=TaskPhase.PREPARING,
            progress=0.1,
            execution_token=token,
            execution_owner=self.owner,
            lease_expires_at=now + timedelta(seconds=self.lease_ttl),
            attempts=task.attempts + 1,
            started_at=task.started_at or now,
        )
        return self.task

    async def renew(self, leases: Sequence[tuple[uuid.UUID, uuid.UUID]]) -> dict[uuid.UUID, bool]:
        await trio.lowlevel.checkpoint()
        return {
            i: self.task.cancel_requested_at is not None for i, t in leases if self._holds(i, t)
        }

    async def mark_submitting(
        self, task_id: uuid.UUID, token: uuid.UUID, *, idempotently: bool = False
    ) -> bool:
        await trio.lowlevel.checkpoint()
        if not self._holds(task_id, token) or self.task.status is not TaskStatus.RUNNING:
            return False
        self._update(
            submitted_at=datetime.now(UTC),
            submitted_idempotently=idempotently,
            phase=TaskPhase.WAITING_UPSTREAM,
            progress=0.3,
        )
        return True

    async def unmark_submitting(self, task_id: uuid.UUID, token: uuid.UUID) -> bool:
        await trio.lowlevel.checkpoint()
        if not self._holds(task_id, token) or self.task.status is not TaskStatus.RUNNING:
            return False
        if self.task.upstream_ref is None:
            self._update(submitted_at=None, submitted_idempotently=False)
        return True

    async def record_upstream(self, task_id: uuid.UUID, token: uuid.UUID, ref: str) -> bool:
        await trio.lowlevel.checkpoint()
        if not self._holds(task_id, token) or self.task.status is not TaskStatus.RUNNING:
            return False
        self._update(upstream_ref=ref, progress=0.4)
        return True

    async def finish(
        self,
        task_id: uuid.UUID,
        token: uuid.UUID,
        status: TaskStatus,
        *,
        result: Any = None,
        error: dict[str, Any] | None = None,
    ) -> bool:
        # Recorded whatever cancels the caller, as the real write is (shielded).
        await trio.lowlevel.cancel_shielded_checkpoint()
        if not self._holds(task_id, token):
            return False
        # What the database would store: an unstorable result fails the task, as there.
        status, result_text, error_text = storable_outcome(status, result, error)
        self._update(
            status=status,
            phase=None,
            progress=1.0 if status is TaskStatus.SUCCEEDED else self.task.progress,
            result=None if result_text is None else json.loads(result_text),
            error=None if error_text is None else json.loads(error_text),
            execution_token=None,
            lease_expires_at=None,
            finished_at=datetime.now(UTC),
        )
        return True

    async def requeue(
        self,
        task_id: uuid.UUID,
        token: uuid.UUID,
        *,
        delay: float = 0.0,
        only_before_submission: bool = False,
    ) -> TaskStatus | None:
        await trio.lowlevel.cancel_shielded_checkpoint()
        task = self.task
        if not self._holds(task_id, token) or (only_before_submission and task.submitted_at):
            return None
        now = datetime.now(UTC)
        ambiguous = task.submission_ambiguous
        self._update(
            status=TaskStatus.MANUAL_REVIEW if ambiguous else TaskStatus.QUEUED,
            finished_at=now if ambiguous else None,
            phase=None,
            execution_token=None,
            execution_owner=None,
            lease_expires_at=None,
            next_run_at=now + timedelta(seconds=delay),
        )
        return self.task.status


class _MemoryEvents(EventWriter):
    """The runner's event writer, keeping the events instead of writing them."""

    def __init__(self) -> None:
        super().__init__(_NO_DATABASE)

    async def flush(self, *, retry: bool = True) -> None:
        await trio.lowlevel.checkpoint()


@attrs.define
class _Paced:
    """``provider`` with another ``poll_interval`` (every call goes to ``provider``)."""

    provider: Provider
    poll_interval: float

    async def prepare(self, task: Task) -> Any:
        return await self.provider.prepare(task)

    async def submit(self, task: Task, prepared: Any) -> str:
        return await self.provider.submit(task, prepared)

    async def poll(self, task: Task, upstream_ref: str) -> PollResult:
        return await self.provider.poll(task, upstream_ref)

    async def finalize(self, task: Task, result: Any) -> Any:
        return await self.provider.finalize(task, result)

    async def cancel(self, task: Task, upstream_ref: str) -> None:
        await self.provider.cancel(task, upstream_ref)


def _job(task: Task) -> Job:
    now = datetime.now(UTC)
    return Job(
        id=0,
        state=JobState.RUNNING,
        kind=TaskRunArgs.kind,
        args={"task_id": str(task.id)},
        queue=_INSTANCE,
        priority=2,
        attempt=1,
        max_attempts=1,
        scheduled_at=now,
        created_at=now,
        attempted_at=now,
        attempted_by=(_INSTANCE,),
        finalized_at=None,
        errors=(),
        metadata={},
        tags=(),
        unique_key=None,
    )


async def run_provider(
    provider: Provider,
    task: Task | None = None,
    *,
    timeout: float | None = 30.0,
    poll_interval: float | None = None,
) -> Task:
    """Run ``task`` (default: :func:`~engine.testing.make_task`) on ``provider`` as the engine
    would, without a database, and return the task as the run left it (see the module
    docstring for how each answer maps). The run starts as a claim leaves a task: running,
    with a fresh execution token and one more attempt, whatever its ``next_run_at``.

    The task comes back ``queued`` (to run again) only when the provider raised an engine
    error the engine retries: a lock timeout or a lost database connection.

    Args:
        provider: the provider under test (any object with the :class:`~engine.Provider`
            methods and a ``poll_interval``).
        task: the task to run; queued or running (a final task has nothing to run).
        timeout: seconds the run may take, or None for no bound.
        poll_interval: seconds between polls instead of ``provider.poll_interval`` (0 for a
            test that should not wait between polls).

    Raises:
        trio.TooSlowError: ``timeout`` passed first; the run was cancelled as a stop cancels
            it, and the message says what the task was left as (requeued, or in manual review
            when the stop cut off a ``submit``).
        ValueError: the task is already final.
    """
    task = make_task() if task is None else task
    if task.is_final:
        raise ValueError(f"task {task.id} is already {task.status.value}: nothing to run")
    if poll_interval is not None:
        provider = _Paced(provider, poll_interval)
    store = _MemoryStore(task)
    events = _MemoryEvents()
    runner = TaskRunner(
        store,
        events,
        LeaseKeeper(store, _LEASE_TTL / 3),
        {task.model: provider},
        simulated=provider,
        instance_id=_INSTANCE,
    )
    if timeout is not None:
        # A submit under way when the time is up gets no longer than the run had (the engine
        # gives one 10 s at a stop, to avoid an ambiguous submission).
        runner.submit_grace = min(runner.submit_grace, timeout)
    with trio.move_on_after(math.inf if timeout is None else timeout) as scope:
        try:
            await runner.work(_job(task), TaskRunArgs(str(task.id), task.model))
        except JobSnooze:
            pass  # the task went back to the queue (store.task says so)
    if scope.cancel_called:
        left = store.task
        raise trio.TooSlowError(
            f"run_provider: the run took longer than {timeout} s; it was stopped and the task "
            f"left {left.status.value}"
            + (f" (upstream_ref {left.upstream_ref!r})" if left.upstream_ref else "")
        )
    return store.task
