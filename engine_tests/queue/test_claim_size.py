"""How many jobs one claim takes: a quarter of the producer's ``max_workers``, from 32 to 128.

Jobs claimed by one statement share their ``attempted_at`` (the claim's transaction time), so a
generation whose jobs all wait shows its claims as the groups of equal ``attempted_at``."""

from __future__ import annotations

from collections import Counter
from datetime import datetime
from typing import Any

import pytest
import trio

from engine.db.database import Database
from engine.queue import Job, Workers, open_queue
from engine.queue.config import QueueConfig
from engine.queue.insert import insert_many, prepare


async def _claim_sizes(database: Database, max_workers: int, jobs: int) -> list[int]:
    """Sizes of the claims that fill ``max_workers`` slots from ``jobs`` waiting jobs, largest
    first."""
    workers = Workers()
    started: list[datetime] = []
    release = trio.Event()

    async def hold(job: Job, args: dict[str, Any]) -> None:
        assert job.attempted_at is not None
        started.append(job.attempted_at)
        await release.wait()

    workers.register(dict, hold, kind="hold")
    await insert_many(database.queue, [prepare({"i": i}, kind="hold") for i in range(jobs)])
    async with open_queue(database, QueueConfig(), workers=workers) as client:
        await client.start_generation({"default": max_workers})
        with trio.fail_after(10):
            while len(started) < max_workers:
                await trio.sleep(0.01)
        release.set()
    return sorted(Counter(started).values(), reverse=True)


@pytest.mark.parametrize(("max_workers", "claim"), [(32, 32), (100, 32), (200, 50), (800, 128)])
async def test_a_claim_takes_a_quarter_of_the_workers_from_32_to_128(
    database: Database, max_workers: int, claim: int
) -> None:
    sizes = await _claim_sizes(database, max_workers, 2 * max_workers)
    # The first claim finds every slot free and the queue full: it takes the most it may.
    assert sizes[0] == claim
    assert sum(sizes) >= max_workers
