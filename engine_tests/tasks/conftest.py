"""Fixtures for the task layer: an engine on this test's database, with a test provider."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager
from typing import Any

import pytest

from engine.config import EngineConfig, load_config
from engine.db.bridge import Connection
from engine.db.database import DatabaseUrls
from engine.domain.tasks import Identity, RunMode, TaskRequest
from engine.providers.simulated import SimulatedProvider
from engine.service.engine import Engine
from engine.service.root import open as open_engine

IDENTITY = Identity(tenant_id="t1", user_id="u1", api_key_id="k1")


def make_config(**overrides: Any) -> EngineConfig:
    """A config for tests: fast polling, no migrations (the template is migrated)."""
    settings = {
        "database.migrate_on_start": "false",
        "queue.fetch_poll_interval": "0.2",
        "queue.completer_tick": "0.01",
        "worker.stop_timeout": "2",
        "tasks.lease_ttl": "30",
        "tasks.lease_renew_interval": "5",
        "worker.capacity": "fixed",
        "worker.shutdown_drain_timeout": "0",
        "metrics.enabled": "false",
    }
    settings.update({k: str(v) for k, v in overrides.items()})
    return load_config(env={}, overrides=settings)


def request(model: str = "sim-model", **kw: Any) -> TaskRequest:
    """A valid simulation request."""
    kw.setdefault("payload", {"prompt": "a cat"})
    kw.setdefault("identity", IDENTITY)
    kw.setdefault("run_mode", RunMode.SIMULATION)
    return TaskRequest(model=model, **kw)


OpenEngine = Callable[..., AbstractAsyncContextManager[Engine]]


@pytest.fixture
def open_test_engine(db_url: str) -> OpenEngine:
    """Open an engine on this test's database: ``async with open_test_engine(...) as eng``."""

    def opener(
        config: EngineConfig | None = None,
        *,
        max_workers: int = 16,
        execute: bool = True,
        **kw: Any,
    ) -> Any:
        """``max_workers``: a fixed capacity of that many jobs (unless ``config`` is given);
        ``execute=False``: the records layer only (submit and read, run nothing)."""
        kw.setdefault("simulated", SimulatedProvider())
        config = config or make_config(**{"worker.hard_limit": max_workers})
        return open_engine(config, urls=DatabaseUrls.single(db_url), control=execute, **kw)

    return opener


@pytest.fixture
async def eng(open_test_engine: OpenEngine) -> AsyncIterator[Engine]:
    """An executing engine with one enabled simulated model, ``sim-model``."""
    async with open_test_engine(max_workers=8) as engine:
        await engine.set_model("sim-model")
        yield engine


async def insert_running_tasks(
    conn: Connection, count: int, *, phase: str = "preparing", lease_seconds: float = 3600.0
) -> list[uuid.UUID]:
    """``count`` running tasks of the instance ``owner``, each token equal to its id, their leases
    expiring in ``lease_seconds``."""
    rows = await conn.fetch(
        """
        INSERT INTO engine_task (id, model, tenant_id, user_id, run_mode, payload, status,
                                 phase, execution_token, execution_owner, lease_expires_at,
                                 started_at)
        SELECT g, 'm', 't', 'u', 'simulation', '{}', 'running', $2, g, 'owner',
               now() + make_interval(secs => $3), now()
        FROM (SELECT gen_random_uuid() AS g FROM generate_series(1, $1)) s
        RETURNING id
        """,
        count,
        phase,
        lease_seconds,
    )
    return [r["id"] for r in rows]
