"""A populated engine with its dashboard, for the dashboard and browser tests.

Real runs make the states: an engine whose simulated upstream fails every task makes
``failed`` ones; the engine the dashboard runs on loses every submission's answer, so its
tasks end in ``manual_review``; tasks due in an hour stay ``queued``. Values shaped like markup
and SQL go into a model name, a payload and a tenant, to check that every page escapes them.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta
from typing import Any

import attrs
import trio

from engine.db.database import DatabaseUrls
from engine.domain.tasks import Identity, RunMode, TaskRequest, TaskStatus
from engine.providers.simulated import SimulatedProvider, SimulationConfig
from engine.service.engine import Engine
from engine.service.root import open as open_engine
from engine_tests.tasks.conftest import make_config

EVIL_MODEL = "<script>alert('model')</script>'; DROP TABLE engine_task; --"
EVIL_TEXT = "<script>alert('payload')</script><img src=x onerror=alert(1)>"
EVIL_TENANT = "tenant\"><script>alert('tenant')</script>"


@attrs.frozen
class Populated:
    """The engine serving the dashboard, its port, and the tasks made per status."""

    engine: Engine
    port: int
    failed: list[Any]
    manual: list[Any]
    queued: list[Any]

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"


def _request(model: str, n: int, **kw: Any) -> TaskRequest:
    return TaskRequest(
        model=model,
        payload={"n": n, "text": EVIL_TEXT},
        identity=Identity(tenant_id=EVIL_TENANT if n == 0 else "t1", user_id="u1"),
        run_mode=RunMode.SIMULATION,
        **kw,
    )


async def _settle(eng: Engine, ids: list[Any]) -> None:
    """Wait until each task is final and its job has left ``running`` (completions are
    written in batches, a moment after the outcome)."""
    for task_id in ids:
        task = await eng.wait(task_id, timeout=20)
        if task.river_job_id is None:
            continue
        with trio.fail_after(5):
            while (job := await eng.queue.get(task.river_job_id)) is not None and (
                job.state == "running"
            ):
                await trio.sleep(0.02)


@asynccontextmanager
async def populated(
    db_url: str, *, failed: int = 3, manual: int = 3, **settings: Any
) -> AsyncIterator[Populated]:
    """Make the tasks, then run the dashboard's engine (settings override its config)."""
    urls = DatabaseUrls.single(db_url)
    failing = SimulatedProvider(SimulationConfig(failure_rate=1.0))
    async with open_engine(
        make_config(**{"worker.hard_limit": 8}), urls=urls, simulated=failing
    ) as a:
        await a.set_model("sim-model")
        await a.set_model(EVIL_MODEL, concurrency_limit=2)
        failed_ids = await a.submit([_request("sim-model", n) for n in range(failed)])
        await _settle(a, failed_ids)
    config = make_config(
        **{
            "worker.hard_limit": 8,
            "worker.capacity": "registry",
            "metrics.enabled": "true",
            "metrics.port": "0",
            "dashboard.enabled": "true",
            **settings,
        }
    )
    ambiguous = SimulatedProvider(SimulationConfig(ambiguous_rate=1.0))
    async with open_engine(config, urls=urls, simulated=ambiguous) as eng:
        manual_ids = await eng.submit([_request(EVIL_MODEL, n) for n in range(manual)])
        await _settle(eng, manual_ids)
        later = datetime.now(UTC) + timedelta(hours=1)
        queued_ids = await eng.submit([_request("sim-model", n, run_at=later) for n in range(2)])
        assert eng.dashboard_url is not None
        port = int(eng.dashboard_url.rstrip("/").rsplit(":", 1)[1])
        for task_id in manual_ids:
            task = await eng.get(task_id)
            assert task is not None and task.status is TaskStatus.MANUAL_REVIEW
        yield Populated(eng, port, list(failed_ids), list(manual_ids), list(queued_ids))


async def wait_status(
    eng: Engine, task_id: Any, *statuses: TaskStatus, timeout: float = 10
) -> None:
    """Wait until the task is in one of ``statuses``."""
    with trio.fail_after(timeout):
        while True:
            task = await eng.get(task_id)
            if task is not None and task.status in statuses:
                return
            await trio.sleep(0.02)
