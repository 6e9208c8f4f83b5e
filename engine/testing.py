"""Helpers for the tests of applications that embed engine: a real database, and an engine on
it that runs tasks to completion.

::

    async def test_my_provider():
        async with engine.testing.open_test_engine(providers={"my-model": MyProvider()}) as eng:
            await eng.set_model("my-model")
            task = await eng.wait(await eng.submit(request), timeout=10)
            assert task.status is engine.TaskStatus.SUCCEEDED

The database is a fresh one, migrated, on the server named by ``ENGINE_TEST_DATABASE_URL`` (a
user that may create databases) or, when that is unset, on a private embedded server started for
the block (fsync off: fast, and disposable). It is dropped afterwards.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import uuid
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any

import trio

from engine.config import load_config
from engine.db import embedded
from engine.db.bridge import asyncio_loop
from engine.db.database import DatabaseUrls
from engine.db.resolve import scratch_database
from engine.providers.base import Provider
from engine.service.engine import Engine
from engine.service.root import open as open_engine
from engine.tasks.models import Task

__all__ = ["open_test_engine", "run_until_final", "temporary_database"]


def _start_private_server() -> tuple[embedded.EmbeddedServer, Path]:
    data_dir = Path(tempfile.mkdtemp(prefix="engine-testing-"))
    data_dir.chmod(0o755)  # reachable by the server's own user when we run as root
    return embedded.acquire(data_dir, unsafe_fast=True), data_dir


@asynccontextmanager
async def temporary_database(admin_url: str | None = None) -> AsyncIterator[str]:
    """Yield the URL of a fresh, migrated database; drop it (and any server started) after."""
    async with AsyncExitStack() as stack:
        await stack.enter_async_context(asyncio_loop())
        admin_url = admin_url or os.environ.get("ENGINE_TEST_DATABASE_URL")
        if not admin_url:
            server, data_dir = await trio.to_thread.run_sync(_start_private_server)
            stack.callback(shutil.rmtree, data_dir, True)
            stack.callback(server.release)
            admin_url = server.dsn("postgres")
        yield await stack.enter_async_context(scratch_database(admin_url, "engine_test_"))


@asynccontextmanager
async def open_test_engine(
    *,
    providers: Mapping[str, Provider] | None = None,
    simulated: Provider | None = None,
    url: str | None = None,
    max_workers: int = 16,
    settings: Mapping[str, Any] | None = None,
) -> AsyncIterator[Engine]:
    """The whole engine (the tree ``engine.open`` runs, with a fixed capacity of
    ``max_workers``) on a temporary database (or on ``url``), with fast polling.

    ``settings`` are config overrides by dotted name (``{"tasks.lease_ttl": 5}``).
    """
    overrides = {
        "database.migrate_on_start": "false",
        "queue.fetch_poll_interval": "0.2",
        "queue.completer_tick": "0.01",
        "metrics.enabled": "false",
        "worker.capacity": "fixed",
        "worker.hard_limit": str(max_workers),
        "worker.shutdown_drain_timeout": "0",
        **{key: str(value) for key, value in (settings or {}).items()},
    }
    config = load_config(env={}, overrides=overrides)
    async with AsyncExitStack() as stack:
        await stack.enter_async_context(asyncio_loop())
        if url is None:
            url = await stack.enter_async_context(temporary_database())
        engine = await stack.enter_async_context(
            open_engine(
                config, urls=DatabaseUrls.single(url), providers=providers, simulated=simulated
            )
        )
        yield engine


async def run_until_final(
    engine: Engine, ids: Sequence[uuid.UUID], timeout: float = 30.0
) -> list[Task]:
    """Wait until every task in ``ids`` is final; return them in the same order."""
    with trio.fail_after(timeout):
        return [await engine.wait(task_id) for task_id in ids]
