"""A worker process for the multi-process drain test: run jobs of kind ``drain`` until none are
left unfinished, recording each execution in the ``executed`` table.

Usage: ``python -m engine_tests.queue.drain_worker DATABASE_URL MAX_WORKERS``
"""

from __future__ import annotations

import os
import sys

import trio

from engine.db.database import DatabaseUrls, open_database
from engine.queue import Job, Workers, open_queue
from engine.queue.config import QueueConfig


async def main(url: str, max_workers: int) -> None:
    async with open_database(DatabaseUrls.single(url), max_size=max_workers + 4) as db:
        workers = Workers()

        async def handle(job: Job, args: dict[str, object]) -> None:
            await db.tasks.execute(
                "INSERT INTO executed (job_id, pid) VALUES ($1, $2)", job.id, os.getpid()
            )

        workers.register(dict, handle, kind="drain")
        async with open_queue(db, QueueConfig(fetch_poll_interval=0.2), workers=workers) as q:
            await q.start_generation({"default": max_workers})
            print("ready", flush=True)
            while await db.tasks.fetchval(
                "SELECT count(*) FROM river_job WHERE finalized_at IS NULL"
            ):
                await trio.sleep(0.05)


if __name__ == "__main__":
    from engine.db.bridge import asyncio_loop

    async def _run() -> None:
        async with asyncio_loop():
            await main(sys.argv[1], int(sys.argv[2]))

    trio.run(_run)
