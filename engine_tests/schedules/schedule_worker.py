"""A worker process that leads (or waits to lead) and runs one every-second schedule, so a test
can SIGKILL it while it leads.

Usage: ``python -m engine_tests.schedules.schedule_worker DATABASE_URL INSTANCE_NAME``. Prints
``ready`` once the engine is up.
"""

from __future__ import annotations

import sys

import trio

from engine.db.bridge import asyncio_loop
from engine.db.database import DatabaseUrls
from engine.domain.tasks import RunMode
from engine.schedules.model import Schedule, ScheduledTask
from engine.service.root import open as open_engine
from engine_tests.tasks.conftest import make_config

SCHEDULE = Schedule(
    name="every-second",
    every="1s",
    task=ScheduledTask(model="report", tenant_id="ops", run_mode=RunMode.SIMULATION),
)


async def main(url: str, name: str) -> None:
    config = make_config(
        instance_name=name,
        **{"queue.leader_ttl": "2", "queue.leader_elect_interval": "0.5"},
    )
    async with (
        asyncio_loop(),
        open_engine(config, urls=DatabaseUrls.single(url), schedules=[SCHEDULE]),
    ):
        print("ready", flush=True)
        await trio.sleep_forever()


if __name__ == "__main__":
    trio.run(main, sys.argv[1], sys.argv[2])
