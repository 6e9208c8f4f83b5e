"""Scope admissions, the dispatcher, rate limits and the recovery steps, on crafted rows."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

import pytest
import trio

from engine.admission.dispatcher import Dispatcher
from engine.config import load_config
from engine.db.bridge import connect
from engine.db.database import DatabaseUrls, open_database
from engine.domain.tasks import TaskStatus
from engine.queue.job import JobSnooze
from engine.recovery.rescuer import Rescuer
from engine.service.engine import Engine
from engine.service.settings import dispatcher_settings, recovery_settings
from engine.tasks.jobs import TaskRunArgs
from engine_tests.tasks.conftest import OpenEngine, make_config, request
from engine_tests.tasks.conftest import open_test_engine as open_test_engine  # fixture
from engine_tests.tasks.test_runner import GatedProvider, job_of, sim, status


@pytest.fixture
async def idle(open_test_engine: OpenEngine) -> AsyncIterator[Engine]:
    """An engine that executes nothing by itself; the test runs tasks and dispatches."""
    async with open_test_engine(execute=False, simulated=GatedProvider()) as engine:
        await engine.set_model("sim-model", concurrency_limit=1)
        yield engine


async def run_job(eng: Engine, task_id: uuid.UUID) -> None:
    await eng.runner.work(await job_of(eng, task_id), TaskRunArgs(str(task_id)))


async def admission_status(eng: Engine, task_id: uuid.UUID) -> str | None:
    value = await eng.db.tasks.fetchval(
        "SELECT status FROM engine_task_admission WHERE task_id = $1", task_id
    )
    return None if value is None else str(value)


async def test_a_full_scope_makes_tasks_wait_and_the_dispatcher_admits_fifo(idle: Engine) -> None:
    a, b, c = await idle.submit([request() for _ in range(3)])
    sim(idle).poll_gate = gate = trio.Event()
    dispatcher = Dispatcher(dispatcher_settings(idle.config), idle.db)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(run_job, idle, a)
        with trio.fail_after(5):
            await sim(idle).in_poll.wait()
        await run_job(idle, b)  # the scope is full: b waits (its job completes)
        await run_job(idle, c)
        assert [await admission_status(idle, t) for t in (b, c)] == ["waiting", "waiting"]
        assert (await status(idle, b)).status is TaskStatus.QUEUED
        assert (await dispatcher.run_once()).admitted == 0  # still full
        gate.set()
    assert (await status(idle, a)).status is TaskStatus.SUCCEEDED
    report = await dispatcher.run_once()
    assert report.admitted == 1 and report.waiting == 1
    assert [await admission_status(idle, t) for t in (b, c)] == ["admitted", "waiting"]
    await run_job(idle, b)  # admitted: its reserved slot becomes its lease
    assert (await status(idle, b)).status is TaskStatus.SUCCEEDED
    assert (await dispatcher.run_once()).admitted == 1
    await run_job(idle, c)
    assert (await status(idle, c)).status is TaskStatus.SUCCEEDED
    assert await idle.db.tasks.fetchval("SELECT count(*) FROM engine_scope_lease") == 0
    # Waiting was not a run: each task ran once.
    assert [(await status(idle, t)).attempts for t in (a, b, c)] == [1, 1, 1]


_AUDIT = """
CREATE TABLE status_audit (n bigserial PRIMARY KEY, task_id uuid, status text, attempts int);
CREATE FUNCTION audit_status() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO status_audit (task_id, status, attempts) VALUES (NEW.id, NEW.status, NEW.attempts);
    RETURN NEW;
END
$$;
CREATE TRIGGER audit_status AFTER UPDATE OF status ON engine_task
    FOR EACH ROW WHEN (OLD.status IS DISTINCT FROM NEW.status) EXECUTE FUNCTION audit_status();
"""


async def test_waiting_tasks_are_never_running_and_each_runs_once(
    open_test_engine: OpenEngine,
) -> None:
    # Executing for real, with the service's dispatcher: three tasks of a model limited to 1,
    # the first held upstream while the others wait. Every status change is recorded by a
    # trigger, so a task shown running even for a moment would be seen.
    provider = GatedProvider()
    async with open_test_engine(simulated=provider) as eng:
        await eng.set_model("sim-model", concurrency_limit=1)
        await eng.db.tasks.execute(_AUDIT)
        provider.poll_gate = gate = trio.Event()
        ids = await eng.submit([request() for _ in range(3)])
        with trio.fail_after(10):
            await provider.in_poll.wait()
            while (
                await eng.db.tasks.fetchval(
                    "SELECT count(*) FROM engine_task_admission WHERE status = 'waiting'"
                )
                < 2
            ):
                await trio.sleep(0.02)
        tasks = [await status(eng, t) for t in ids]
        assert sorted((t.status.value, t.attempts) for t in tasks) == [
            ("queued", 0),
            ("queued", 0),
            ("running", 1),
        ]
        assert all(t.started_at is None for t in tasks if t.status is TaskStatus.QUEUED)
        gate.set()
        done = [await eng.wait(t, timeout=20) for t in ids]
        # Events are written in batches: wait (bounded) until each task's history shows its
        # final event, so every earlier event is in too.
        with trio.fail_after(10):
            while True:
                histories = [[e.type for e in await eng.events(t)] for t in ids]
                if all("task.succeeded" in h for h in histories):
                    break
                await trio.sleep(0.02)
        started = [
            [e.payload["attempt"] for e in await eng.events(t) if e.type == "task.started"]
            for t in ids
        ]
        audit = await eng.db.tasks.fetch(
            "SELECT task_id, status, attempts FROM status_audit ORDER BY n"
        )
    assert [(t.status, t.attempts) for t in done] == [(TaskStatus.SUCCEEDED, 1)] * 3
    for task_id in ids:
        changes = [(r["status"], r["attempts"]) for r in audit if r["task_id"] == task_id]
        assert changes == [("running", 1), ("succeeded", 1)]
    assert started == [[1]] * 3  # one start each, its first attempt


async def test_a_claim_waiting_for_a_scope_lock_is_not_shown_running(
    idle: Engine, db_url: str
) -> None:
    # Another admission holds the scope's lock: the claim waits for it, and meanwhile the task
    # reads as queued, with no attempt counted.
    task_id = await idle.submit(request())
    locker = await connect(db_url)
    try:
        async with trio.open_nursery() as nursery, locker.transaction():
            await locker.execute(
                "SELECT pg_advisory_xact_lock(hashtext('engine.scope:' || $1))",
                "model:sim-model",
            )
            nursery.start_soon(run_job, idle, task_id)
            with trio.fail_after(10):
                while not await idle.db.tasks.fetchval(
                    "SELECT count(*) FROM pg_locks l JOIN pg_database d ON d.oid = l.database"
                    " WHERE l.locktype = 'advisory' AND NOT l.granted"
                    " AND d.datname = current_database()"
                ):
                    await trio.sleep(0.01)
            task = await status(idle, task_id)
            assert task.status is TaskStatus.QUEUED and task.execution_token is not None
            assert task.attempts == 0 and task.started_at is None and task.phase is None
    finally:
        await locker.close()
    task = await status(idle, task_id)
    assert task.status is TaskStatus.SUCCEEDED and task.attempts == 1


async def test_a_wait_completes_its_job_so_admission_enqueues_a_new_one(idle: Engine) -> None:
    first, second = await idle.submit([request(), request()])
    await idle.db.tasks.execute(
        "INSERT INTO engine_scope_lease (scope, task_id) VALUES ('model:sim-model', $1)", first
    )
    job = await job_of(idle, second)
    # Running, as a producer's claim leaves it: the handler's completion would reach the
    # database only after it returns, possibly after a dispatcher admitted the task.
    await idle.db.tasks.execute(
        "UPDATE river_job SET state = 'running', attempt = 1, attempted_at = now() WHERE id = $1",
        job.id,
    )
    await run_job(idle, second)  # the scope is full: it waits
    waited = await idle.queue.get(job.id)
    assert waited is not None and waited.state.value == "completed"
    await idle.db.tasks.execute("DELETE FROM engine_scope_lease")
    assert (await Dispatcher(dispatcher_settings(idle.config), idle.db).run_once()).admitted == 1
    task = await status(idle, second)
    assert task.status is TaskStatus.QUEUED and task.river_job_id != job.id
    fresh = await idle.queue.get(task.river_job_id)  # type: ignore[arg-type]
    assert fresh is not None and fresh.state.value == "available"
    await run_job(idle, second)
    task = await status(idle, second)
    assert task.status is TaskStatus.SUCCEEDED and task.attempts == 1


async def test_a_new_task_does_not_jump_the_line(idle: Engine) -> None:
    a, b = await idle.submit([request(), request()])
    await idle.db.tasks.execute(
        "INSERT INTO engine_task_admission (task_id, scopes, status) VALUES ($1, $2, 'waiting')",
        a,
        ["model:sim-model"],
    )
    await run_job(idle, b)  # room in the scope, but a waits ahead of it
    assert await admission_status(idle, b) == "waiting"


async def _waiting(eng: Engine, group: str) -> uuid.UUID:
    task_id = await eng.submit(request(group_key=group))
    await eng.db.tasks.execute(
        "INSERT INTO engine_task_admission (task_id, scopes, group_key, status)"
        " VALUES ($1, $2, $3, 'waiting')",
        task_id,
        ["model:sim-model"],
        group,
    )
    return task_id


async def test_dispatch_is_fair_across_groups(idle: Engine) -> None:
    await idle.set_model("sim-model", concurrency_limit=2)
    g1 = [await _waiting(idle, "g1") for _ in range(3)]
    g2 = [await _waiting(idle, "g2")]
    await Dispatcher(dispatcher_settings(idle.config), idle.db).run_once()
    admitted = {t for t in [*g1, *g2] if await admission_status(idle, t) == "admitted"}
    assert admitted == {g1[0], g2[0]}


async def test_the_reaper_fails_tasks_past_their_queue_timeout(idle: Engine) -> None:
    task_id = await _waiting(idle, "")
    await idle.db.tasks.execute(
        "UPDATE engine_task_admission SET expires_at = now() - interval '1 s',"
        " enqueued_at = now() - interval '31 s'"
    )
    assert await Dispatcher(dispatcher_settings(idle.config), idle.db).reap() == 1
    task = await status(idle, task_id)
    assert task.status is TaskStatus.FAILED
    assert task.error["code"] == "queue_timeout"
    assert task.error["message"].startswith("waited 31")
    assert await admission_status(idle, task_id) is None


async def test_queue_timeout_is_set_from_config(open_test_engine: OpenEngine) -> None:
    config = make_config(**{"admission.queue_timeout": "30"})
    async with open_test_engine(config, execute=False, simulated=GatedProvider()) as eng:
        await eng.set_model("sim-model", concurrency_limit=1)
        first, second = await eng.submit([request(), request()])
        await eng.db.tasks.execute(
            "INSERT INTO engine_scope_lease (scope, task_id) VALUES ('model:sim-model', $1)",
            first,
        )
        await run_job(eng, second)
        expires = await eng.db.tasks.fetchval(
            "SELECT extract(epoch FROM expires_at - enqueued_at) FROM engine_task_admission"
        )
        assert 29 < float(expires) <= 31


async def test_admitted_tasks_that_never_start_are_yielded(idle: Engine) -> None:
    task_id = await _waiting(idle, "")
    await idle.db.tasks.execute(
        "UPDATE engine_task_admission SET status = 'admitted',"
        " admitted_at = now() - interval '60 s'"
    )
    await Rescuer(recovery_settings(idle.config), idle.db, "someone").run_once()
    assert await admission_status(idle, task_id) == "waiting"


async def test_two_dispatchers_never_over_admit(idle: Engine, db_url: str) -> None:
    await idle.set_model("sim-model", concurrency_limit=5)
    tasks = [await _waiting(idle, f"g{n % 3}") for n in range(40)]
    config = load_config(env={})
    async with open_database(DatabaseUrls.single(db_url)) as other_db:
        one = Dispatcher(dispatcher_settings(config), idle.db)
        two = Dispatcher(dispatcher_settings(config), other_db)
        async with trio.open_nursery() as nursery:
            for _ in range(5):
                nursery.start_soon(one.run_once)
                nursery.start_soon(two.run_once)
    admitted = [t for t in tasks if await admission_status(idle, t) == "admitted"]
    assert len(admitted) == 5
    assert one.admitted + two.admitted == 5


async def test_rate_limit_snoozes_the_task_and_gives_tokens_back_on_early_failure(
    idle: Engine,
) -> None:
    await idle.set_model("sim-model")  # no concurrency limit
    await idle.db.tasks.execute(
        "UPDATE engine_model SET rate_limit = 2, rate_interval = 60 WHERE name = 'sim-model'"
    )
    a, b, c = await idle.submit([request() for _ in range(3)])
    await run_job(idle, a)
    sim(idle).prepare_error = RuntimeError("fails before reaching the upstream")
    await run_job(idle, b)  # takes the second token, fails in prepare: the token comes back
    assert (await status(idle, b)).status is TaskStatus.FAILED
    sim(idle).prepare_error = None
    await run_job(idle, c)  # gets the returned token
    assert (await status(idle, c)).status is TaskStatus.SUCCEEDED
    d = await idle.submit(request())
    with pytest.raises(JobSnooze) as snooze:
        await run_job(idle, d)  # the bucket is empty now: wait for the refill (30 s a token)
    assert 25 < snooze.value.seconds <= 30
    task = await status(idle, d)
    assert task.status is TaskStatus.QUEUED and task.execution_token is None
    assert task.attempts == 0 and task.started_at is None  # waiting for a token is not a run


async def test_recovery_steps_on_crafted_rows(idle: Engine) -> None:
    await idle.set_model("sim-model")
    dead, ambiguous, lost, finished = await idle.submit([request() for _ in range(4)])
    db = idle.db.tasks
    await db.execute(
        "INSERT INTO engine_worker_instance (instance_id, heartbeat_at, started_at)"
        " VALUES ('dead-host:1:1', now() - interval '10 min', now() - interval '1 h')"
    )
    # Running on a dead owner, upstream answered: back to queued, reference kept.
    await db.execute(
        "UPDATE engine_task SET status = 'running', execution_token = gen_random_uuid(),"
        " execution_owner = 'dead-host:1:1', lease_expires_at = now() + interval '1 h',"
        " submitted_at = now(), upstream_ref = 'ref-1' WHERE id = $1",
        dead,
    )
    # Running on a dead owner, submission ambiguous: manual review, never resubmitted.
    await db.execute(
        "UPDATE engine_task SET status = 'running', execution_token = gen_random_uuid(),"
        " execution_owner = 'dead-host:1:1', lease_expires_at = now() + interval '1 h',"
        " submitted_at = now() WHERE id = $1",
        ambiguous,
    )
    # Queued, its job gone: re-enqueued.
    await db.execute("DELETE FROM river_job WHERE args->>'task_id' = $1", str(lost))
    # A lease left behind by a finished task: released.
    await db.execute(
        "UPDATE engine_task SET status = 'succeeded', finished_at = now() WHERE id = $1", finished
    )
    await db.execute(
        "INSERT INTO engine_scope_lease (scope, task_id) VALUES ('model:sim-model', $1)", finished
    )
    # A job running on the dead instance: available again, attempt given back.
    job = await job_of(idle, dead)
    await db.execute(
        "UPDATE river_job SET state = 'running', attempt = 1, attempted_at = now() - interval"
        " '10 min', attempted_by = ARRAY['dead-host:1:1-exec-4-123'] WHERE id = $1",
        job.id,
    )
    report = await Rescuer(recovery_settings(idle.config), idle.db, "me:1:1").run_once()
    assert report.requeued_tasks == 1 and report.manual_review_tasks == 1
    assert report.orphaned_jobs == 1 and report.released_leases == 1
    assert report.reenqueued_tasks >= 1
    task = await status(idle, dead)
    assert task.status is TaskStatus.QUEUED and task.upstream_ref == "ref-1"
    assert (await status(idle, ambiguous)).status is TaskStatus.MANUAL_REVIEW
    rescued = await idle.queue.get(job.id)
    assert rescued is not None and rescued.state.value == "available" and rescued.attempt == 0
    assert (await status(idle, lost)).river_job_id is not None
    # The requeued task resumes polling: it is never submitted again.
    await run_job(idle, dead)
    assert (await status(idle, dead)).status is TaskStatus.SUCCEEDED


async def test_a_dead_instances_jobs_are_rescued_at_once_an_unknown_ones_only_when_old(
    idle: Engine,
) -> None:
    """A job that just started on an instance the registry shows dead goes back at once, in its
    old place in the queue (its task was already requeued: waiting out
    ``recovery.stale_after`` from the claim only delays the resubmission). One that just
    started on an instance the registry does not know may belong to one that has not
    registered yet, so it waits until it is older than that."""
    await idle.set_model("sim-model")
    on_dead, on_unknown = await idle.submit([request() for _ in range(2)])
    db = idle.db.tasks
    await db.execute(
        "INSERT INTO engine_worker_instance (instance_id, heartbeat_at, started_at)"
        " VALUES ('dead-host:1:1', now() - interval '10 min', now() - interval '1 h')"
    )
    jobs = {}
    for task_id, owner in ((on_dead, "dead-host:1:1"), (on_unknown, "new-host:1:1")):
        jobs[task_id] = (await job_of(idle, task_id)).id
        await db.execute(
            "UPDATE river_job SET state = 'running', attempt = 1, attempted_at = now(),"
            " attempted_by = ARRAY[$2 || '-exec-4-123'] WHERE id = $1",
            jobs[task_id],
            owner,
        )
    queued_at = (await idle.queue.get(jobs[on_dead])).scheduled_at  # type: ignore[union-attr]
    rescuer = Rescuer(recovery_settings(idle.config), idle.db, "me:1:1")

    async def state(task_id: uuid.UUID) -> str:
        job = await idle.queue.get(jobs[task_id])
        assert job is not None
        return str(job.state.value)

    assert (await rescuer.run_once()).orphaned_jobs == 1
    assert await state(on_dead) == "available" and await state(on_unknown) == "running"
    # Back in its old place in the queue, ahead of the jobs that came after it.
    assert (await idle.queue.get(jobs[on_dead])).scheduled_at == queued_at  # type: ignore[union-attr]
    stale_after = idle.config.recovery.stale_after
    await db.execute(
        "UPDATE river_job SET attempted_at = now() - make_interval(secs => $2 + 1) WHERE id = $1",
        jobs[on_unknown],
        stale_after,
    )
    assert (await rescuer.run_once()).orphaned_jobs == 1
    assert await state(on_unknown) == "available"
    assert sim(idle).submissions == {}
