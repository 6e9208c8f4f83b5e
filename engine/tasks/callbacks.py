"""Upstream callbacks: recording a verified one durably, and deleting old ones.

``POST /hooks/<task id>`` (:mod:`engine.web.hooks`) verifies a callback with the task's
provider, then :func:`record_callback` writes it to ``engine_task_callback`` and sends the
NOTIFY that wakes the task's execution, in one statement. The row is the durable copy: an
execution between polls reads it when woken, and one that starts later (after a restart)
reads it before it polls. A delivery is recorded once per task (the primary key), which is
how a replay is refused.

The rows are deleted by the leader (:class:`CallbackCleaner`) a day after they arrived; a
replay that old is refused by its timestamp anyway.
"""

from __future__ import annotations

import enum
import json
import logging
import random
import uuid
from datetime import UTC, datetime, timedelta

import trio

from engine.db.bridge import Pool
from engine.db.sqlfiles import QUERIES
from engine.errors import DatabaseError
from engine.providers.base import Callback

__all__ = ["CallbackCleaner", "Recorded", "record_callback"]

log = logging.getLogger(__name__)

_RECORD = QUERIES["task_callback_record"]
_DELETE = QUERIES["task_callback_delete_before"]


class Recorded(enum.Enum):
    """What :func:`record_callback` did."""

    RECORDED = "recorded"
    #: Not written: the task is missing or final, or this delivery was recorded before.
    NOT_RECORDED = "not_recorded"


async def record_callback(pool: Pool, task_id: uuid.UUID, callback: Callback) -> Recorded:
    """Record ``callback`` for ``task_id`` (a live task) and wake its execution."""
    result = callback.result
    row = await pool.fetchrow(
        _RECORD,
        task_id,
        callback.delivery,
        callback.upstream_id,
        result.done,
        None if result.result is None else json.dumps(result.result, separators=(",", ":")),
        result.error,
        result.progress,
    )
    return Recorded.NOT_RECORDED if row is None else Recorded.RECORDED


class CallbackCleaner:
    """Deletes callbacks older than ``retention`` seconds, every ``interval`` (a leader-only
    service: one instance does it for the cluster)."""

    def __init__(
        self,
        pool: Pool,
        *,
        retention: float = 86_400.0,
        interval: float = 300.0,
        batch_size: int = 10_000,
    ) -> None:
        self.pool = pool
        self.retention = retention
        self.interval = interval
        self.batch_size = batch_size

    async def run_once(self, now: datetime | None = None) -> int:
        """One pass; returns how many callbacks were deleted."""
        cutoff = (now or datetime.now(UTC)) - timedelta(seconds=self.retention)
        deleted = 0
        while True:
            status = await self.pool.execute(_DELETE, cutoff, self.batch_size)
            n = int(status.split()[-1])
            deleted += n
            if n < self.batch_size:
                return deleted

    async def run(self) -> None:
        """Clean until cancelled; a failed pass is logged and tried again next time."""
        await trio.sleep(random.uniform(0, 1.0))  # stagger services started together
        while True:
            try:
                await self.run_once()
            except DatabaseError as exc:
                log.warning(
                    "callback cleaning failed",
                    extra={"event": "callback_cleaner_failed", "error": str(exc)},
                )
            await trio.sleep(self.interval)
