"""The admission check a task passes after claiming its lease, before any work (§6.11 step 2)."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import attrs
import trio

from engine.db.bridge import Pool, Record
from engine.db.sqlfiles import QUERIES
from engine.tasks.models import Task

__all__ = ["Admitted", "RateLimited", "ScopeCatalog", "Waiting", "admit"]

_LIMITS = QUERIES["scope_limits_for_task"]
_LOCK = QUERIES["scope_lock"]
_USAGE = QUERIES["scope_usage"]
_GET = QUERIES["admission_get"]
_WAIT = QUERIES["admission_wait"]
_TAKE = QUERIES["scope_lease_take"]
_ENSURE = QUERIES["rate_bucket_ensure"]
_TOKEN = QUERIES["rate_token_take"]
_TOKEN_WAIT = QUERIES["rate_token_wait"]


@attrs.frozen
class Admitted:
    """Go ahead: the task holds a slot in each of ``scopes``."""

    scopes: tuple[str, ...] = ()


@attrs.frozen
class Waiting:
    """A scope is full or others wait ahead: the task now waits in line (it is queued again,
    and the dispatcher enqueues it when there is room)."""

    scopes: tuple[str, ...]


@attrs.frozen
class RateLimited:
    """A scope's rate limit is spent: try again in ``delay`` seconds (nothing was taken)."""

    scope: str
    delay: float


Outcome = Admitted | Waiting | RateLimited


class ScopeCatalog:
    """The limited scopes of each (model, group), read at most once per ``ttl`` seconds.

    Limits are read from ``catalog`` (the coordination database, where the catalogue lives);
    leases and admissions are written to ``pool`` (the tasks database).

    Admission runs for every task; without this cache an unlimited model would still cost a
    query per task. A changed limit applies within ``ttl`` (the capacity refresher polls on a
    similar period).
    """

    def __init__(self, pool: Pool, catalog: Pool | None = None, ttl: float = 1.0) -> None:
        self.pool = pool
        self.catalog = catalog or pool
        self.ttl = ttl
        self._cache: dict[tuple[str, str | None], tuple[float, list[Record]]] = {}

    async def scopes(self, model: str, group_key: str | None) -> list[Record]:
        """The rows of ``scope_limits_for_task`` for this model and group."""
        key = (model, group_key)
        now = trio.current_time()
        hit = self._cache.get(key)
        if hit is not None and now - hit[0] < self.ttl:
            return hit[1]
        rows = await self.catalog.fetch(_LIMITS, model, group_key)
        self._cache[key] = (now, rows)
        return rows


async def admit(
    catalog: ScopeCatalog,
    task: Task,
    token: uuid.UUID,
    owner: str,
    *,
    queue_timeout: float | None = None,
) -> Outcome:
    """Decide whether ``task`` (running under ``token``) may start now; see the package doc.

    One transaction: lock the task's scopes in sorted order, check room and the line, then
    either take the slots (and rate tokens) or join the line and give the task back to the
    queue. Tasks of unlimited models and groups pass at once, without a query.
    """
    rows = await catalog.scopes(task.model, task.group_key)
    if not rows:
        return Admitted()
    pool = catalog.pool
    concurrency = [r["scope"] for r in rows if (r["concurrency_limit"] or 0) > 0]
    limit = {r["scope"]: r["concurrency_limit"] for r in rows}
    rates = [r for r in rows if (r["rate_limit"] or 0) > 0]
    try:
        return await _decide(
            pool, task, token, owner, rows, concurrency, limit, rates, queue_timeout
        )
    except _RateLimitedRollback as limited:  # the transaction rolled back every token taken
        return limited.outcome


async def _decide(
    pool: Pool,
    task: Task,
    token: uuid.UUID,
    owner: str,
    rows: list[Record],
    concurrency: list[str],
    limit: dict[str, int],
    rates: list[Record],
    queue_timeout: float | None,
) -> Outcome:
    async with pool.transaction() as conn:
        for row in rows:
            await conn.execute(_LOCK, row["scope"])
        if concurrency:
            admission = await conn.fetchrow(_GET, task.id)
            reserved = admission is not None and admission["status"] == "admitted"
            if not reserved:
                usage = await conn.fetch(_USAGE, concurrency, task.id)
                full = [
                    u["scope"]
                    for u in usage
                    if u["used"] >= limit[u["scope"]] or u["others_waiting"]
                ]
                if full:
                    expires = (
                        None
                        if queue_timeout is None
                        else datetime.now(UTC) + timedelta(seconds=queue_timeout)
                    )
                    await conn.execute(
                        _WAIT, task.id, concurrency, task.group_key or "", expires, token
                    )
                    return Waiting(tuple(full))
        for row in rates:
            await conn.execute(_ENSURE, row["scope"], float(row["rate_limit"]))
            taken = await conn.fetchrow(
                _TOKEN, row["scope"], float(row["rate_limit"]), row["rate_interval"], task.id
            )
            if taken is None:
                delay = await conn.fetchval(
                    _TOKEN_WAIT, row["scope"], float(row["rate_limit"]), row["rate_interval"]
                )
                raise _RateLimitedRollback(RateLimited(row["scope"], float(delay or 0.0)))
        if concurrency:
            await conn.execute(_TAKE, task.id, concurrency, owner)
    return Admitted(tuple(concurrency))


class _RateLimitedRollback(Exception):
    def __init__(self, outcome: RateLimited) -> None:
        super().__init__(outcome.scope)
        self.outcome = outcome
