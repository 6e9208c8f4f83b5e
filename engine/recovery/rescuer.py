"""The recovery loop; see :mod:`engine.recovery` for what one round does."""

from __future__ import annotations

import logging
from collections.abc import Callable

import attrs
import trio

from engine.db.database import Database
from engine.db.sqlfiles import QUERIES
from engine.errors import DatabaseError
from engine.queue.config import QueueConfig
from engine.recovery.config import RecoveryConfig
from engine.tasks.jobs import TaskJob, give_jobs

__all__ = ["RecoveryReport", "RecoverySettings", "Rescuer"]

log = logging.getLogger(__name__)

_INTERRUPTED = QUERIES["task_recover_interrupted_many"]
_ORPHANS = QUERIES["job_rescue_orphaned_many"]
_RECOVERABLE = QUERIES["task_list_recoverable"]
_YIELD = QUERIES["admission_yield_stale"]
_LIVENESS = QUERIES["worker_instance_list_liveness"]
_CLEAN = QUERIES["admission_clean_finished"]


@attrs.frozen
class RecoveryReport:
    """What one round did."""

    requeued_tasks: int = 0
    manual_review_tasks: int = 0
    released_leases: int = 0
    cleaned_admissions: int = 0
    yielded_admissions: int = 0
    orphaned_jobs: int = 0
    reenqueued_tasks: int = 0

    def total(self) -> int:
        """Everything that was recovered."""
        return sum(attrs.astuple(self))


@attrs.frozen
class RecoverySettings:
    """What recovery reads of the configuration.

    Attributes:
        recovery: the ``[recovery]`` section.
        queue: the ``[queue]`` section: the queue whose orphaned jobs it rescues, and the
            jobs it gives lost tasks.
        stop_timeout: ``worker.stop_timeout``; an instance silent for three times it is dead.
        rollback_timeout: ``worker.enqueue_rollback_timeout``.
        admission_stale_after: ``admission.stale_after``; an admitted task not started by
            then yields its slot back.
    """

    recovery: RecoveryConfig
    queue: QueueConfig
    stop_timeout: float
    rollback_timeout: float
    admission_stale_after: float


class Rescuer:
    """Runs recovery rounds; ``tasks_only`` (client mode) re-enqueues lost tasks only."""

    def __init__(
        self,
        settings: RecoverySettings,
        db: Database,
        instance_id: str,
        notify_channel: str | None = None,
        *,
        client_mode: bool = False,
        on_report: Callable[[RecoveryReport], None] | None = None,
    ) -> None:
        self.settings = settings
        self.db = db
        self.instance_id = instance_id
        self.notify_channel = notify_channel
        self.client_mode = client_mode
        self.on_report = on_report
        self.rounds = 0

    async def run_once(self) -> RecoveryReport:
        """One round; raises on a database error (the loop logs it and goes on)."""
        cfg = self.settings
        requeued = manual = orphans = leases = admissions = yielded = 0
        if not self.client_mode:
            # The registry may live in another database than tasks and jobs: read who is
            # alive there, then act on the tasks database with those names.
            liveness = await self.db.coordination.fetch(
                _LIVENESS, cfg.recovery.stale_after, cfg.stop_timeout * 3
            )
            live = [r["instance_id"] for r in liveness if r["live"]]
            dead = [r["instance_id"] for r in liveness if r["dead"]]
            rows = await self.db.tasks.fetch(
                _INTERRUPTED, dead, cfg.recovery.batch_size, self.instance_id
            )
            requeued = sum(1 for r in rows if r["status"] == "queued")
            manual = sum(1 for r in rows if r["status"] == "manual_review")
            cleaned = await self.db.tasks.fetchrow(_CLEAN)
            assert cleaned is not None
            leases, admissions = int(cleaned["leases"]), int(cleaned["admissions"])
            yielded = len(
                await self.db.tasks.fetch(
                    _YIELD, cfg.admission_stale_after, cfg.recovery.batch_size
                )
            )
            rescued = await self.db.tasks.fetch(
                _ORPHANS,
                cfg.queue.name,
                cfg.recovery.stale_after,
                cfg.recovery.batch_size,
                self.instance_id,
                live,
                dead,
            )
            orphans = len(rescued)
        reenqueued = await self.reenqueue()
        report = RecoveryReport(
            requeued_tasks=requeued,
            manual_review_tasks=manual,
            released_leases=leases,
            cleaned_admissions=admissions,
            yielded_admissions=yielded,
            orphaned_jobs=orphans,
            reenqueued_tasks=reenqueued,
        )
        self.rounds += 1
        if report.total():
            log.warning(
                "recovered interrupted work",
                extra={"event": "recovery", **attrs.asdict(report)},
            )
        if self.on_report is not None:
            self.on_report(report)
        return report

    async def reenqueue(self) -> int:
        """Give every queued task without a live job a job; returns how many."""
        cfg = self.settings
        rollback_timeout = cfg.rollback_timeout
        async with self.db.tasks.transaction(rollback_timeout=rollback_timeout) as conn:
            rows = await conn.fetch(_RECOVERABLE, cfg.recovery.recoverable_task_limit)
            if not rows:
                return 0
            jobs = [TaskJob.from_record(r) for r in rows]
            await give_jobs(conn, jobs, queue=cfg.queue, notify_channel=self.notify_channel)
        return len(rows)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """A round now, then every ``recovery.interval`` seconds, until cancelled."""
        first = True
        while True:
            try:
                await self.run_once()
            except DatabaseError as exc:
                log.warning(
                    "recovery round abandoned",
                    extra={"event": "recovery_failed", "error": str(exc)},
                )
            if first:
                first = False
                task_status.started()
            await trio.sleep(self.settings.recovery.interval)
