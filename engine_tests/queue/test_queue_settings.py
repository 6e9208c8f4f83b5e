"""The queue settings that act through the client: ``queue.default_max_attempts`` for jobs
inserted without their own limit, ``queue.job_timeout`` for kinds registered without their own
timeout. On a real database, observed on the stored job rows."""

from __future__ import annotations

import math
from typing import ClassVar

import attrs
import trio

from engine.db.database import Database
from engine.queue import InsertOpts, Job, JobState, Workers, open_queue
from engine.queue.config import QueueConfig
from engine.queue.insert import prepare
from engine_tests.queue.test_client import wait_state


@attrs.frozen
class Fail:
    kind: ClassVar[str] = "always_fails"
    n: int


@attrs.frozen
class Hang:
    kind: ClassVar[str] = "hangs"
    n: int


async def _fail(job: Job, args: Fail) -> None:
    raise RuntimeError("boom")


async def _wait_running_for_a_second(database: Database, job_id: int) -> None:
    """Wait (10 s at most) until the job's attempt began over a second ago, by the server's
    clock."""
    with trio.fail_after(10):
        while (
            await database.queue.fetchval(
                "SELECT now() - attempted_at > '1 s' FROM river_job WHERE id = $1", job_id
            )
        ) is not True:
            await trio.sleep(0.05)


def fast(**kw: object) -> QueueConfig:
    return QueueConfig(fetch_poll_interval=0.2, completer_tick=0.01, **kw)  # type: ignore[arg-type]


async def test_default_max_attempts_applies_to_jobs_inserted_without_a_limit(
    database: Database,
) -> None:
    async with open_queue(database, fast(default_max_attempts=3)) as client:
        plain = await client.insert(Fail(1))
        own = await client.insert(Fail(2), InsertOpts(max_attempts=7))
        no_limit = await client.insert(Fail(3), InsertOpts(priority=2))
        many = await client.insert_many([Fail(4), (Fail(5), InsertOpts(max_attempts=9))])
        async with database.tasks.transaction() as conn:
            in_tx = await client.insert_tx(conn, Fail(6))
        returned = [r.job.max_attempts for r in (plain, own, no_limit, *many, in_tx)]
        assert returned == [3, 7, 3, 3, 9, 3]
        stored = await database.queue.fetchval(
            "SELECT array_agg(max_attempts ORDER BY id) FROM river_job"
        )
        assert stored == [3, 7, 3, 3, 9, 3]


def test_without_a_client_the_default_stays_rivers() -> None:
    # prepare() alone (no client) keeps River's 25.
    assert prepare(Fail(1)).max_attempts == 25
    assert prepare(Fail(1), InsertOpts(max_attempts=4)).max_attempts == 4


async def test_default_max_attempts_one_discards_on_the_first_error(database: Database) -> None:
    workers = Workers()
    workers.register(Fail, _fail)
    async with open_queue(database, fast(default_max_attempts=1), workers=workers) as client:
        await client.start_generation({"default": 2})
        result = await client.insert(Fail(1))
        job = await wait_state(client, result.job.id, JobState.DISCARDED)
        assert job.attempt == 1 and job.max_attempts == 1
        assert "boom" in job.errors[0]["error"]


async def test_job_timeout_is_the_deadline_of_kinds_without_their_own(database: Database) -> None:
    release = trio.Event()

    async def hang(job: Job, args: object) -> None:
        await release.wait()

    workers = Workers()
    workers.register(Hang, hang)
    workers.register(dict, hang, kind="hangs_own_timeout", timeout=0.1)
    workers.register(dict, hang, kind="hangs_no_timeout", timeout=math.inf)
    config = fast(job_timeout=0.3)
    async with open_queue(database, config, workers=workers, stop_timeout=2) as client:
        await client.start_generation({"default": 4})
        opts = InsertOpts(max_attempts=1)
        inherited = await client.insert(Hang(1), opts)
        own = await client.insert({"n": 1}, opts, kind="hangs_own_timeout")
        opted_out = await client.insert({"n": 1}, opts, kind="hangs_no_timeout")
        job = await wait_state(client, inherited.job.id, JobState.DISCARDED)
        assert job.errors[-1]["error"] == "job timed out after 0.3 s"
        job = await wait_state(client, own.job.id, JobState.DISCARDED)
        assert job.errors[-1]["error"] == "job timed out after 0.1 s"
        # The kind registered with math.inf has no deadline: still running well past 0.3 s.
        await _wait_running_for_a_second(database, opted_out.job.id)
        still = await client.get(opted_out.job.id)
        assert still is not None and still.state is JobState.RUNNING and still.errors == ()
        release.set()
        await wait_state(client, opted_out.job.id, JobState.COMPLETED)


async def test_no_job_timeout_by_default(database: Database) -> None:
    assert QueueConfig().job_timeout is None
    release = trio.Event()
    running = trio.Event()

    async def hang(job: Job, args: Hang) -> None:
        running.set()
        await release.wait()

    workers = Workers()
    workers.register(Hang, hang)
    async with open_queue(database, fast(), workers=workers, stop_timeout=2) as client:
        await client.start_generation({"default": 1})
        result = await client.insert(Hang(1), InsertOpts(max_attempts=1))
        with trio.fail_after(10):
            await running.wait()
        await _wait_running_for_a_second(database, result.job.id)
        job = await client.get(result.job.id)
        assert job is not None and job.state is JobState.RUNNING and job.errors == ()
        release.set()
        await wait_state(client, result.job.id, JobState.COMPLETED)
