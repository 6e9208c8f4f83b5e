"""The simulated provider remembers the latest tasks it served, not every task ever."""

from __future__ import annotations

from engine.providers.simulated import SimulatedProvider
from engine.testing.factories import make_task


async def test_submissions_and_cancels_are_remembered_for_the_latest_tasks_only() -> None:
    provider = SimulatedProvider(memory=3)
    tasks = [make_task() for _ in range(5)]
    for task in tasks:
        ref = await provider.submit(task, await provider.prepare(task))
        await provider.cancel(task, ref)
    await provider.submit(tasks[-1], None)
    assert dict(provider.submissions) == {tasks[2].id: 1, tasks[3].id: 1, tasks[4].id: 2}
    assert list(provider.cancelled) == [t.id for t in tasks[2:]]
    assert tasks[0].id not in provider.cancelled and provider.submissions[tasks[0].id] == 0
