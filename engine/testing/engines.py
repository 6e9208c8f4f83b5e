"""An engine for tests: the whole service tree on a throw-away database, with fast polling.

::

    async def test_my_provider():
        async with engine.testing.open_test_engine(providers={"my-model": MyProvider()},
                                                   register_models=True) as eng:
            task = await eng.wait(await eng.submit(request), timeout=10)
            assert task.status is engine.TaskStatus.SUCCEEDED

Without ``url`` the database is a fresh one, migrated, on the server named by
``ENGINE_TEST_DATABASE_URL`` (a user that may create databases) or, when that is unset, on a
private embedded server started for the block (fsync off: fast, and disposable; see
:mod:`engine.testing.server` for the ready cluster it starts from). It is dropped afterwards. The
pytest plugin (:mod:`engine.testing.plugin`) shares one server per session instead.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any, Final

import trio

from engine.config import load_config
from engine.db.bridge import asyncio_loop
from engine.db.database import DatabaseUrls
from engine.db.resolve import scratch_database
from engine.domain.tasks import Task
from engine.providers.base import Provider
from engine.service.engine import Engine
from engine.service.root import open as open_engine
from engine.testing.server import (
    DATABASE_URL_ENV,
    SessionServer,
    clone_database,
    start_session_server,
)

__all__ = ["MANUAL_SETTINGS", "TEST_SETTINGS", "open_test_engine", "run_until_final",
           "temporary_database"]  # fmt: skip

#: The settings of a test engine: fast polling and ticks, no metrics server, a fixed capacity
#: (no instance registry), no drain at the end of the block (what still runs is requeued at
#: once), and the schema already migrated (the test database is a migrated copy).
TEST_SETTINGS: Final[Mapping[str, str]] = {
    "database.migrate_on_start": "false",
    "queue.fetch_poll_interval": "0.2",
    "queue.completer_tick": "0.01",
    "queue.scheduler_interval": "0.2",
    "admission.dispatch_interval": "0.1",
    "metrics.enabled": "false",
    "worker.capacity": "fixed",
    "worker.shutdown_drain_timeout": "0",
    "worker.startup_attempts": "1",
}

#: What makes an engine store tasks and run none (``manual`` mode): the client mode of
#: ``python -m engine`` (``worker.mode = "client"``), which submits, reads, waits and cancels
#: but claims no job. :func:`engine.testing.drain` runs what it stored.
MANUAL_SETTINGS: Final[Mapping[str, str]] = {"worker.mode": "client"}


@asynccontextmanager
async def temporary_database(admin_url: str | None = None) -> AsyncIterator[str]:
    """Yield the URL of a fresh, migrated database; drop it (and any server started) after.

    On ``admin_url`` (or ``ENGINE_TEST_DATABASE_URL``) the database is made and migrated;
    without either it is a copy of the template of a private embedded server started for the
    block (:func:`engine.testing.server.start_session_server`).
    """
    async with AsyncExitStack() as stack:
        await stack.enter_async_context(asyncio_loop())
        admin_url = admin_url or os.environ.get(DATABASE_URL_ENV)
        if admin_url:
            yield await stack.enter_async_context(scratch_database(admin_url, "engine_test_"))
            return
        server = await trio.to_thread.run_sync(start_session_server)
        stack.push_async_callback(_close_server, server)
        yield await stack.enter_async_context(clone_database(server))


async def _close_server(server: SessionServer) -> None:
    with trio.CancelScope(shield=True):
        await trio.to_thread.run_sync(server.close)


@asynccontextmanager
async def open_test_engine(
    *,
    providers: Mapping[str, Provider] | None = None,
    simulated: Provider | None = None,
    url: str | None = None,
    max_workers: int = 16,
    settings: Mapping[str, Any] | None = None,
    manual: bool = False,
    register_models: bool = False,
) -> AsyncIterator[Engine]:
    """The whole engine (the tree ``engine.open`` runs, with a fixed capacity of
    ``max_workers``) on a temporary database (or on ``url``), with :data:`TEST_SETTINGS`.

    Args:
        providers: a provider per model name.
        simulated: the provider of simulation tasks (default: a zero-latency one).
        url: the database (default: a :func:`temporary_database` for the block).
        max_workers: tasks run at once.
        settings: config overrides by dotted name (``{"tasks.lease_ttl": 5}``), applied last.
        manual: store tasks and run none (:data:`MANUAL_SETTINGS`); run them with
            :func:`engine.testing.drain`.
        register_models: put each of ``providers``' models in the catalogue (enabled, no
            limits), so submitting to it needs no :meth:`Engine.set_model` first.
    """
    overrides = {
        **TEST_SETTINGS,
        "worker.hard_limit": str(max_workers),
        **(MANUAL_SETTINGS if manual else {}),
        **{key: str(value) for key, value in (settings or {}).items()},
    }
    config = load_config(env={}, overrides=overrides)
    async with AsyncExitStack() as stack:
        await stack.enter_async_context(asyncio_loop())
        if url is None:
            url = await stack.enter_async_context(temporary_database())
        eng = await stack.enter_async_context(
            open_engine(
                config, urls=DatabaseUrls.single(url), providers=providers, simulated=simulated
            )
        )
        if register_models:
            for model in sorted(providers or {}):
                await eng.set_model(model)
        yield eng


async def run_until_final(
    engine: Engine, ids: Sequence[uuid.UUID], timeout: float = 30.0
) -> list[Task]:
    """Wait until every task in ``ids`` is final; return them in the same order."""
    with trio.fail_after(timeout):
        return [await engine.wait(task_id) for task_id in ids]
