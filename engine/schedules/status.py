"""What the schedules are doing, as read from the database (for ``status`` and the CLI)."""

from __future__ import annotations

from datetime import datetime

import attrs

from engine.db.bridge import Pool
from engine.db.sqlfiles import QUERIES

__all__ = ["ScheduleState", "list_schedules"]

_LIST = QUERIES["schedule_list"]


@attrs.frozen
class ScheduleState:
    """One schedule's row: its timing and target as the last leader declared them, its
    cursor, its next boundary and its counts."""

    name: str
    timing: str
    target: str
    last_period: datetime | None
    next_period: datetime | None
    fired_count: int
    passed_over_count: int
    last_fired_at: datetime | None
    last_error: str | None
    last_error_at: datetime | None
    declared_by: str
    declared_at: datetime


async def list_schedules(pool: Pool) -> list[ScheduleState]:
    """Every schedule any leader declared, by name."""
    return [ScheduleState(**dict(r)) for r in await pool.fetch(_LIST)]
