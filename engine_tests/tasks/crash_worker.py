"""A worker process that submits a task upstream and then hangs before recording the answer, so
the test can SIGKILL it at the worst moment.

Usage: ``python -m engine_tests.tasks.crash_worker DATABASE_URL``. The provider records each
submission in the table ``sim_submission`` before hanging.
"""

from __future__ import annotations

import sys
from typing import Any

import trio

from engine.db.bridge import asyncio_loop
from engine.db.database import DatabaseUrls
from engine.domain.tasks import Task
from engine.providers.simulated import SimulatedProvider
from engine.service.root import open as open_engine
from engine_tests.tasks.conftest import make_config


class HangAfterSubmit(SimulatedProvider):
    """Records the submission durably, then never returns (the process is killed here)."""

    def __init__(self, url: str) -> None:
        super().__init__()
        self.url = url

    async def submit(self, task: Task, prepared: Any) -> str:
        from engine.db.bridge import connect

        conn = await connect(self.url)
        await conn.execute("INSERT INTO sim_submission (task_id) VALUES ($1)", task.id)
        await conn.close()
        await trio.sleep_forever()
        raise AssertionError("unreachable")


async def main(url: str) -> None:
    async with (
        asyncio_loop(),
        open_engine(make_config(), urls=DatabaseUrls.single(url), simulated=HangAfterSubmit(url)),
    ):
        await trio.sleep_forever()


if __name__ == "__main__":
    trio.run(main, sys.argv[1])
