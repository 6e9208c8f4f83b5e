"""The admission dispatcher: admits waiting tasks as room frees up, and reaps timed-out ones.

Woken by NOTIFY ``engine_admission`` (sent whenever a scope lease is released) and by a tick
(``admission.dispatch_interval``); reaps every ``admission.reap_interval``. One round:

* take the dispatch lock (one decision at a time across every dispatcher, on any instance),
  then each involved scope's lock in sorted order (the same locks executors take);
* walk the waiting admissions round-robin across groups, oldest first within each group; admit
  one when every scope it needs has room; a scope whose oldest waiter cannot go yet admits
  nobody behind it (first in, first out within a scope);
* mark the chosen ones admitted (a reserved slot) and enqueue their jobs, in that transaction.
"""

from __future__ import annotations

import logging
import math
import uuid
from collections import OrderedDict, deque

import attrs
import trio

from engine.admission.config import AdmissionConfig
from engine.db.bridge import Connection, Pool, Record
from engine.db.channels import ADMISSION
from engine.db.database import Database
from engine.db.listen import ListenHub, wakeup
from engine.db.sqlfiles import QUERIES
from engine.errors import DatabaseError
from engine.queue.config import QueueConfig
from engine.tasks.jobs import TaskJob, give_jobs

__all__ = ["DispatchReport", "Dispatcher", "DispatcherSettings"]

log = logging.getLogger(__name__)

_LOCK_DISPATCH = "SELECT pg_advisory_xact_lock(hashtext('engine.dispatch'))"
_SCOPE_LOCK = QUERIES["scope_lock"]
_WAITING = QUERIES["admission_list_waiting"]
_LIMITS = QUERIES["scope_limits_many"]
_USED = QUERIES["scope_used_many"]
_ADMIT = QUERIES["admission_admit_many"]
_REAP = QUERIES["admission_reap_expired"]
# What the admitted tasks' jobs need: when they are due, and the model that routes a live one.
_TASK_RUN_AT = """
SELECT id, next_run_at, model, run_mode FROM engine_task WHERE id = ANY($1::uuid[])
"""


@attrs.frozen
class DispatchReport:
    """What one round did."""

    admitted: int = 0
    waiting: int = 0


@attrs.frozen
class DispatcherSettings:
    """What the dispatcher reads of the configuration.

    Attributes:
        admission: the ``[admission]`` section (round and reap intervals).
        queue: the ``[queue]`` section, for the jobs of admitted tasks.
        rollback_timeout: seconds a failed admission's rollback may take
            (``worker.enqueue_rollback_timeout``).
    """

    admission: AdmissionConfig
    queue: QueueConfig
    rollback_timeout: float


class Dispatcher:
    """Admits waiting tasks; see the module docstring.

    ``hub``: the process's LISTEN connection, whose ``engine_admission`` wakes a round (None:
    ticks only).
    """

    def __init__(
        self,
        settings: DispatcherSettings,
        db: Database,
        notify_channel: str | None = None,
        *,
        batch: int = 1000,
        hub: ListenHub | None = None,
    ) -> None:
        self.hub = hub
        self.settings = settings
        self.db = db
        self.notify_channel = notify_channel
        self.batch = batch
        self.rounds = 0
        self.admitted = 0
        self.reaped = 0

    async def run_once(self) -> DispatchReport:
        """One dispatch round."""
        self.rounds += 1
        # The catalogue may live in another database (coordination). Read its limits before
        # taking any lock: waiting for a second pooled connection while holding scope locks
        # deadlocks once executions waiting on those locks hold the rest of the pool.
        separate = self.db.coordination is not self.db.tasks
        limits: dict[str, float] = {}
        if separate:
            preview = await self.db.tasks.fetch(_WAITING, self.batch)
            if not preview:
                return DispatchReport()
            limits = await _limits(self.db.coordination, {s for r in preview for s in r["scopes"]})
        rollback_timeout = self.settings.rollback_timeout
        async with self.db.tasks.transaction(rollback_timeout=rollback_timeout) as conn:
            await conn.execute(_LOCK_DISPATCH)
            waiting = await conn.fetch(_WAITING, self.batch)
            if not waiting:
                return DispatchReport()
            scopes = sorted({s for row in waiting for s in row["scopes"]})
            for scope in scopes:
                await conn.execute(_SCOPE_LOCK, scope)
            if not separate:
                limits = await _limits(conn, set(scopes))
            # A scope that appeared since the preview waits for the next round.
            limits = {s: limits.get(s, 0) for s in scopes}
            used = {r["scope"]: int(r["used"]) for r in await conn.fetch(_USED, scopes)}
            chosen = _choose(waiting, limits, used)
            if not chosen:
                return DispatchReport(0, len(waiting))
            await conn.execute(_ADMIT, chosen)
            tasks = {r["id"]: r for r in await conn.fetch(_TASK_RUN_AT, chosen)}
            jobs = [_task_job(task_id, tasks.get(task_id)) for task_id in chosen]
            queue = self.settings.queue
            await give_jobs(conn, jobs, queue=queue, notify_channel=self.notify_channel)
        self.admitted += len(chosen)
        return DispatchReport(len(chosen), len(waiting) - len(chosen))

    async def reap(self) -> int:
        """Fail tasks that waited past their queue timeout; returns how many."""
        rows = await self.db.tasks.fetch(_REAP)
        if rows:
            log.warning(
                "tasks timed out waiting for admission",
                extra={"event": "admission_timeout", "count": len(rows)},
            )
        self.reaped += len(rows)
        return len(rows)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Dispatch until cancelled; ``started()`` once subscribed to ``engine_admission``."""
        cfg = self.settings.admission
        with wakeup(self.hub, ADMISSION) as wake:
            task_status.started()
            next_reap = trio.current_time()
            while True:
                try:
                    if trio.current_time() >= next_reap:
                        next_reap = trio.current_time() + cfg.reap_interval
                        await self.reap()
                    await self.run_once()
                except DatabaseError as exc:
                    log.warning(
                        "dispatch round failed",
                        extra={"event": "dispatch_failed", "error": str(exc)},
                    )
                with trio.move_on_after(cfg.dispatch_interval):
                    await wake.wait()


def _task_job(task_id: uuid.UUID, row: Record | None) -> TaskJob:
    """The job of an admitted task: due at its ``next_run_at``, routed by its model if live."""
    if row is None:  # the task is gone: its job finds no task and completes
        return TaskJob(task_id)
    return TaskJob.from_record(row)


async def _limits(source: Pool | Connection, scopes: set[str]) -> dict[str, float]:
    """Concurrency limit per scope (``math.inf`` when the scope has none)."""
    limits: dict[str, float] = {s: math.inf for s in scopes}
    for row in await source.fetch(_LIMITS, sorted(scopes)):
        if (row["concurrency_limit"] or 0) > 0:
            limits[row["scope"]] = row["concurrency_limit"]
    return limits


def _choose(
    waiting: list[Record], limits: dict[str, float], used: dict[str, int]
) -> list[uuid.UUID]:
    """Pick admissions to admit: round-robin across groups, FIFO within a group and a scope."""
    groups: OrderedDict[str, deque[Record]] = OrderedDict()
    for row in waiting:  # already oldest first, so groups are ordered by their oldest waiter
        groups.setdefault(row["group_key"], deque()).append(row)
    blocked: set[str] = set()
    chosen: list[uuid.UUID] = []
    while groups:
        for group in list(groups):
            row = groups[group].popleft()
            if not groups[group]:
                del groups[group]
            needs = row["scopes"]
            if any(s in blocked for s in needs):
                blocked.update(needs)
                continue
            if all(used.get(s, 0) < limits.get(s, math.inf) for s in needs):
                for s in needs:
                    used[s] = used.get(s, 0) + 1
                chosen.append(row["task_id"])
            else:
                blocked.update(needs)
    return chosen
