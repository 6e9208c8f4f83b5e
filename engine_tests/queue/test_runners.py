"""Runner tasks: reused across jobs, bounded by the jobs running at once, and a cancel reaches
the job it was meant for and no other."""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from typing import Any

import attrs
import pytest
import trio
import trio.testing

from engine.queue.executor import Completion
from engine.queue.job import Job
from engine.queue.runners import Runners
from engine.queue.states import JobState
from engine.queue.workers import Workers

_ids = itertools.count(1)


def _job(kind: str = "k") -> Job:
    now = datetime.now(UTC)
    return Job(
        id=next(_ids),
        state=JobState.RUNNING,
        kind=kind,
        args={},
        queue="default",
        priority=1,
        attempt=1,
        max_attempts=25,
        scheduled_at=now,
        created_at=now,
        attempted_at=now,
        attempted_by=("test",),
        finalized_at=None,
        errors=(),
        metadata={},
        tags=(),
        unique_key=None,
    )


@attrs.define
class _Harness:
    runners: Runners
    cancel_scopes: dict[int, trio.CancelScope]
    recorded: dict[int, Completion] = attrs.field(factory=dict)
    done: list[int] = attrs.field(factory=list)

    def start(self, job: Job) -> None:
        self.runners.start(job, lambda: self.done.append(job.id))

    async def wait_done(self, *jobs: Job) -> None:
        with trio.fail_after(5):
            while not {j.id for j in jobs} <= set(self.done):
                await trio.sleep(0.001)


@asynccontextmanager
async def _runners(
    handler: Callable[[Job, dict[str, Any]], Awaitable[None]],
) -> AsyncIterator[_Harness]:
    workers = Workers()
    workers.register(dict, handler, kind="k")
    cancel_scopes: dict[int, trio.CancelScope] = {}
    recorded: dict[int, Completion] = {}
    async with trio.open_nursery() as nursery:
        runners = Runners(
            nursery, workers, lambda c: recorded.__setitem__(c.job_id, c), cancel_scopes
        )
        harness = _Harness(runners, cancel_scopes, recorded)
        yield harness
        runners.close()


async def test_runners_are_reused_and_never_outnumber_the_jobs_running_at_once() -> None:
    async def noop(job: Job, args: dict[str, Any]) -> None:
        await trio.lowlevel.checkpoint()

    async with _runners(noop) as h:
        for _ in range(50):
            batch = [_job() for _ in range(8)]
            for job in batch:
                h.start(job)
            await h.wait_done(*batch)
        assert h.runners.alive == 8
        assert len(h.recorded) == 400
        assert {c.state for c in h.recorded.values()} == {JobState.COMPLETED}
    assert h.runners.alive == 0  # close() ended the idle runners


async def test_a_remote_cancel_ends_its_job_cancelled_and_the_runner_goes_on() -> None:
    release = trio.Event()

    async def wait(job: Job, args: dict[str, Any]) -> None:
        await release.wait()

    async with _runners(wait) as h:
        first, second = _job(), _job()
        h.start(first)
        h.start(second)
        await trio.testing.wait_all_tasks_blocked()
        h.cancel_scopes[first.id].cancel()
        await h.wait_done(first)
        assert h.recorded[first.id].state is JobState.CANCELLED
        assert second.id not in h.done
        release.set()
        await h.wait_done(second)
        assert h.recorded[second.id].state is JobState.COMPLETED
        third = _job()
        h.start(third)  # on a runner whose scope was spent by the cancel
        await h.wait_done(third)
        assert h.recorded[third.id].state is JobState.COMPLETED
        assert h.runners.alive == 2
        assert h.cancel_scopes == {}


async def test_a_cancel_that_lands_after_its_job_ended_does_not_reach_the_next_job() -> None:
    blocker = trio.Event()

    async def handler(job: Job, args: dict[str, Any]) -> None:
        if job.args.get("cancel_self"):
            # The cancel lands while the job is already returning (no checkpoint after it).
            h.cancel_scopes[job.id].cancel()
            return
        await blocker.wait()

    async with _runners(handler) as h:
        late = attrs.evolve(_job(), args={"cancel_self": True})
        h.start(late)
        await h.wait_done(late)
        assert h.recorded[late.id].state is JobState.COMPLETED
        assert h.runners.alive == 1
        victim = _job()
        h.start(victim)  # the same runner, which must not run it in the cancelled scope
        await trio.testing.wait_all_tasks_blocked()
        assert victim.id not in h.done
        blocker.set()
        await h.wait_done(victim)
        assert h.recorded[victim.id].state is JobState.COMPLETED
        assert h.runners.alive == 1


async def test_a_hard_stop_requeues_running_jobs_and_ends_idle_runners() -> None:
    async def forever(job: Job, args: dict[str, Any]) -> None:
        await trio.sleep_forever()

    async def quick(job: Job, args: dict[str, Any]) -> None:
        pass

    workers = Workers()
    workers.register(dict, forever, kind="k")
    workers.register(dict, quick, kind="quick")
    recorded: list[Completion] = []
    done: list[int] = []
    async with trio.open_nursery() as work:
        runners = Runners(work, workers, recorded.append, {})
        stuck = [_job() for _ in range(3)]
        for job in [*stuck, _job("quick")]:
            runners.start(job, lambda job=job: done.append(job.id))
        await trio.testing.wait_all_tasks_blocked()
        assert runners.alive == 4  # three busy, one idle
        work.cancel_scope.cancel()
    assert runners.alive == 0
    by_id = {c.job_id: c for c in recorded}
    for job in stuck:
        assert by_id[job.id].state is JobState.AVAILABLE and by_id[job.id].restore
    assert sorted(done) == sorted(c.job_id for c in recorded)


async def test_close_lets_busy_runners_finish_and_refuses_new_jobs() -> None:
    release = trio.Event()

    async def wait(job: Job, args: dict[str, Any]) -> None:
        await release.wait()

    recorded: list[Completion] = []
    workers = Workers()
    workers.register(dict, wait, kind="k")
    async with trio.open_nursery() as work:
        runners = Runners(work, workers, recorded.append, {})
        busy = _job()
        runners.start(busy, lambda: None)
        await trio.testing.wait_all_tasks_blocked()
        runners.close()
        with pytest.raises(RuntimeError, match="closed"):
            runners.start(_job(), lambda: None)
        assert runners.alive == 1
        release.set()
    assert [c.state for c in recorded] == [JobState.COMPLETED]
    assert runners.alive == 0
