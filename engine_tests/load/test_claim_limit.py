"""The process-wide claim limit across overlapping generations, and worker-load refusals that
snooze without using attempts."""

from __future__ import annotations

from typing import ClassVar

import attrs
import trio

from engine.db.database import Database
from engine.domain.tasks import TaskStatus
from engine.load.controller import LoadController, LoadSnapshot
from engine.queue import Job, SlotPool, Workers, open_queue
from engine.queue.config import QueueConfig
from engine_tests.tasks.conftest import OpenEngine, request
from engine_tests.tasks.conftest import open_test_engine as open_test_engine  # fixture
from engine_tests.tasks.test_runner import GatedProvider


@attrs.frozen
class Hold:
    kind: ClassVar[str] = "hold"
    n: int


async def test_overlapping_generations_never_run_more_than_the_claim_limit(
    database: Database,
) -> None:
    running = 0
    peak = 0
    by_generation: dict[str, int] = {}
    release = trio.Event()
    three_running = trio.Event()

    async def handle(job: Job, args: Hold) -> None:
        nonlocal running, peak
        running += 1
        peak = max(peak, running)
        client = job.attempted_by[-1]
        by_generation[client] = by_generation.get(client, 0) + 1
        if running == 3:
            three_running.set()
        await release.wait()
        running -= 1

    workers = Workers()
    workers.register(Hold, handle)
    slots = SlotPool(3)
    config = QueueConfig(fetch_poll_interval=0.1, completer_tick=0.01)
    async with open_queue(database, config, workers=workers, slots=slots) as client:
        await client.insert_many([Hold(n) for n in range(12)])
        old = await client.start_generation({"default": 3})
        with trio.fail_after(5):
            await three_running.wait()
        new = await client.start_generation({"default": 3})  # a resize: both run at once
        old.stop("draining")
        assert slots.available() == 0
        release.set()
        with trio.fail_after(10):
            while (await client.counts()).get("default", {}).get("completed", 0) < 12:
                await trio.sleep(0.02)
        new.stop("done")
    assert peak == 3
    assert len(by_generation) == 2  # both generations ran jobs, never more than 3 together


class PinnedClaimLimit(LoadController):
    """A load controller that keeps the claim limit it was made with: the capacity source's
    share (here 3) would otherwise replace it, and no run would be refused."""

    def set_claim_limit(self, claim_limit: int) -> LoadSnapshot:
        return self.snapshot()


async def test_worker_load_refusal_snoozes_without_using_attempts(
    open_test_engine: OpenEngine,
) -> None:
    provider = GatedProvider()
    gate = provider.poll_gate = trio.Event()
    load = PinnedClaimLimit(mode="legacy", claim_limit=1)
    async with open_test_engine(simulated=provider, load=load, max_workers=3) as eng:
        await eng.set_model("sim-model")
        ids = await eng.submit([request() for _ in range(3)])

        async def snoozed() -> int:
            return int(
                await eng.db.queue.fetchval(
                    "SELECT count(*) FROM river_job WHERE (metadata->>'snoozes')::int > 0"
                )
            )

        with trio.fail_after(10):
            while await snoozed() < 2:
                await trio.sleep(0.02)
        gate.set()
        for task_id in ids:
            assert (await eng.wait(task_id, timeout=15)).status is TaskStatus.SUCCEEDED
        with trio.fail_after(5):
            while await eng.db.queue.fetchval(
                "SELECT count(*) FROM river_job WHERE state <> 'completed'"
            ):
                await trio.sleep(0.02)
        rows = await eng.db.queue.fetch("SELECT attempt, metadata FROM river_job")
    assert all(r["attempt"] == 1 for r in rows)  # refusals used no attempt
    assert sum(r["metadata"].get("snoozes", 0) for r in rows) >= 2
