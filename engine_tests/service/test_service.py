"""The service: generations swap on a resize without cancelling work, a shutdown hands work to
another instance, client-only mode executes nothing, start-up waits for the database."""

from __future__ import annotations

import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio

from engine import embedded
from engine.db.database import DatabaseUrls
from engine.domain.tasks import TaskStatus
from engine.service.engine import Engine
from engine.service.root import serve
from engine_tests.tasks.conftest import make_config, request
from engine_tests.tasks.test_runner import GatedProvider

FAST = {
    "worker.refresh_interval": "0.5",
    "recovery.interval": "0.5",
    "recovery.stale_after": "3",
    "metrics.enabled": "false",
    "worker.hard_limit": "10",
    "tasks.demo_catalogue": "false",
    "worker.capacity": "registry",
}


@asynccontextmanager
async def service(
    db_url: str, provider: GatedProvider | None = None, **overrides: Any
) -> AsyncIterator[tuple[Engine, trio.CancelScope]]:
    """Run the service in this process; yields its engine and the scope that stops it."""
    config = make_config(**{**FAST, **overrides})
    async with trio.open_nursery() as nursery:
        scope = trio.CancelScope()

        async def run(*, task_status: trio.TaskStatus[Engine]) -> None:
            with scope:
                await serve(
                    config,
                    urls=DatabaseUrls.single(db_url),
                    simulated=provider or GatedProvider(),
                    task_status=task_status,
                )

        eng = await nursery.start(run)
        yield eng, scope
        scope.cancel()


async def wait_for(predicate: Callable[[], Any], timeout: float = 10) -> None:
    with trio.fail_after(timeout):
        while not await predicate():
            await trio.sleep(0.02)


class FirstPollHeld(GatedProvider):
    """Holds the polls of the first task that polls until ``release`` is set; others pass."""

    def __init__(self) -> None:
        super().__init__()
        self.held: Any = None
        self.release = trio.Event()

    async def poll(self, task: Any, upstream_ref: str) -> Any:
        if self.held is None:
            self.held = task.id
        if task.id == self.held:
            await self.release.wait()
        return await super().poll(task, upstream_ref)


async def test_resize_swaps_generations_and_the_old_ones_long_task_finishes(
    db_url: str,
) -> None:
    provider = FirstPollHeld()
    async with service(db_url, provider) as (eng, _):
        await eng.set_model("sim-model", concurrency_limit=2)

        async def allocated(n: int) -> bool:
            return bool(
                await eng.db.coordination.fetchval(
                    "SELECT allocated = $1 FROM engine_worker_instance", n
                )
            )

        await wait_for(lambda: allocated(2))
        long_id = await eng.submit(request())

        async def long_task_polls() -> bool:
            return bool(provider.held == long_id)

        await wait_for(long_task_polls)  # waiting upstream in the first generation
        first_generation = eng.queue.generations[-1]
        # The limit changes: NOTIFY wakes the refresher, a new generation of 4 starts.
        await eng.set_model("sim-model", concurrency_limit=4)
        await wait_for(lambda: allocated(4))
        await wait_for(lambda: _generation_changed(eng, first_generation))
        assert first_generation in eng.queue.generations  # draining, not cancelled
        # The new generation runs new work while the old one's task is still waiting upstream.
        quick = await eng.submit(request())
        assert (await eng.wait(quick, timeout=10)).status is TaskStatus.SUCCEEDED
        long_task = await eng.get(long_id)
        assert long_task is not None and long_task.status is TaskStatus.RUNNING
        # The old generation's task finishes normally once the upstream answers.
        provider.release.set()
        done = await eng.wait(long_id, timeout=10)
        assert done.status is TaskStatus.SUCCEEDED and done.attempts == 1
        await wait_for(lambda: _not_running(eng, first_generation))


async def _generation_changed(eng: Engine, old: Any) -> bool:
    return bool(eng.queue.generations) and eng.queue.generations[-1] is not old


async def _not_running(eng: Engine, generation: Any) -> bool:
    return generation not in eng.queue.generations


async def test_shutdown_in_the_middle_of_work_hands_tasks_to_another_instance(
    db_url: str,
) -> None:
    gate = trio.Event()
    first, second = GatedProvider(), GatedProvider()
    first.poll_gate = gate  # never opened: instance A is stuck waiting upstream
    async with service(db_url, first) as (eng_a, stop_a):
        await eng_a.set_model("sim-model")
        ids = await eng_a.submit([request() for _ in range(5)])

        async def all_running() -> bool:
            counts = await eng_a.counts()
            return counts.get("running", 0) == 5

        await wait_for(all_running)
        async with service(db_url, second) as (eng_b, _):
            stop_a.cancel()  # A shuts down: marks draining, cancels, requeues its tasks
            for task_id in ids:
                task = await eng_b.wait(task_id, timeout=15)
                assert task.status is TaskStatus.SUCCEEDED
                assert task.execution_owner == eng_b.instance_id
            # Each was submitted upstream once: B resumed polling A's submissions.
            assert sum(first.submissions.values()) == 5
            assert second.submissions == {}


async def test_client_only_mode_executes_nothing(db_url: str) -> None:
    async with service(db_url, **{"worker.mode": "client"}) as (client, _):
        await client.set_model("sim-model")
        task_id = await client.submit(request())
        assert client.queue.generations == []
        assert (
            await client.db.coordination.fetchval("SELECT count(*) FROM engine_worker_instance")
            == 0
        )
        async with service(db_url) as (worker, _):
            task = await worker.wait(task_id, timeout=10)
            assert task.execution_owner == worker.instance_id
        assert client.queue.generations == []


@pytest.mark.slow
def _server_that_is_down() -> tuple[Path, str]:
    data_dir = Path(tempfile.mkdtemp(prefix="engine-down-"))
    data_dir.chmod(0o755)
    server = embedded.acquire(data_dir, unsafe_fast=True)
    url = server.dsn("postgres")
    server.release()  # down now; the same port is used when it comes back
    return data_dir, url


async def test_startup_waits_for_a_database_that_comes_up() -> None:
    data_dir, url = await trio.to_thread.run_sync(_server_that_is_down)
    proc = await trio.lowlevel.open_process(
        [
            sys.executable,
            "-m",
            "engine",
            "--database-url",
            url,
            "--set",
            "database.connect_retry_delay=1",
            "--set",
            "metrics.enabled=false",
            "run",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )
    try:
        await trio.sleep(0.5)  # the first attempt fails while the server is down
        server = await trio.to_thread.run_sync(lambda: embedded.acquire(data_dir))
        assert proc.stdout is not None
        seen = b""
        with trio.fail_after(30):
            while b"running" not in seen:
                chunk = await proc.stdout.receive_some()
                assert chunk, "the service exited instead of starting"
                seen += chunk
        proc.send_signal(2)
        with trio.fail_after(20):
            assert await proc.wait() == 0
    finally:
        proc.kill()
        server.release()


async def _scrape(url: str) -> str:
    host_port = url.split("//", 1)[1].split("/", 1)[0]
    host, port = host_port.rsplit(":", 1)
    stream = await trio.open_tcp_stream(host, int(port))
    async with stream:
        await stream.send_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        body = b""
        while chunk := await stream.receive_some():
            body += chunk
    head, _, text = body.decode().partition("\r\n\r\n")
    assert head.startswith("HTTP/1.1 200")
    return text


async def test_metrics_endpoint_reports_a_run(db_url: str) -> None:
    async with service(db_url, **{"metrics.enabled": "true", "metrics.port": "0"}) as (eng, _):
        assert eng.metrics_url is not None
        await eng.set_model("sim-model", concurrency_limit=3)
        ids = await eng.submit([request() for _ in range(5)])
        for task_id in ids:
            assert (await eng.wait(task_id, timeout=10)).status is TaskStatus.SUCCEEDED
        # The counter moves right after the outcome is written (which is what wakes wait()).
        with trio.fail_after(5):
            while 'engine_tasks_total{model="sim-model",status="succeeded"} 5.0' not in (
                text := await _scrape(eng.metrics_url)
            ):
                await trio.sleep(0.01)
    assert "engine_capacity_allocated_slots 3.0" in text
    assert 'engine_capacity_resizes_total{outcome="success"}' in text
    assert "engine_job_completions_total" in text
    assert 'engine_load_pressure_state{state="normal"} 1.0' in text


async def test_admissions_waiting_are_reported_per_model(db_url: str) -> None:
    provider = GatedProvider()
    provider.prepare_gate = trio.Event()
    # A fixed capacity above the model's limit claims all three jobs, so two must wait for
    # the model's slot in admission (with capacity from the limit they would wait as jobs).
    overrides = {
        "metrics.enabled": "true",
        "metrics.port": "0",
        "worker.capacity": "fixed",
        "worker.instance_hard_limit": "4",
    }
    async with service(db_url, provider, **overrides) as (eng, _):
        assert eng.metrics_url is not None
        await eng.set_model("sim-model", concurrency_limit=1)
        ids = await eng.submit([request() for _ in range(3)])
        # One task holds the model's only slot in prepare; the other two wait for it.
        with trio.fail_after(20):
            while 'engine_admissions_waiting{model="sim-model"} 2.0' not in await _scrape(
                eng.metrics_url
            ):
                await trio.sleep(0.1)
        provider.prepare_gate.set()
        for task_id in ids:
            assert (await eng.wait(task_id, timeout=20)).status is TaskStatus.SUCCEEDED
        # Once admitted, the model reads 0 rather than its last value.
        with trio.fail_after(20):
            while 'engine_admissions_waiting{model="sim-model"} 0.0' not in await _scrape(
                eng.metrics_url
            ):
                await trio.sleep(0.1)
