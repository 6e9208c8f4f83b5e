"""Start-up rides out a server that refuses connections for a while: ``too many clients``
(all its slots, or the role's, taken) is retried like an unreachable server."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import trio
import trio_asyncio

from engine.db.database import DatabaseUrls
from engine.service.engine import Engine
from engine.service.root import serve
from engine_tests.tasks.conftest import make_config


@asynccontextmanager
async def limited_role(db_url: str, limit: int) -> AsyncIterator[str]:
    """A login role that may hold ``limit`` connections; yields ``db_url`` as that role."""
    name = f"lim_{uuid.uuid4().hex[:8]}"
    admin = await trio_asyncio.aio_as_trio(asyncpg.connect)(db_url)
    try:
        await trio_asyncio.aio_as_trio(admin.execute)(
            f"CREATE ROLE {name} LOGIN PASSWORD 'pw' CONNECTION LIMIT {limit}; "
            f"GRANT ALL ON SCHEMA public TO {name}; "
            f"GRANT ALL ON ALL TABLES IN SCHEMA public TO {name}; "
            f"GRANT ALL ON ALL SEQUENCES IN SCHEMA public TO {name}; "
            f"GRANT ALL ON ALL FUNCTIONS IN SCHEMA public TO {name}"
        )
        parts = urlsplit(db_url)
        netloc = f"{name}:pw@{parts.hostname}:{parts.port}"
        yield urlunsplit(parts._replace(netloc=netloc))
    finally:
        await trio_asyncio.aio_as_trio(admin.execute)(
            f"SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = '{name}'"
        )
        await trio_asyncio.aio_as_trio(admin.execute)(f"DROP OWNED BY {name}; DROP ROLE {name}")
        await trio_asyncio.aio_as_trio(admin.close)()


async def test_a_start_refused_for_too_many_clients_is_retried(db_url: str) -> None:
    async with limited_role(db_url, 10) as url, AsyncExitStack() as held:
        hogs = [await trio_asyncio.aio_as_trio(asyncpg.connect)(url) for _ in range(10)]
        for hog in hogs:
            held.push_async_callback(trio_asyncio.aio_as_trio(hog.close))
        # The role's slots are all taken: a third connection is refused with 53300.
        try:
            await trio_asyncio.aio_as_trio(asyncpg.connect)(url)
        except asyncpg.TooManyConnectionsError:
            pass
        else:
            raise AssertionError("the role's connection limit did not hold")

        config = make_config(
            **{
                "database.connect_attempts": "1",
                "database.connect_retry_delay": "0.2",
                "database.pool_min_size": "1",
                "database.pool_max_size": "2",
                "worker.startup_attempts": "30",
                "worker.startup_retry_delay": "0.2",
                "metrics.enabled": "false",
                "tasks.demo_catalogue": "false",
            }
        )
        started: list[Engine] = []
        async with trio.open_nursery() as nursery:

            async def run(*, task_status: trio.TaskStatus[Engine]) -> None:
                await serve(config, urls=DatabaseUrls.single(url), task_status=task_status)

            async def free_slots_later() -> None:
                await trio.sleep(1.5)  # a few refused attempts first
                for hog in hogs:
                    await trio_asyncio.aio_as_trio(hog.close)()

            nursery.start_soon(free_slots_later)
            with trio.fail_after(30):
                started.append(await nursery.start(run))
            assert started[0].ready
            nursery.cancel_scope.cancel()
