"""The dashboard's reads: named queries of ``sql/queries``, each index-bound (see their comments).

Live counts come from partial indexes of live rows; anything over finished tasks is bounded by
a ``created_at`` range or a ``LIMIT`` on ``engine_task_created_index``, so a large history does
not make a page slow.
"""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import TYPE_CHECKING, Any, Final

import attrs

from engine.db.sqlfiles import QUERIES
from engine.domain.tasks import Task

if TYPE_CHECKING:
    # Type-only: the web layer serves the open Engine and sits below engine.service.
    from engine.service.engine import Engine

__all__ = ["Cursor", "TaskFilter", "find_by_upstream_ref", "live_by_model", "manual_review_page",
           "scope_usage", "task_page", "throughput"]  # fmt: skip

_PAGE: Final = QUERIES["task_page"]
_REVIEW_PAGE: Final = QUERIES["task_page_manual_review"]
_BY_REF: Final = QUERIES["task_find_by_upstream_ref"]
_LIVE_BY_MODEL: Final = QUERIES["task_count_live_by_model"]
_PER_MINUTE: Final = QUERIES["task_finished_per_minute"]
_SCOPE_USAGE: Final = QUERIES["scope_usage_all"]


@attrs.frozen
class Cursor:
    """Where a page ends: the last row's ``created_at`` and ``id``; text form ``iso|uuid``."""

    created_at: datetime
    id: uuid.UUID

    def text(self) -> str:
        """The cursor as a query-string value."""
        return f"{self.created_at.isoformat()}|{self.id}"

    @classmethod
    def parse(cls, text: str | None) -> Cursor | None:
        """The cursor of ``text``, or None when absent or malformed (the first page)."""
        if not text:
            return None
        stamp, _, ident = text.partition("|")
        try:
            return cls(datetime.fromisoformat(stamp), uuid.UUID(ident))
        except ValueError:
            return None

    @classmethod
    def after(cls, tasks: list[Task], limit: int) -> Cursor | None:
        """The cursor of the next page, or None when this one is the last."""
        if len(tasks) < limit:
            return None
        return cls(tasks[-1].created_at, tasks[-1].id)


@attrs.frozen
class TaskFilter:
    """The tasks page's filters (None: any)."""

    status: str | None = None
    model: str | None = None
    tenant_id: str | None = None
    group_key: str | None = None
    since: datetime | None = None
    until: datetime | None = None


async def task_page(
    engine: Engine, filters: TaskFilter, cursor: Cursor | None, limit: int
) -> list[Task]:
    """One page of tasks, newest first."""
    rows = await engine.db.tasks.fetch(
        _PAGE,
        filters.status,
        filters.model,
        filters.tenant_id,
        filters.group_key,
        filters.since,
        filters.until,
        None if cursor is None else cursor.created_at,
        None if cursor is None else cursor.id,
        limit,
    )
    return [Task.from_record(r) for r in rows]


async def manual_review_page(engine: Engine, cursor: Cursor | None, limit: int) -> list[Task]:
    """One page of the tasks in manual review, newest first."""
    rows = await engine.db.tasks.fetch(
        _REVIEW_PAGE,
        None if cursor is None else cursor.created_at,
        None if cursor is None else cursor.id,
        limit,
    )
    return [Task.from_record(r) for r in rows]


async def find_by_upstream_ref(
    engine: Engine, ref: str, since: datetime, limit: int = 50
) -> list[Task]:
    """Tasks created since ``since`` with upstream reference ``ref``."""
    rows = await engine.db.tasks.fetch(_BY_REF, ref, since, limit)
    return [Task.from_record(r) for r in rows]


async def live_by_model(engine: Engine) -> dict[str, dict[str, int]]:
    """``{model: {"queued": n, "running": n}}``."""
    out: dict[str, dict[str, int]] = {}
    for r in await engine.db.tasks.fetch(_LIVE_BY_MODEL):
        out.setdefault(r["model"], {"queued": 0, "running": 0})[r["status"]] = int(r["n"])
    return out


async def throughput(
    engine: Engine, minutes: int = 30, created_within: float = 3600.0
) -> list[dict[str, Any]]:
    """Tasks finished per minute over the last ``minutes``, oldest first:
    ``[{"minute": datetime, "total": n, "by_status": {status: n}}]``."""
    per: dict[datetime, dict[str, int]] = {}
    for r in await engine.db.tasks.fetch(_PER_MINUTE, created_within, minutes * 60.0):
        per.setdefault(r["minute"], {})[r["status"]] = int(r["n"])
    return [
        {"minute": minute, "total": sum(counts.values()), "by_status": counts}
        for minute, counts in sorted(per.items())
    ]


async def scope_usage(engine: Engine) -> dict[str, tuple[int, int]]:
    """``{scope: (slots in use, admissions waiting)}``."""
    return {
        r["scope"]: (int(r["used"]), int(r["waiting"]))
        for r in await engine.db.tasks.fetch(_SCOPE_USAGE)
    }
