"""Long-lived runner tasks that run a generation's jobs, one job at a time each.

A new task and cancel scope per job cost ~15 µs of Python per no-op job, against ~9 µs when the
job goes to a task that is already waiting (trio's ``CancelScope`` alone is ~4.6 µs to enter and
leave); in the queue benchmark's burn-down that difference is ~15 % of the throughput. So a
generation keeps its runners: a job goes to an idle runner (a reschedule, no new task) or, when
every runner is busy, to a new one. Runners never outnumber the jobs running at once, so
``max_workers`` bounds them.

Each runner reuses one cancel scope across jobs and registers it under the running job's id
only while that job runs, which is how a remote cancel reaches that job. A cancelled scope is
spent: the runner leaves it and opens a fresh one. A cancel that lands after its job ended (or
that the job swallowed) cannot reach the next job either: waiting idle is a checkpoint, so the
cancel is delivered there, before the runner can be handed another job.

Who records what:

* :func:`~engine.queue.executor.execute` records every handler outcome except an interruption;
* a runner records the interruptions: ``cancelled`` when its own scope caught the cancel (a
  remote cancel of this job), ``available`` with the attempt restored when the cancellation
  comes from outside (a hard stop, River #1290), which it then re-raises.
"""

from __future__ import annotations

from collections.abc import Callable
from contextvars import ContextVar

import outcome
import trio

from engine.queue.executor import Completion, cancelled, execute, interrupted
from engine.queue.job import Job
from engine.queue.workers import Workers

__all__ = ["Runners", "work_nursery"]

_WORK_NURSERY: ContextVar[trio.Nursery] = ContextVar("engine.queue.runners.work_nursery")


def work_nursery() -> trio.Nursery | None:
    """The work nursery of the generation running the current job; None outside a job.

    A task started in it is cancelled by a hard stop of the generation and by any cancel from
    above it, and by none of the job's own scopes (its timeout, a remote cancel of the job).
    """
    return _WORK_NURSERY.get(None)


#: A claimed job and the callback that gives its slot back once its outcome is recorded.
_Item = tuple[Job, Callable[[], None]]


class Runners:
    """The runner tasks of one generation, living in its work nursery."""

    def __init__(
        self,
        nursery: trio.Nursery,
        workers: Workers,
        record: Callable[[Completion], None],
        cancel_scopes: dict[int, trio.CancelScope],
        *,
        default_timeout: float | None = None,
    ) -> None:
        self._nursery = nursery
        self._workers = workers
        self._record = record
        self._cancel_scopes = cancel_scopes
        self._default_timeout = default_timeout
        self._idle: list[trio.lowlevel.Task] = []
        self._closed = False
        #: Runner tasks alive now (busy or idle).
        self.alive = 0

    def start(self, job: Job, done: Callable[[], None]) -> None:
        """Run ``job`` now; ``done()`` is called once its outcome is recorded."""
        if self._closed:
            raise RuntimeError("runners are closed: the generation no longer starts jobs")
        if self._idle:
            trio.lowlevel.reschedule(self._idle.pop(), outcome.Value((job, done)))
        else:
            self._nursery.start_soon(self._run, (job, done))

    def close(self) -> None:
        """No more jobs: idle runners end now, busy ones once their job is recorded."""
        self._closed = True
        idle, self._idle = self._idle, []
        for task in idle:
            trio.lowlevel.reschedule(task, outcome.Value(None))

    async def _next(self) -> _Item | None:
        """Wait idle for the next job; None once closed."""
        if self._closed:
            return None
        task = trio.lowlevel.current_task()
        self._idle.append(task)

        def abort(_: object) -> trio.lowlevel.Abort:
            self._idle.remove(task)
            return trio.lowlevel.Abort.SUCCEEDED

        item: _Item | None = await trio.lowlevel.wait_task_rescheduled(abort)
        return item

    async def _run(self, item: _Item | None) -> None:
        self.alive += 1
        _WORK_NURSERY.set(self._nursery)  # this runner task's own context
        try:
            while item is not None:
                item = await self._run_in_one_scope(item)
        finally:
            self.alive -= 1

    async def _run_in_one_scope(self, item: _Item | None) -> _Item | None:
        """Run jobs in one cancel scope until it is cancelled; return the job to run next."""
        running: _Item | None = None
        try:
            with trio.CancelScope() as scope:
                while item is not None:
                    job, done = running = item
                    self._cancel_scopes[job.id] = scope
                    try:
                        await execute(
                            job, self._workers, self._record, default_timeout=self._default_timeout
                        )
                    finally:
                        self._cancel_scopes.pop(job.id, None)
                    running = None
                    done()
                    item = await self._next()
                return None
        except BaseException:
            # Cancelled from outside this scope (a hard stop) or a bug: the job goes back to
            # available at once, attempt restored, and the cancellation goes on.
            if running is not None:
                self._record(interrupted(running[0]))
                running[1]()
            raise
        # The scope caught its own cancel: the remote cancel of the running job, if any (it
        # may also have landed while this runner sat idle).
        if running is not None:
            self._record(cancelled(running[0]))
            running[1]()
        return await self._next()
