"""Run what an engine has queued until it is final: ``ran = await drain(eng)``.

On a running engine, :func:`drain` waits until every queued task has run. On a manual one
(``worker.mode = "client"``: it stores tasks and claims none) it runs them itself: for the
drain, the engine gets a worker generation of its own (the same fixed capacity
``worker.capacity = "fixed"`` uses, so claims, runs, leases and completions are the engine's
own), which stops when the drain ends. Either way it waits on each task with
:meth:`Engine.wait` (woken by the task's NOTIFY) and looks again, until no task is left to run:
tasks that providers submit while they run are drained too.

"To run" means queued or running, due now (``next_run_at`` passed), and of a model the engine
has a provider for (or a simulation task). A task due later (``run_at``, a rate limit's delay, a
retry after a lock timeout) is left queued: drain again once it is due.
"""

from __future__ import annotations

import uuid
import weakref
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime

import trio

from engine.capacity.fixed import FixedCapacity
from engine.capacity.room import ShutdownPolicy
from engine.domain.tasks import Task, TaskStatus
from engine.service.engine import Engine
from engine.tasks.jobs import model_claim_filter
from engine.testing.assertions import READ_LIMIT, describe_tasks

__all__ = ["DrainTimeout", "drain"]

#: Per engine, the tasks an earlier drain returned.
_returned: weakref.WeakKeyDictionary[Engine, set[uuid.UUID]] = weakref.WeakKeyDictionary()


class DrainTimeout(trio.TooSlowError):
    """A drain ran out of time; the message lists the tasks still to run."""


def _to_run(eng: Engine, task: Task, now: datetime) -> bool:
    return (
        task.status in (TaskStatus.QUEUED, TaskStatus.RUNNING)
        and task.next_run_at <= now
        and (task.simulated or task.model in eng.runner.providers)
    )


async def _tasks(eng: Engine) -> list[Task]:
    tasks = await eng.list_tasks(limit=READ_LIMIT)
    return sorted(tasks, key=lambda t: (t.created_at, t.river_job_id or 0, str(t.id)))


@asynccontextmanager
async def _executing(eng: Engine, max_workers: int) -> AsyncIterator[None]:
    """A worker generation on ``eng`` for the block, if it runs none of its own."""
    config = eng.config
    if config.worker.mode == "worker":
        yield
        return
    capacity = FixedCapacity(
        eng.queue,
        config.queue.name,
        max_workers,
        # Nothing is left running at the end of a drain that finished; after one that timed
        # out, what still runs is requeued at once.
        policy=ShutdownPolicy(drain_timeout=0.0, stop_timeout=config.worker.stop_timeout),
        args_filter=model_claim_filter(sorted(eng.runner.providers)),
    )
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(capacity.run)
            try:
                yield
            finally:
                nursery.cancel_scope.cancel(reason="drain finished")
    finally:
        eng.queue.slots.total = 0  # back to storing only


async def drain(eng: Engine, *, timeout: float = 10.0, max_workers: int = 16) -> list[Task]:
    """Run every task ``eng`` has to run (see the module docstring) until each is final; return
    the tasks that are final and that no earlier drain of ``eng`` returned, oldest first (what
    ran since the engine opened or since the last drain, and any task cancelled meanwhile).

    Args:
        eng: an open engine, running or manual.
        timeout: seconds the whole drain may take.
        max_workers: tasks run at once on a manual engine (a running one uses its own
            capacity).

    Raises:
        DrainTimeout: (a ``trio.TooSlowError``) ``timeout`` passed with tasks still to run;
            on a manual engine those still running are requeued.
    """
    pending: list[Task] = []
    with trio.move_on_after(timeout) as scope:
        async with _executing(eng, max_workers):
            while True:
                now = datetime.now(UTC)
                pending = [t for t in await _tasks(eng) if _to_run(eng, t, now)]
                if not pending:
                    break
                for task in pending:
                    await eng.wait(task.id)
    if scope.cancelled_caught:
        left = [t for t in await _tasks(eng) if _to_run(eng, t, datetime.now(UTC))]
        raise DrainTimeout(
            f"drain: not done after {timeout} s.\n{describe_tasks(left, 'left to run')}"
        )
    returned = _returned.setdefault(eng, set())
    ran = [t for t in await _tasks(eng) if t.is_final and t.id not in returned]
    returned.update(t.id for t in ran)
    return ran
