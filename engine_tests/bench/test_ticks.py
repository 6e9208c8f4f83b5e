"""``counting_ticks``: one tick per step of a task, counted only inside the block."""

from __future__ import annotations

import trio
import trio.testing

from engine.bench.common import BenchDatabase
from engine.bench.tasks import _tasks
from engine.bench.ticks import counting_ticks
from engine.db.bridge import asyncio_loop


async def test_each_wait_of_a_task_is_one_more_tick_of_it() -> None:
    me = trio.lowlevel.current_task().name
    with counting_ticks() as ticks:
        for _ in range(10):
            await trio.lowlevel.checkpoint()
    assert ticks.by_task[me] == 10
    assert ticks.total >= 10
    await trio.lowlevel.checkpoint()  # after the block: not counted
    assert ticks.by_task[me] == 10


async def test_a_woken_task_is_counted_under_its_own_name() -> None:
    async def sleeper(event: trio.Event) -> None:
        await event.wait()

    event = trio.Event()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(sleeper, event, name="sleeper")
        await trio.testing.wait_all_tasks_blocked()
        with counting_ticks() as ticks:
            event.set()
            with trio.fail_after(5):
                while ticks.by_task["sleeper"] == 0:
                    await trio.lowlevel.checkpoint()
    assert ticks.by_task["sleeper"] == 1


async def test_the_task_drain_counts_its_ticks_per_task(pg_admin_url: str) -> None:
    """``bench tasks``' drain: every task succeeds, and the scheduler wakes about five times a
    task (its job handed to a runner, its four fenced writes) plus a share of the services'.
    Past seven, something wakes once per task again, as trio-asyncio's loop and the LISTEN hub
    did before they took their work in runs, and the submission's own nursery did before its
    watcher moved to the generation's (docs/benchmarks.md)."""
    async with asyncio_loop(), BenchDatabase(pg_admin_url) as db:
        drain = await _tasks(db.urls.tasks, 600, 600, count_ticks=True)
    assert drain.not_succeeded == 0
    assert drain.ticks_per_task is not None
    assert 5 <= drain.ticks_per_task <= 7
