"""Pools for the three database roles: tasks, coordination and queue.

The reference keeps three stores (``reference-semantics.md`` §1): tasks (the enqueue transaction
runs there, so River's tables live in that database), coordination (capacity, registry, recovery,
admissions) and queue (the pool River's driver uses). Their URLs default to one; roles that share
a URL share one pool, so connection accounting (the load sampler sums distinct pools) stays right.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager

import attrs
import trio

from engine.db.bridge import Pool, asyncio_loop, create_pool
from engine.db.dsn import redact
from engine.errors import ConnectionLost

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
    *,
    min_size: int = 1,
    max_size: int = 10,
    statement_cache_size: int = 100,
    lock_timeout: float | None = None,
    command_timeout: float | None = None,
    attempts: int = 3,
    retry_delay: float = 2.0,
    application_name: str = "engine",
) -> AsyncIterator[Database]:
    """Open the role pools, retrying an unreachable server ``attempts`` times.

    The reference retries start-up 3 times 2 s apart and then gives up loudly (§5.3); so do we
    (``database.connect_attempts``), and the service retries its whole start on top of that
    (``worker.startup_attempts``, :func:`engine.service.main.run_service`).

    Raises:
        ConnectionLost: the server could not be reached after every attempt; the message names
            the URL (without its password) and the last error.
    """
    async with asyncio_loop(), AsyncExitStack() as stack:
        pools: dict[str, Pool] = {}
        for url in dict.fromkeys((urls.tasks, urls.coordination, urls.queue)):
            pool = await _create_with_retry(
                url,
                attempts=max(1, attempts),
                retry_delay=retry_delay,
                min_size=min_size,
                max_size=max_size,
                statement_cache_size=statement_cache_size,
                lock_timeout=lock_timeout,
                command_timeout=command_timeout,
                application_name=application_name,
            )
            stack.push_async_callback(pool.close)
            pools[url] = pool
        yield Database(urls, pools[urls.tasks], pools[urls.coordination], pools[urls.queue])


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
