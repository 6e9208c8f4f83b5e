"""The queue end to end on a real database: insert, claim, execute, complete."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import ClassVar

import attrs
import pytest
import trio

from engine.db.database import Database
from engine.queue import (
    InsertOpts,
    Job,
    JobCancel,
    JobSnooze,
    JobState,
    QueueClient,
    UniqueOpts,
    Workers,
    open_queue,
)
from engine.queue.config import QueueConfig
from engine.queue.insert import insert, prepare


@attrs.frozen
class Echo:
    kind: ClassVar[str] = "echo"
    n: int
    behaviour: str = "ok"


class Recorder:
    def __init__(self) -> None:
        self.seen: list[tuple[int, int]] = []
        self.started: dict[int, trio.Event] = {}
        self.release = trio.Event()

    async def handle(self, job: Job, args: Echo) -> None:
        self.seen.append((job.id, job.attempt))
        self.started.setdefault(job.id, trio.Event()).set()
        if args.behaviour == "snooze" and job.metadata.get("snoozes", 0) < 2:
            raise JobSnooze(0)
        if args.behaviour == "fail":
            raise RuntimeError("boom")
        if args.behaviour == "cancel":
            raise JobCancel("not wanted")
        if args.behaviour == "block":
            await self.release.wait()


QCFG = QueueConfig(fetch_poll_interval=0.2, completer_tick=0.01)


@pytest.fixture
async def setup(database: Database) -> AsyncIterator[tuple[QueueClient, Recorder]]:
    recorder = Recorder()
    workers = Workers()
    workers.register(Echo, recorder.handle)
    async with open_queue(database, QCFG, workers=workers, stop_timeout=2) as client:
        yield client, recorder


async def wait_state(client: QueueClient, job_id: int, *states: JobState) -> Job:
    with trio.fail_after(10):
        while True:
            job = await client.get(job_id)
            assert job is not None
            if job.state in states:
                return job
            await trio.sleep(0.01)


async def test_inserted_job_runs_and_completes(setup: tuple[QueueClient, Recorder]) -> None:
    client, recorder = setup
    await client.start_generation({"default": 4})
    result = await client.insert(Echo(1))
    assert not result.skipped
    job = await wait_state(client, result.job.id, JobState.COMPLETED)
    assert job.attempt == 1
    assert job.finalized_at is not None
    assert recorder.seen == [(job.id, 1)]


async def test_snooze_never_burns_attempts(setup: tuple[QueueClient, Recorder]) -> None:
    client, recorder = setup
    await client.start_generation({"default": 4})
    result = await client.insert(Echo(1, "snooze"), InsertOpts(max_attempts=1))
    job = await wait_state(client, result.job.id, JobState.COMPLETED)
    # Ran three times (two snoozes) with max_attempts 1: snoozes used no attempt.
    assert [a for _, a in recorder.seen] == [1, 1, 1]
    assert job.metadata["snoozes"] == 2
    assert job.attempt == 1


async def test_error_retries_then_discards(setup: tuple[QueueClient, Recorder]) -> None:
    client, _ = setup
    await client.start_generation({"default": 4})
    result = await client.insert(Echo(1, "fail"), InsertOpts(max_attempts=1))
    job = await wait_state(client, result.job.id, JobState.DISCARDED)
    assert len(job.errors) == 1
    assert "boom" in job.errors[0]["error"]


async def test_first_error_is_available_again_at_once(setup: tuple[QueueClient, Recorder]) -> None:
    client, recorder = setup
    await client.start_generation({"default": 4})
    result = await client.insert(Echo(1, "fail"), InsertOpts(max_attempts=2))
    job = await wait_state(client, result.job.id, JobState.DISCARDED)
    # (0+1)^4 = 1 s ±10 % is under the 5 s threshold, so the retry was available at once.
    assert [a for _, a in recorder.seen] == [1, 2]
    assert len(job.errors) == 2


async def test_job_cancel_from_handler(setup: tuple[QueueClient, Recorder]) -> None:
    client, _ = setup
    await client.start_generation({"default": 4})
    result = await client.insert(Echo(1, "cancel"))
    job = await wait_state(client, result.job.id, JobState.CANCELLED)
    assert job.errors[-1]["error"] == "not wanted"


async def test_unique_insert_returns_live_duplicate(setup: tuple[QueueClient, Recorder]) -> None:
    client, _ = setup
    opts = InsertOpts(unique=UniqueOpts(by_args=True, by_queue=True))
    first = await client.insert(Echo(7), opts)
    second = await client.insert(Echo(7), opts)
    other = await client.insert(Echo(8), opts)
    assert not first.skipped and second.skipped and not other.skipped
    assert second.job.id == first.job.id
    many = await client.insert_many([(Echo(7), opts), (Echo(9), opts), (Echo(9), opts)])
    assert [r.skipped for r in many] == [True, False, True]
    assert many[1].job.id == many[2].job.id


async def test_unknown_kind_is_discarded_with_a_clear_error(
    setup: tuple[QueueClient, Recorder],
) -> None:
    client, _ = setup
    await client.start_generation({"default": 4})
    result = await insert(client.db.queue, prepare({"x": 1}, kind="nobody_handles_this"))
    job = await wait_state(client, result.job.id, JobState.DISCARDED)
    assert "no worker is registered for job kind" in job.errors[0]["error"]


async def test_bad_args_are_an_error_on_the_job(setup: tuple[QueueClient, Recorder]) -> None:
    client, _ = setup
    await client.start_generation({"default": 4})
    bad = prepare({"n": "not a number"}, InsertOpts(max_attempts=1), kind="echo")
    result = await insert(client.db.queue, bad)
    job = await wait_state(client, result.job.id, JobState.DISCARDED)
    assert "do not fit Echo" in job.errors[0]["error"]


async def test_remote_cancel_of_running_job(setup: tuple[QueueClient, Recorder]) -> None:
    client, recorder = setup
    await client.start_generation({"default": 4})
    result = await client.insert(Echo(1, "block"))
    with trio.fail_after(5):
        await recorder.started.setdefault(result.job.id, trio.Event()).wait()
    await client.cancel(result.job.id)
    job = await wait_state(client, result.job.id, JobState.CANCELLED)
    assert job.metadata.get("cancel_attempted_at")
    # The generation's runners go on running jobs after the cancel, and no cancel scope is left
    # registered for a job that no longer runs.
    generation = client.generations[-1]
    after = [await client.insert(Echo(n)) for n in range(8)]
    for r in after:
        await wait_state(client, r.job.id, JobState.COMPLETED)
    assert client.cancel_scopes == {}
    # Every slot comes back. A producer's idle poll reserves its free slots for the claim's round
    # trip, so ``running`` may be briefly non-zero; a leaked slot would keep it so forever.
    with trio.fail_after(5):
        while generation.running:
            await trio.sleep(0.01)


async def test_cancel_of_waiting_job_is_immediate(setup: tuple[QueueClient, Recorder]) -> None:
    client, _ = setup
    result = await client.insert(Echo(1))
    job = await client.cancel(result.job.id)
    assert job is not None and job.state is JobState.CANCELLED


async def test_stop_drains_and_stop_and_cancel_requeues(
    setup: tuple[QueueClient, Recorder],
) -> None:
    client, recorder = setup
    gen = await client.start_generation({"default": 4})
    result = await client.insert(Echo(1, "block"))
    with trio.fail_after(5):
        await recorder.started.setdefault(result.job.id, trio.Event()).wait()
    gen.stop("drain")
    # A claim already in flight when stop() is called still returns and its jobs run; once it
    # has, nothing new is fetched while the running job drains.
    with trio.fail_after(5):
        await gen.fetching_stopped.wait()
    late = await client.insert(Echo(2))
    assert (await client.get(result.job.id)).state is JobState.RUNNING  # type: ignore[union-attr]
    recorder.release.set()
    with trio.fail_after(5):
        await gen.stopped.wait()
    await wait_state(client, result.job.id, JobState.COMPLETED)
    assert (await client.get(late.job.id)).state is JobState.AVAILABLE  # type: ignore[union-attr]

    # A hard stop cancels a running job; it is requeued with its attempt restored.
    recorder.release = trio.Event()
    gen2 = await client.start_generation({"default": 4})
    blocked = await client.insert(Echo(3, "block"))
    with trio.fail_after(5):
        await recorder.started.setdefault(blocked.job.id, trio.Event()).wait()
    gen2.stop_and_cancel("test")
    with trio.fail_after(5):
        await gen2.stopped.wait()
    job = await wait_state(client, blocked.job.id, JobState.AVAILABLE)
    assert job.attempt == 0
    assert job.errors == ()


async def test_pause_and_resume(setup: tuple[QueueClient, Recorder]) -> None:
    client, _ = setup
    await client.pause("default")
    await client.start_generation({"default": 4})
    result = await client.insert(Echo(1))
    assert (await client.get(result.job.id)).state is JobState.AVAILABLE  # type: ignore[union-attr]
    await client.resume("default")
    await wait_state(client, result.job.id, JobState.COMPLETED)


async def test_insert_tx_is_invisible_until_commit_and_gone_on_rollback(
    setup: tuple[QueueClient, Recorder],
) -> None:
    client, _ = setup
    async with client.db.tasks.acquire() as conn:
        with pytest.raises(RuntimeError):
            async with conn.transaction():
                rolled = await client.insert_tx(conn, Echo(1))
                raise RuntimeError("rollback")
        async with conn.transaction():
            kept = await client.insert_tx(conn, Echo(2))
            assert await client.get(kept.job.id) is None  # other connections cannot see it
    assert await client.get(rolled.job.id) is None
    assert await client.get(kept.job.id) is not None


async def test_every_insert_is_picked_up_by_notify_not_by_the_poll(database: Database) -> None:
    # Regression: a follow-up claim in flight reserved every slot while an insert's NOTIFY
    # arrived; the loop that got the wake-up found no room, and the job waited for the poll.
    # With a 60 s poll, each of 100 single inserts must still start at once.
    arrived: dict[int, trio.Event] = {}

    async def handle(job: Job, args: Echo) -> None:
        arrived[args.n].set()

    workers = Workers()
    workers.register(Echo, handle)
    config = QueueConfig(fetch_poll_interval=60.0, completer_tick=0.01)
    async with open_queue(database, config, workers=workers) as client:
        await client.start_generation({"default": 4})
        for n in range(100):
            arrived[n] = trio.Event()
            started = trio.current_time()
            await client.insert(Echo(n))
            with trio.fail_after(5):
                await arrived[n].wait()
            await trio.sleep_until(started + 0.005)
