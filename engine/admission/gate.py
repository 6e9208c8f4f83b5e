"""The admission check a task passes after claiming its lease, before any work.

The claim of a task of a limited model or group holds the lease but leaves the task ``queued``
(a *pending* claim, see ``sql/queries/engine_task.sql``). :func:`admit` decides, and only when
it lets the task start does the task become ``running`` and count an attempt, in the same
transaction that takes its slots. So a task that waits for a scope slot, or for a scope's lock
while another admission holds it, is never seen running and never burns an attempt.

:class:`ScopeGate` is the admission gate the job handler is given (the protocol
:class:`engine.tasks.gates.AdmissionGate`, with the outcomes :class:`~engine.tasks.gates.Admitted`,
:class:`~engine.tasks.gates.Waiting` and :class:`~engine.tasks.gates.RateLimited`).
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING

import attrs
import trio

from engine.db.bridge import Pool, Record
from engine.db.sqlfiles import QUERIES
from engine.domain.tasks import Task
from engine.errors import LeaseUnavailable
from engine.tasks.gates import Admission, AdmissionGate, Admitted, RateLimited, Waiting

__all__ = ["ScopeCatalog", "ScopeGate", "admit"]

_LIMITS = QUERIES["scope_limits_for_task"]
_LOCK = QUERIES["scope_lock"]
_USAGE = QUERIES["scope_usage"]
_GET = QUERIES["admission_get"]
_WAIT = QUERIES["admission_wait"]
_TAKE = QUERIES["scope_lease_take"]
_ENSURE = QUERIES["rate_bucket_ensure"]
_TOKEN = QUERIES["rate_token_take"]
_TOKEN_WAIT = QUERIES["rate_token_wait"]
_START = QUERIES["task_start_admitted"]


class ScopeCatalog:
    """The limited scopes of each (model, group), read at most once per ``ttl`` seconds.

    Limits are read from ``catalog`` (the coordination database, where the catalogue lives);
    leases and admissions are written to ``pool`` (the tasks database).

    Only tasks the claim found limited come here (their claim reads the catalogue live); the
    cache saves each of them a catalogue query. A changed limit value applies within ``ttl``
    (the capacity refresher polls on a similar period); a limit the cache does not know yet
    is read again at once (:func:`admit`).
    """

    def __init__(self, pool: Pool, catalog: Pool | None = None, ttl: float = 1.0) -> None:
        self.pool = pool
        self.catalog = catalog or pool
        self.ttl = ttl
        self._cache: dict[tuple[str, str | None], tuple[float, list[Record]]] = {}

    async def scopes(
        self, model: str, group_key: str | None, *, fresh: bool = False
    ) -> list[Record]:
        """The rows of ``scope_limits_for_task`` for this model and group (read again now
        with ``fresh``, bypassing the cache)."""
        key = (model, group_key)
        now = trio.current_time()
        hit = self._cache.get(key)
        if not fresh and hit is not None and now - hit[0] < self.ttl:
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
    job_id: int | None = None,
    lease_ttl: float = 60.0,
    queue_timeout: float | None = None,
) -> Admission:
    """Decide whether ``task``, a pending claim (queued, holding ``token``), may start now.

    One transaction: lock the task's scopes in sorted order, check room and the line, then
    either take the slots (and rate tokens) and start the task (``running``, attempt counted,
    lease renewed for ``lease_ttl`` seconds), or join the line: the claim's lease is released,
    the task stays queued, and its job ``job_id`` is completed in the same transaction (see
    ``admission_wait``). A spent rate limit rolls everything back; the caller releases the
    claim with the delay.

    The claim read the limits live; the cached catalogue may not know a limit set within the
    last ``ttl`` seconds, and is then read again. A limit removed since the claim leaves
    nothing to check: the task starts.

    Raises:
        LeaseUnavailable: the token no longer holds the lease (the task was cancelled while
            its claim waited); nothing was written.
    """
    rows = await catalog.scopes(task.model, task.group_key)
    if not rows:
        rows = await catalog.scopes(task.model, task.group_key, fresh=True)
    pool = catalog.pool
    if not rows:
        started = await pool.fetchrow(_START, task.id, token, lease_ttl)
        if started is None:
            raise LeaseUnavailable()
        return Admitted(Task.from_record(started))
    concurrency = [r["scope"] for r in rows if (r["concurrency_limit"] or 0) > 0]
    limit = {r["scope"]: r["concurrency_limit"] for r in rows}
    rates = [r for r in rows if (r["rate_limit"] or 0) > 0]
    try:
        return await _decide(
            pool,
            task,
            token,
            owner,
            rows,
            concurrency,
            limit,
            rates,
            _Line(job_id, lease_ttl, queue_timeout),
        )
    except _RateLimitedRollback as limited:  # the transaction rolled back every token taken
        return limited.outcome


class ScopeGate:
    """The admission gate of the job handler: :func:`admit` over one :class:`ScopeCatalog`.

    Limits are read from ``catalog`` (the coordination database), admissions written to
    ``pool`` (the tasks database); see :class:`ScopeCatalog`.
    """

    def __init__(self, pool: Pool, catalog: Pool | None = None, ttl: float = 1.0) -> None:
        self.scopes = ScopeCatalog(pool, catalog, ttl)

    async def admit(
        self,
        task: Task,
        token: uuid.UUID,
        owner: str,
        *,
        job_id: int | None = None,
        lease_ttl: float = 60.0,
        queue_timeout: float | None = None,
    ) -> Admission:
        """Decide whether ``task``, a pending claim, may start now (see :func:`admit`)."""
        return await admit(
            self.scopes,
            task,
            token,
            owner,
            job_id=job_id,
            lease_ttl=lease_ttl,
            queue_timeout=queue_timeout,
        )


if TYPE_CHECKING:
    # The job handler is given a ScopeGate as its AdmissionGate: mypy holds it to the protocol.
    _AS_ADMISSION_GATE: type[AdmissionGate] = ScopeGate


@attrs.frozen
class _Line:
    """What the decision needs besides the limits: the asking job, the lease TTL to renew on
    start, and the queue timeout of a task that joins the line."""

    job_id: int | None
    lease_ttl: float
    queue_timeout: float | None


async def _decide(
    pool: Pool,
    task: Task,
    token: uuid.UUID,
    owner: str,
    rows: list[Record],
    concurrency: list[str],
    limit: dict[str, int],
    rates: list[Record],
    line: _Line,
) -> Admission:
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
                        if line.queue_timeout is None
                        else datetime.now(UTC) + timedelta(seconds=line.queue_timeout)
                    )
                    waits = await conn.fetchval(
                        _WAIT,
                        task.id,
                        concurrency,
                        task.group_key or "",
                        expires,
                        token,
                        line.job_id,
                    )
                    if waits is None:
                        raise LeaseUnavailable()
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
        started = await conn.fetchrow(_START, task.id, token, line.lease_ttl)
        if started is None:
            raise LeaseUnavailable()  # rolls back the tokens taken above
        if concurrency:
            await conn.execute(_TAKE, task.id, concurrency, owner)
    return Admitted(Task.from_record(started), tuple(concurrency))


class _RateLimitedRollback(Exception):
    def __init__(self, outcome: RateLimited) -> None:
        super().__init__(outcome.scope)
        self.outcome = outcome
