"""The periodic scheduler: on the elected leader, submits each schedule's due periods.

Per schedule, one transaction locks the schedule's row, works out the due periods from the
locked cursor (:func:`~engine.schedules.due.due_periods`), submits a task or inserts a job per
period, and moves the cursor. Either all of it commits or none of it does, and a second leader
overlapping a hand-over waits on the row lock and then finds nothing due: every period is
submitted exactly once. A period's task id is derived from the schedule and the period, and a
period whose task already exists is not submitted again.

A failed pass (the database, an unknown model, the app's builder raising) is logged, recorded
on the schedule's row where the database allows, and tried again: nothing is passed over
because of an error.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence
from datetime import UTC, datetime, timedelta

import attrs
import trio

from engine.db.bridge import Connection, Pool
from engine.db.sqlfiles import QUERIES
from engine.domain.tasks import TaskRequest
from engine.errors import DatabaseError
from engine.queue.insert import InsertParams, prepare
from engine.queue.job import InsertOpts
from engine.schedules.due import Due, due_periods
from engine.schedules.model import Schedule, ScheduledTask, period_task_id
from engine.schedules.timing import Timing

__all__ = ["InsertJobs", "PeriodicScheduler", "SubmitTasks"]

log = logging.getLogger(__name__)

_DECLARE = QUERIES["schedule_declare_many"]
_LOCK = QUERIES["schedule_lock"]
_ADVANCE = QUERIES["schedule_advance"]
_SET_ERROR = QUERIES["schedule_set_error"]
_EXISTING = QUERIES["task_existing_ids"]

#: Submits task requests inside the caller's transaction (``Engine.submit_tx``).
SubmitTasks = Callable[[Connection, Sequence[TaskRequest]], Awaitable[None]]
#: Inserts jobs inside the caller's transaction and announces them.
InsertJobs = Callable[[Connection, Sequence[InsertParams]], Awaitable[object]]

#: Longest sleep between two passes: the wall clock may have been set since.
_MAX_SLEEP = 30.0
#: Seconds before a failed schedule is tried again.
_ERROR_RETRY = 10.0
#: Wake this long after a boundary, so the boundary is certainly in the past.
_MARGIN = timedelta(milliseconds=2)


def _utcnow() -> datetime:
    return datetime.now(UTC)


@attrs.define(eq=False)
class PeriodicScheduler:
    """Fires ``schedules`` on ``pool`` (the tasks database) while its owner leads."""

    pool: Pool
    schedules: Sequence[Schedule]
    submit_tx: SubmitTasks
    insert_jobs: InsertJobs
    leader_id: str
    default_max_attempts: int = 25
    rollback_timeout: float = 5.0
    clock: Callable[[], datetime] = _utcnow
    _timings: dict[str, Timing] = attrs.field(init=False, factory=dict)

    def __attrs_post_init__(self) -> None:
        self._timings = {s.name: s.timing for s in self.schedules}

    async def declare(self) -> None:
        """Register the schedules (new ones get a row; every cursor is kept)."""
        await self.pool.execute(
            _DECLARE,
            [s.name for s in self.schedules],
            [self._timings[s.name].describe() for s in self.schedules],
            [s.target() for s in self.schedules],
            self.leader_id,
        )

    async def run(self) -> None:
        """Declare, then fire due periods until cancelled (the elector cancels it when
        leadership ends). A failure is logged and tried again: it never ends the leader's
        other services."""
        if not self.schedules:
            return
        declared = False
        while True:
            try:
                if not declared:
                    await self.declare()
                    declared = True
                wake = await self.run_once()
            except Exception as exc:  # the database, or a bug: log, wait, try again
                log.warning(
                    "periodic scheduler pass failed; retrying",
                    extra={"event": "schedule_pass_failed", "error": str(exc) or repr(exc)},
                )
                wake = self.clock() + timedelta(seconds=_ERROR_RETRY)
            await trio.sleep(max(0.0, (wake - self.clock()).total_seconds()))

    async def run_once(self) -> datetime:
        """One pass over every schedule; returns when the next pass is due."""
        now = self.clock()
        wake = now + timedelta(seconds=_MAX_SLEEP)
        for schedule in self.schedules:
            try:
                await self._fire(schedule)
            except Exception as exc:  # any failure is retried, never passed over
                await self._failed(schedule, exc)
                wake = min(wake, now + timedelta(seconds=_ERROR_RETRY))
            wake = min(wake, self._timings[schedule.name].after(self.clock()) + _MARGIN)
        return wake

    async def _fire(self, schedule: Schedule) -> Due:
        timing = self._timings[schedule.name]
        async with self.pool.transaction(rollback_timeout=self.rollback_timeout) as conn:
            cursor = await conn.fetchval(_LOCK, schedule.name)
            now = self.clock()
            due = due_periods(
                timing, cursor, now, limit=schedule.limit(), run_on_start=schedule.run_on_start
            )
            fired = await self._submit(conn, schedule, due.fire) if due.fire else 0
            await conn.execute(
                _ADVANCE, schedule.name, due.cursor, timing.after(now), fired, due.passed_over
            )
        if due.fire or due.passed_over:
            log.info(
                "schedule fired",
                extra={
                    "event": "schedule_fired",
                    "schedule": schedule.name,
                    "periods": [p.isoformat() for p in due.fire],
                    "submitted": fired,
                    "passed_over": due.passed_over,
                },
            )
        return due

    async def _submit(
        self, conn: Connection, schedule: Schedule, periods: Sequence[datetime]
    ) -> int:
        if schedule.job is not None:
            job = schedule.job
            params = [
                prepare(
                    dict(job.args),
                    InsertOpts(
                        queue=job.queue,
                        priority=job.priority,
                        max_attempts=job.max_attempts,
                        tags=job.tags,
                        # River's periodic metadata, and the period this job is for.
                        metadata={
                            "periodic": True,
                            "river:periodic_job_id": schedule.name,
                            "engine:period": period.isoformat(),
                        },
                    ),
                    kind=job.kind,
                    default_max_attempts=self.default_max_attempts,
                )
                for period in periods
            ]
            await self.insert_jobs(conn, params)
            return len(params)
        requests = [self._request(schedule, period) for period in periods]
        existing = {r["id"] for r in await conn.fetch(_EXISTING, [r.id for r in requests])}
        fresh = [r for r in requests if r.id not in existing]
        if fresh:
            await self.submit_tx(conn, fresh)
        return len(fresh)

    def _request(self, schedule: Schedule, period: datetime) -> TaskRequest:
        task = schedule.task
        if isinstance(task, ScheduledTask):
            return task.request(schedule.name, period)
        assert task is not None
        built = task(period)
        if not isinstance(built, TaskRequest):
            raise TypeError(
                f"schedule {schedule.name!r}: the task function returned {built!r}, "
                "not an engine.TaskRequest"
            )
        return attrs.evolve(built, id=period_task_id(schedule.name, period))

    async def _failed(self, schedule: Schedule, exc: Exception) -> None:
        error = str(exc) or type(exc).__name__
        log.warning(
            "schedule pass failed; trying again",
            extra={"event": "schedule_failed", "schedule": schedule.name, "error": error},
        )
        if isinstance(exc, DatabaseError):
            return  # recording it would fail the same way
        try:
            await self.pool.execute(_SET_ERROR, schedule.name, error[:2000])
        except DatabaseError:
            pass
