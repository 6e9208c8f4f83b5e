"""The queue on its own, on a real database: ``wait_drained`` returns once the queue's rows say
there is nothing left to do now (and not while a job runs or its outcome is unwritten), and
``engine.queue.open`` opens the database of an ``EngineConfig``, works jobs, and drains for
``queue.shutdown_drain_timeout`` when its block ends."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any, ClassVar

import attrs
import pytest
import trio

import engine.queue
from engine.config import EngineConfig
from engine.db.config import DatabaseConfig
from engine.db.database import Database
from engine.queue import InsertOpts, Job, JobState, QueueClient, Workers, open_queue
from engine.queue.config import QueueConfig


@attrs.frozen
class Work:
    kind: ClassVar[str] = "work"
    n: int
    block: bool = False


class Handler:
    """Records the jobs it ran; a ``block`` job waits for :attr:`release`."""

    def __init__(self) -> None:
        self.done: list[int] = []
        self.started = trio.Event()
        self.release = trio.Event()

    async def __call__(self, job: Job, args: Work) -> None:
        if args.block:
            self.started.set()
            await self.release.wait()
        self.done.append(args.n)


def _workers(handler: Handler) -> Workers:
    workers = Workers()
    workers.register(Work, handler)
    return workers


async def _states(database: Database, queue: str = "default") -> dict[str, int]:
    rows = await database.queue.fetch(
        "SELECT state::text AS state, count(*) AS n FROM river_job WHERE queue = $1 GROUP BY state",
        queue,
    )
    return {r["state"]: int(r["n"]) for r in rows}


class CountingLooks:
    """Wraps ``client.has_work`` to count the database looks and see what each answered."""

    def __init__(self, client: QueueClient) -> None:
        self.inner = client.has_work
        self.answers: list[bool] = []
        self.changed = trio.Event()
        client.has_work = self  # type: ignore[method-assign]

    async def __call__(self, queue: str = "default") -> bool:
        answer = await self.inner(queue)
        self.answers.append(answer)
        self.changed.set()
        return answer

    async def wait_for(self, looks: int) -> None:
        with trio.fail_after(10):
            while len(self.answers) < looks:
                self.changed = trio.Event()
                await self.changed.wait()


async def test_wait_drained_returns_once_every_job_is_completed(database: Database) -> None:
    handler = Handler()
    config = QueueConfig(fetch_poll_interval=0.2, completer_tick=0.01)
    async with open_queue(database, config, workers=_workers(handler)) as client:
        await client.insert_many([Work(n) for n in range(200)])
        await client.start_generation({"default": 8})
        with trio.fail_after(30):
            await client.wait_drained("default")
        assert await _states(database) == {"completed": 200}
        assert sorted(handler.done) == list(range(200))


async def test_wait_drained_waits_for_the_outcome_to_be_written(database: Database) -> None:
    # A completer tick of 0.5 s and a 5 s poll: a finished job's outcome reaches its row up to
    # half a second after the handler returned, while this client holds no job any more.
    handler = Handler()
    config = QueueConfig(fetch_poll_interval=5.0, completer_tick=0.5)
    async with open_queue(database, config, workers=_workers(handler)) as client:
        await client.start_generation({"default": 4})
        await client.insert_many([Work(n) for n in range(3)])
        with trio.fail_after(30):
            await client.wait_drained()
        assert sorted(handler.done) == [0, 1, 2]
        assert await _states(database) == {"completed": 3}


async def test_wait_drained_does_not_return_while_a_job_runs(database: Database) -> None:
    handler = Handler()
    config = QueueConfig(fetch_poll_interval=0.2, completer_tick=0.01)
    async with (
        open_queue(database, config, workers=_workers(handler)) as worker,
        open_queue(database, config) as watcher,
    ):
        await worker.start_generation({"default": 4})
        blocked = await watcher.insert(Work(1, block=True))
        with trio.fail_after(10):
            await handler.started.wait()
        looks = CountingLooks(watcher)
        mine = CountingLooks(worker)
        returned: list[str] = []

        async def wait(name: str, client: QueueClient) -> None:
            await client.wait_drained()
            returned.append(name)

        with trio.fail_after(20):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(wait, "watcher", watcher)
                nursery.start_soon(wait, "worker", worker)
                # The watcher runs no job: it asks the database, which says running, again and
                # again. The worker holds the job: it does not even ask.
                await looks.wait_for(4)
                assert looks.answers == [True] * len(looks.answers)
                assert mine.answers == []
                assert returned == []
                handler.release.set()
        assert sorted(returned) == ["watcher", "worker"]
        assert looks.answers[-1] is False and mine.answers[-1] is False
        job = await watcher.get(blocked.job.id)
        assert job is not None and job.state is JobState.COMPLETED


async def test_work_for_later_does_not_count_and_due_work_does(database: Database) -> None:
    async with open_queue(database, QueueConfig()) as client:
        assert not await client.has_work("default")
        later = datetime.now(UTC) + timedelta(hours=1)
        await client.insert_many(
            [
                (Work(1), InsertOpts(scheduled_at=later)),
                (Work(2), InsertOpts(pending=True)),
                (Work(3), InsertOpts(queue="elsewhere")),
            ]
        )
        assert not await client.has_work("default")
        with trio.fail_after(5):
            await client.wait_drained("default")  # at once: nothing to do now
        assert await client.has_work("elsewhere")
        due = await client.insert(Work(4), InsertOpts(scheduled_at=datetime.now(UTC)))
        assert due.job.state is JobState.SCHEDULED
        assert await client.has_work("default")
        await database.queue.execute(
            "UPDATE river_job SET state = 'retryable', scheduled_at = now() + interval '1 h'"
            " WHERE id = $1",
            due.job.id,
        )
        assert not await client.has_work("default")
        await database.queue.execute(
            "UPDATE river_job SET scheduled_at = now() - interval '1 s' WHERE id = $1", due.job.id
        )
        assert await client.has_work("default")


async def test_a_due_scheduled_job_is_waited_for_until_it_ran(database: Database) -> None:
    handler = Handler()
    config = QueueConfig(fetch_poll_interval=0.2, completer_tick=0.01, scheduler_interval=0.2)
    async with open_queue(database, config, workers=_workers(handler)) as client:
        await client.start_generation({"default": 4})
        due = await client.insert(Work(1), InsertOpts(scheduled_at=datetime.now(UTC)))
        assert due.job.state is JobState.SCHEDULED
        with trio.fail_after(30):
            await client.wait_drained()
        assert handler.done == [1]
        assert await _states(database) == {"completed": 1}


async def test_wait_drained_needs_a_positive_poll_interval(database: Database) -> None:
    async with open_queue(database, QueueConfig()) as client:
        with pytest.raises(ValueError, match="poll_interval"):
            await client.wait_drained(poll_interval=0)


# ---- engine.queue.open -----------------------------------------------------------------------


def _engine_config(db_url: str, **queue: Any) -> EngineConfig:
    settings = {"fetch_poll_interval": 0.2, "completer_tick": 0.01, **queue}
    return EngineConfig(
        database=DatabaseConfig(url=db_url, pool_max_size=6),
        queue=QueueConfig(**settings),
    )


async def test_open_works_the_default_queue_at_max_workers(db_url: str) -> None:
    handler = Handler()
    config = _engine_config(db_url, max_workers=3)
    async with engine.queue.open(config, workers=_workers(handler)) as client:
        (generation,) = client.generations
        assert dict(generation.config.queues) == {"default": 3}
        await client.insert_many([Work(n) for n in range(20)])
        with trio.fail_after(30):
            await client.wait_drained()
        assert await client.counts() == {"default": {"completed": 20}}


async def test_open_with_queues_and_without_workers(db_url: str) -> None:
    handler = Handler()
    config = _engine_config(db_url)
    async with engine.queue.open(config, workers=_workers(handler), queues={}) as client:
        assert client.generations == []
        await client.start_generation({"email": 2})
    async with engine.queue.open(config) as inserter:
        assert inserter.generations == [] and inserter.elector is None
        await inserter.insert(Work(1))
        with pytest.raises(RuntimeError, match="needs a queue client made with workers"):
            await inserter.start_generation({"default": 1})
    with pytest.raises(ValueError, match="queues= needs workers="):
        async with engine.queue.open(config, queues={"default": 1}):
            pass


async def test_an_error_in_the_block_comes_out_as_itself(db_url: str) -> None:
    with pytest.raises(KeyError, match="mine"):
        async with engine.queue.open(_engine_config(db_url), workers=_workers(Handler())):
            raise KeyError("mine")


async def test_leaving_open_drains_for_the_shutdown_drain_timeout_then_requeues(
    db_url: str,
) -> None:
    handler = Handler()
    config = _engine_config(db_url, shutdown_drain_timeout=0.3)
    async with engine.queue.open(config, workers=_workers(handler)) as client:
        blocked = await client.insert(Work(1, block=True))
        with trio.fail_after(10):
            await handler.started.wait()
        left = trio.current_time()
    assert trio.current_time() - left >= 0.3  # the drain waited out the setting
    async with engine.queue.open(config) as client:
        job = await client.get(blocked.job.id)
        assert job is not None
        assert (job.state, job.attempt, job.errors) == (JobState.AVAILABLE, 0, ())


async def test_open_queue_stops_by_the_setting_unless_told(database: Database) -> None:
    handler = Handler()
    config = QueueConfig(fetch_poll_interval=0.2, completer_tick=0.01, shutdown_drain_timeout=0)
    with trio.fail_after(5):  # the default drain of 10 s would take longer
        async with open_queue(database, config, workers=_workers(handler)) as client:
            await client.start_generation({"default": 1})
            blocked = await client.insert(Work(1, block=True))
            await handler.started.wait()
    row = await database.queue.fetchrow(
        "SELECT state::text AS state, attempt FROM river_job WHERE id = $1", blocked.job.id
    )
    assert (row["state"], row["attempt"]) == ("available", 0)

    # Told otherwise: a job that finishes within the given timeout completes.
    handler = Handler()
    async with open_queue(database, config, workers=_workers(handler), stop_timeout=10) as client:
        await client.start_generation({"second": 1})
        await client.insert(Work(2, block=True), InsertOpts(queue="second"))
        with trio.fail_after(10):
            await handler.started.wait()
        # Released once the stop has begun: the job finishes during the drain.
        client.generations[0].stop("test")
        handler.release.set()
    assert await _states(database, "second") == {"completed": 1}
