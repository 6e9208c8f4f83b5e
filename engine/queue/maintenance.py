"""Leader-only maintenance: the scheduler and the cleaner.

Each service is a loop around ``run_once`` (which tests call directly); a failed pass is logged
and the loop goes on; each pass works in batches until a batch comes back short.
"""

from __future__ import annotations

import logging
import random
from datetime import UTC, datetime, timedelta

import attrs
import trio

from engine.db.bridge import Pool
from engine.db.sqlfiles import QUERIES
from engine.errors import DatabaseError
from engine.queue.config import QueueConfig
from engine.queue.notifier import notify_queues

__all__ = ["CleanerConfig", "JobCleaner", "JobScheduler", "SchedulerConfig"]

log = logging.getLogger(__name__)

_SCHEDULE = QUERIES["job_schedule"]
_DELETE = QUERIES["job_delete_before"]


@attrs.frozen
class SchedulerConfig:
    """The scheduler's period (``queue.scheduler_interval``) and batch size (River's 10,000);
    made by :meth:`from_section`."""

    interval: float
    batch_size: int = 10_000

    @classmethod
    def from_section(cls, section: QueueConfig) -> SchedulerConfig:
        """The scheduler of the ``[queue]`` section."""
        return cls(interval=section.scheduler_interval)


class JobScheduler:
    """Moves due scheduled and retryable jobs to available and wakes their queues."""

    def __init__(self, pool: Pool, insert_channel: str, config: SchedulerConfig) -> None:
        self.pool = pool
        self.insert_channel = insert_channel
        self.config = config

    async def run_once(self, now: datetime | None = None) -> tuple[int, int]:
        """One pass; returns (made available, discarded for a unique conflict)."""
        available = discarded = 0
        while True:
            async with self.pool.acquire() as conn:
                rows = await conn.fetch(_SCHEDULE, now, self.config.batch_size)
                horizon = (now or datetime.now(UTC)) + timedelta(milliseconds=5)
                due_queues = {
                    r["queue"]
                    for r in rows
                    if r["state"] == "available" and r["scheduled_at"] <= horizon
                }
                await notify_queues(conn, self.insert_channel, due_queues)
            available += sum(1 for r in rows if r["state"] == "available")
            discarded += sum(1 for r in rows if r["state"] == "discarded")
            if len(rows) < self.config.batch_size:
                return available, discarded

    async def run(self) -> None:
        """Loop until cancelled."""
        await _loop("scheduler", self.config.interval, self.run_once)


@attrs.frozen
class CleanerConfig:
    """The cleaner's period and the retention per final state, in seconds (None keeps
    forever), from the ``[queue]`` section (:meth:`from_section`); batches of River's 10,000."""

    interval: float
    completed_retention: float | None
    cancelled_retention: float | None
    discarded_retention: float | None
    batch_size: int = 10_000

    @classmethod
    def from_section(cls, section: QueueConfig) -> CleanerConfig:
        """The cleaner of the ``[queue]`` section."""
        return cls(
            interval=section.cleaner_interval,
            completed_retention=section.completed_retention,
            cancelled_retention=section.cancelled_retention,
            discarded_retention=section.discarded_retention,
        )


class JobCleaner:
    """Deletes finalized jobs past their retention."""

    def __init__(self, pool: Pool, config: CleanerConfig) -> None:
        self.pool = pool
        self.config = config

    def _cutoff(self, now: datetime, retention: float | None) -> datetime | None:
        return None if retention is None else now - timedelta(seconds=retention)

    async def run_once(self, now: datetime | None = None) -> int:
        """One pass; returns how many jobs were deleted."""
        now = now or datetime.now(UTC)
        cfg = self.config
        deleted = 0
        while True:
            status = await self.pool.execute(
                _DELETE,
                self._cutoff(now, cfg.completed_retention),
                self._cutoff(now, cfg.cancelled_retention),
                self._cutoff(now, cfg.discarded_retention),
                cfg.batch_size,
            )
            n = int(status.split()[-1])
            deleted += n
            if n < cfg.batch_size:
                return deleted

    async def run(self) -> None:
        """Loop until cancelled."""
        await _loop("cleaner", self.config.interval, self.run_once)


async def _loop(name: str, interval: float, run_once: object) -> None:
    # A random first delay staggers services started together (River: 0–1 s).
    await trio.sleep(random.uniform(0, min(1.0, interval)))
    while True:
        try:
            await run_once()  # type: ignore[operator]
        except DatabaseError as exc:
            log.warning(
                "maintenance pass failed", extra={"event": f"{name}_failed", "error": str(exc)}
            )
        await trio.sleep(interval)
