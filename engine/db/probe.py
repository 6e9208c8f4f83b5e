"""Is the database reachable? A probe that answers for ``/healthz``.

Every ``interval`` seconds each distinct pool runs ``SELECT 1`` within ``timeout``; the
result goes to ``on_state(reachable)``. Changes are logged once each way, so an outage shows as
one warning when it starts and one line when it ends, not a line per probe.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import trio

from engine.db.database import Database
from engine.db.dsn import redact
from engine.errors import DatabaseError

__all__ = ["PROBE_TIMEOUT", "probe_database"]

log = logging.getLogger(__name__)

#: Seconds one probe statement may take before the database counts as unreachable.
PROBE_TIMEOUT = 5.0


async def probe_once(db: Database, *, timeout: float = PROBE_TIMEOUT) -> str | None:
    """Probe every distinct pool once; ``None`` if all answered, else why one did not.

    A probe that waited its whole ``timeout`` for a connection because every one of the pool's
    was busy counts as an answer: the database is serving those.
    """
    for pool in db.distinct_pools():
        with trio.move_on_after(timeout) as scope:
            try:
                await pool.fetchval("SELECT 1")
            except DatabaseError as exc:
                return f"{redact(pool.dsn)}: {exc}"
        if scope.cancelled_caught and pool.in_use() < pool.max_size():
            return f"{redact(pool.dsn)}: no answer within {timeout:g} s"
    return None


async def probe_database(
    db: Database,
    *,
    on_state: Callable[[bool], None],
    interval: float,
    timeout: float = PROBE_TIMEOUT,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Probe ``db`` every ``interval`` seconds until cancelled; see the module docstring."""
    task_status.started()
    reachable = True
    while True:
        await trio.sleep(interval)
        why = await probe_once(db, timeout=timeout)
        if (why is None) != reachable:
            reachable = why is None
            if reachable:
                log.info("the database answers again", extra={"event": "database_reachable"})
            else:
                log.warning(
                    "the database does not answer",
                    extra={"event": "database_unreachable", "error": why},
                )
        on_state(reachable)
