"""Pools for the three database roles: tasks, coordination and queue.

There are three roles: tasks (the enqueue transaction runs there, so the job queue's River tables
live in that database), coordination (capacity, registry, recovery, admissions) and queue (fetch,
completion and the queue's maintenance). Their URLs default to one; roles that share a URL share
one pool, so connection accounting (the load sampler sums distinct pools) stays right.

The URLs may differ (other users, other settings, a proxy), but today they must reach one
database: a task and its job are written in one transaction, and finishing a task releases its
scope slots in the same statement. :func:`open_database` checks that and names the setting to fix,
instead of letting a role read empty tables.

Behind a pooler in transaction pooling mode (``pooler="transaction"``, PgBouncer's
``pool_mode = transaction``) the pools keep no session state (see :mod:`engine.db.bridge`),
and LISTEN, which needs a session of its own, goes to ``listen_url``: a direct URL of the same
database, checked like the role URLs. Without one nothing listens and every consumer of
notifications works at its poll interval instead.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager

import attrs
import trio

from engine.db.bridge import Pool, asyncio_loop, connect, create_pool
from engine.db.config import DatabaseConfig
from engine.db.dsn import redact
from engine.db.sqlfiles import QUERIES
from engine.errors import ConfigError, ConnectionLost

__all__ = ["Database", "DatabaseUrls", "open_database"]

log = logging.getLogger(__name__)


@attrs.frozen
class DatabaseUrls:
    """Where each role's data lives; the three are usually one URL."""

    tasks: str
    coordination: str
    queue: str

    @classmethod
    def single(cls, url: str) -> DatabaseUrls:
        """All three roles on one database."""
        return cls(url, url, url)


@attrs.frozen
class Database:
    """The open pools, one per role (shared where the URLs are equal)."""

    urls: DatabaseUrls
    tasks: Pool
    coordination: Pool
    queue: Pool

    def distinct_pools(self) -> list[Pool]:
        """Each pool once, for connection accounting and shutdown."""
        seen: dict[int, Pool] = {}
        for pool in (self.tasks, self.coordination, self.queue):
            seen.setdefault(id(pool), pool)
        return list(seen.values())


@asynccontextmanager
async def open_database(
    urls: DatabaseUrls,
    settings: DatabaseConfig | None = None,
    *,
    min_size: int | None = None,
    max_size: int | None = None,
    application_name: str = "engine",
) -> AsyncIterator[Database]:
    """Open the role pools with every setting of the ``[database]`` section ``settings``
    (its defaults if None), retrying an unreachable server ``database.connect_attempts``
    times; ``min_size`` and ``max_size`` replace the section's pool sizes when given.

    ``database.pooler`` says what the role URLs go through and ``database.listen_url`` is
    the direct URL for LISTEN (see the module docstring): each pool's
    :attr:`~engine.db.bridge.Pool.listen_dsn`. URLs are not read from ``settings``: they come
    resolved in ``urls`` (:mod:`engine.db.resolve`).

    An unreachable server is tried ``database.connect_attempts`` times (3 by default,
    ``database.connect_retry_delay`` apart) before this gives up loudly, and the service retries
    its whole start on top of that (``worker.startup_attempts``,
    :func:`engine.service.root.serve`).

    Raises:
        ConnectionLost: the server could not be reached after every attempt; the message names
            the URL (without its password) and the last error.
        ConfigError: a role's URL, or ``listen_url``, reaches another database than the tasks
            URL (see the module docstring).
    """
    dbc = DatabaseConfig() if settings is None else settings
    pooler, listen_url = dbc.pooler, dbc.listen_url
    if pooler == "transaction":
        log.info(
            "behind a transaction pooler: no prepared statement cache, lock_timeout per "
            "transaction, %s",
            f"LISTEN on {redact(listen_url)}" if listen_url else "no LISTEN (polling)",
            extra={"event": "database_pooler", "pooler": pooler},
        )
    async with asyncio_loop(), AsyncExitStack() as stack:
        pools: dict[str, Pool] = {}
        for url in dict.fromkeys((urls.tasks, urls.coordination, urls.queue)):
            pool = await _create_with_retry(
                url,
                attempts=dbc.connect_attempts,
                retry_delay=dbc.connect_retry_delay,
                min_size=dbc.pool_min_size if min_size is None else min_size,
                max_size=dbc.pool_max_size if max_size is None else max_size,
                statement_cache_size=dbc.statement_cache_size,
                lock_timeout=dbc.lock_timeout,
                command_timeout=dbc.command_timeout,
                application_name=application_name,
                pooler=pooler,
                listen_dsn=listen_url,
            )
            stack.push_async_callback(pool.close)
            pools[url] = pool
        if len(pools) > 1 or (listen_url is not None and listen_url != urls.tasks):
            await _check_one_database(urls, pools, listen_url)
        yield Database(urls, pools[urls.tasks], pools[urls.coordination], pools[urls.queue])


_MARK = QUERIES["session_mark_for_transaction"]
_COUNT_MARKED = QUERIES["session_count_marked"]


async def _check_one_database(
    urls: DatabaseUrls, pools: dict[str, Pool], listen_url: str | None = None
) -> None:
    """Raise :class:`ConfigError` unless every role's pool, and ``listen_url``, reach the tasks
    pool's database.

    URLs cannot tell (``localhost`` and ``127.0.0.1``, a proxy, another user), so a tasks
    connection marks itself with a one-off application name for one transaction, and each other
    pool (and a connection of ``listen_url``) looks for that session in its own database.
    """
    probe = f"engine-probe-{uuid.uuid4().hex}"
    problems = []
    async with pools[urls.tasks].transaction() as conn:
        await conn.execute(_MARK, probe)
        for field, url, why in (
            (
                "database.queue_url",
                urls.queue,
                "a task and its job are written in one transaction",
            ),
            (
                "database.coordination_url",
                urls.coordination,
                "engine runs the coordination tables in the tasks database for now "
                "(docs/operations.md, Known limitations)",
            ),
        ):
            if url != urls.tasks and not await pools[url].fetchval(_COUNT_MARKED, probe):
                problems.append(
                    f"{field} ({redact(url)}) reaches another database than the tasks URL "
                    f"({redact(urls.tasks)}); {why}: point {field} at the same database, or "
                    f"unset it"
                )
        if listen_url is not None and listen_url != urls.tasks:
            direct = await connect(listen_url, application_name=f"{probe}-listen")
            try:
                found = await direct.fetchval(_COUNT_MARKED, probe)
            finally:
                await direct.close()
            if not found:
                problems.append(
                    f"database.listen_url ({redact(listen_url)}) reaches another database than "
                    f"the tasks URL ({redact(urls.tasks)}); notifications are sent in the tasks "
                    "database: point database.listen_url at that database, directly (not "
                    "through the pooler)"
                )
    if problems:
        raise ConfigError(problems)


async def _create_with_retry(url: str, *, attempts: int, retry_delay: float, **kw: object) -> Pool:
    last: Exception | None = None
    for attempt in range(1, attempts + 1):
        try:
            return await create_pool(url, **kw)  # type: ignore[arg-type]
        except ConnectionLost as exc:
            last = exc
            if attempt < attempts:
                log.warning(
                    "database unreachable, retrying",
                    extra={"event": "database_retry", "attempt": attempt, "url": redact(url)},
                )
                await trio.sleep(retry_delay)
    raise ConnectionLost(
        f"could not connect to {redact(url)} after {attempts} attempt(s): {last}"
    ) from last
