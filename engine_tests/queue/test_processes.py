"""Several processes on one queue: every job runs exactly once; shutdown leaves none running."""

from __future__ import annotations

import subprocess
import sys
from typing import ClassVar

import attrs
import pytest
import trio

from engine.db.database import Database
from engine.queue import Job, JobState, Workers, open_queue
from engine.queue.config import QueueConfig
from engine.queue.insert import insert_many, prepare


@pytest.mark.slow
async def test_5000_jobs_drained_by_3_processes_each_run_exactly_once(
    database: Database, db_url: str
) -> None:
    await database.tasks.execute("CREATE TABLE executed (job_id bigint, pid int)")
    await insert_many(database.queue, [prepare({"i": i}, kind="drain") for i in range(5000)])
    procs = [
        await trio.lowlevel.open_process(
            [sys.executable, "-m", "engine_tests.queue.drain_worker", db_url, "16"],
            stdout=subprocess.DEVNULL,
        )
        for _ in range(3)
    ]
    try:
        with trio.fail_after(120):
            for proc in procs:
                assert await proc.wait() == 0
    finally:
        for proc in procs:
            proc.kill()
    rows = await database.tasks.fetch(
        "SELECT count(*) AS runs, count(DISTINCT job_id) AS jobs, count(DISTINCT pid) AS pids"
        " FROM executed"
    )
    assert (rows[0]["runs"], rows[0]["jobs"]) == (5000, 5000)
    assert rows[0]["pids"] >= 2  # the work really was shared
    states = await database.queue.fetch("SELECT state::text, count(*) FROM river_job GROUP BY 1")
    assert {r[0]: r[1] for r in states} == {"completed": 5000}


@attrs.frozen
class Sleepy:
    kind: ClassVar[str] = "sleepy"
    seconds: float


async def test_no_job_left_running_after_shutdown_in_the_middle_of_a_burn_down(
    database: Database,
) -> None:
    done = 0

    async def handle(job: Job, args: Sleepy) -> None:
        nonlocal done
        await trio.sleep(args.seconds)
        done += 1

    workers = Workers()
    workers.register(Sleepy, handle)
    await insert_many(
        database.queue, [prepare(Sleepy(0.01 if i % 2 else 0.5)) for i in range(2000)]
    )
    with trio.CancelScope() as scope:
        async with open_queue(
            database, QueueConfig(completer_tick=0.02), workers=workers, stop_timeout=0.2
        ) as client:
            await client.start_generation({"default": 50})
            with trio.fail_after(30):
                while done < 200:
                    await trio.sleep(0.01)
            scope.cancel()  # a hard stop in the middle of the burn-down
    counts = dict(
        await database.queue.fetch("SELECT state::text, count(*) FROM river_job GROUP BY 1")
    )
    assert "running" not in counts, counts
    assert counts.get("completed", 0) >= 200
    assert sum(counts.values()) == 2000
    # Interrupted jobs were requeued with their attempt given back.
    assert (
        await database.queue.fetchval(
            "SELECT count(*) FROM river_job WHERE state = 'available' AND attempt > 0"
        )
        == 0
    )
    assert JobState.AVAILABLE.value in counts
