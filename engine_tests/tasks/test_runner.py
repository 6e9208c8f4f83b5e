"""The worker's decision table (docs/tasks.md), row by row, on a real database; fencing; cancel."""

from __future__ import annotations

import logging
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest
import trio
import trio.testing

from engine.bench.proxy import TcpProxy, tcp_proxy
from engine.db.bridge import connect
from engine.db.database import DatabaseUrls
from engine.db.sqlfiles import QUERIES
from engine.domain.tasks import RunMode, Task, TaskEvent, TaskStatus
from engine.errors import ConnectionLost, DatabaseError
from engine.load.controller import LoadController
from engine.load.retry_delay import refused_start_delay
from engine.providers.base import NotSubmitted, PollResult
from engine.providers.simulated import SimulatedProvider
from engine.queue.job import Job, JobSnooze
from engine.service.engine import Engine
from engine.service.root import open as open_engine
from engine.tasks.jobs import TaskRunArgs
from engine_tests.tasks.conftest import OpenEngine, make_config, request


class GatedProvider(SimulatedProvider):
    """A simulated provider whose steps can be held open by the test."""

    def __init__(self) -> None:
        super().__init__()
        self.prepare_gate: trio.Event | None = None
        self.poll_gate: trio.Event | None = None
        self.in_prepare = trio.Event()
        self.in_poll = trio.Event()
        self.submit_gate: trio.Event | None = None
        self.in_submit = trio.Event()
        self.prepare_error: BaseException | None = None
        #: An exception to raise from submit (after the upstream accepted the request), poll
        #: or finalize, by method name.
        self.errors: dict[str, BaseException] = {}

    async def submit(self, task: Task, prepared: Any) -> str:
        self.in_submit.set()
        if self.submit_gate is not None:
            await self.submit_gate.wait()
        ref = await super().submit(task, prepared)
        if "submit" in self.errors:
            raise self.errors["submit"]
        return ref

    async def finalize(self, task: Task, result: Any) -> Any:
        if "finalize" in self.errors:
            raise self.errors["finalize"]
        return await super().finalize(task, result)

    async def prepare(self, task: Task) -> Any:
        self.in_prepare.set()
        if self.prepare_gate is not None:
            await self.prepare_gate.wait()
        if self.prepare_error is not None:
            raise self.prepare_error
        return await super().prepare(task)

    async def poll(self, task: Task, upstream_ref: str) -> PollResult:
        self.in_poll.set()
        if self.poll_gate is not None:
            await self.poll_gate.wait()
        if "poll" in self.errors:
            raise self.errors["poll"]
        return await super().poll(task, upstream_ref)


@pytest.fixture
async def idle(open_test_engine: OpenEngine) -> AsyncIterator[Engine]:
    """An engine that executes nothing by itself: the test calls the runner directly."""
    async with open_test_engine(execute=False, simulated=GatedProvider()) as engine:
        await engine.set_model("sim-model")
        yield engine


def sim(eng: Engine) -> GatedProvider:
    provider = eng.simulated
    assert isinstance(provider, GatedProvider)
    return provider


async def job_of(eng: Engine, task_id: uuid.UUID) -> Job:
    task = await eng.get(task_id)
    assert task is not None and task.river_job_id is not None
    job = await eng.queue.get(task.river_job_id)
    assert job is not None
    return job


async def work(eng: Engine, task_id: uuid.UUID) -> None:
    await eng.runner.work(await job_of(eng, task_id), TaskRunArgs(str(task_id)))


async def status(eng: Engine, task_id: uuid.UUID) -> Task:
    task = await eng.get(task_id)
    assert task is not None
    return task


async def test_row_1_read_error_is_raised_for_a_retry(idle: Engine) -> None:
    task_id = await idle.submit(request())
    job = await job_of(idle, task_id)
    await idle.db.tasks.execute("ALTER TABLE engine_task RENAME TO engine_task_moved")
    try:
        with pytest.raises(DatabaseError, match="engine_task"):
            await idle.runner.work(job, TaskRunArgs(str(task_id)))
    finally:
        await idle.db.tasks.execute("ALTER TABLE engine_task_moved RENAME TO engine_task")


async def test_missing_task_completes_its_job(idle: Engine) -> None:
    task_id = await idle.submit(request())
    job = await job_of(idle, task_id)
    await idle.db.tasks.execute("DELETE FROM engine_task")
    await idle.runner.work(job, TaskRunArgs(str(task_id)))  # returns: the job completes
    assert sim(idle).submissions == {}


@pytest.mark.parametrize("final", ["succeeded", "failed", "cancelled"])
async def test_row_2_final_task_completes_without_running(idle: Engine, final: str) -> None:
    task_id = await idle.submit(request())
    await idle.db.tasks.execute(
        "UPDATE engine_task SET status = $2, finished_at = now() WHERE id = $1", task_id, final
    )
    await work(idle, task_id)
    assert sim(idle).submissions == {}
    assert (await status(idle, task_id)).status.value == final


async def test_row_3_load_refusal_snoozes_with_the_hashed_delay(idle: Engine) -> None:
    task_id = await idle.submit(request())
    idle.runner.load = LoadController(mode="legacy", claim_limit=0)
    with pytest.raises(JobSnooze) as snooze:
        await work(idle, task_id)
    assert snooze.value.seconds == refused_start_delay(str(task_id))
    assert 0.25 <= snooze.value.seconds <= 0.75
    assert (await status(idle, task_id)).status is TaskStatus.QUEUED


async def test_rows_4_5_run_with_a_fresh_token_to_success(idle: Engine) -> None:
    task_id = await idle.submit(request())
    await work(idle, task_id)
    task = await status(idle, task_id)
    assert task.status is TaskStatus.SUCCEEDED and task.attempts == 1
    assert task.execution_token is None and task.execution_owner == idle.instance_id


async def test_row_6_lease_held_by_a_live_token_completes(idle: Engine) -> None:
    task_id = await idle.submit(request())
    other = uuid.uuid4()
    await idle.db.tasks.execute(
        "UPDATE engine_task SET status = 'running', execution_token = $2,"
        " lease_expires_at = now() + interval '1 hour' WHERE id = $1",
        task_id,
        other,
    )
    await work(idle, task_id)
    task = await status(idle, task_id)
    assert task.execution_token == other and task.status is TaskStatus.RUNNING
    assert sim(idle).submissions == {}


async def test_row_7_ambiguous_submission_goes_to_manual_review(idle: Engine) -> None:
    task_id = await idle.submit(request())
    # A previous execution marked the submission and died before recording the reference.
    await idle.db.tasks.execute(
        "UPDATE engine_task SET status = 'running', execution_token = gen_random_uuid(),"
        " lease_expires_at = now() - interval '1 second', submitted_at = now() WHERE id = $1",
        task_id,
    )
    await work(idle, task_id)
    task = await status(idle, task_id)
    assert task.status is TaskStatus.MANUAL_REVIEW
    assert task.error["code"] == "ambiguous_submission"
    assert sim(idle).submissions == {}


async def test_row_7_a_submission_the_provider_calls_ambiguous(
    open_test_engine: OpenEngine,
) -> None:
    from engine.providers.simulated import SimulationConfig

    provider = SimulatedProvider(SimulationConfig(ambiguous_rate=1.0))
    async with open_test_engine(simulated=provider) as eng:
        await eng.set_model("sim-model")
        task = await eng.wait(await eng.submit(request()), timeout=10)
    assert task.status is TaskStatus.MANUAL_REVIEW
    assert sum(provider.submissions.values()) == 1


async def test_row_8_task_queued_with_a_delay_snoozes(idle: Engine) -> None:
    task_id = await idle.submit(request())
    await idle.db.tasks.execute(
        "UPDATE engine_task SET next_run_at = now() + interval '30 seconds' WHERE id = $1",
        task_id,
    )
    with pytest.raises(JobSnooze) as snooze:
        await work(idle, task_id)
    assert 28 < snooze.value.seconds <= 30
    assert (await status(idle, task_id)).status is TaskStatus.QUEUED


async def test_row_9_hard_stop_requeues_the_task_and_keeps_its_upstream_ref(
    idle: Engine,
) -> None:
    task_id = await idle.submit(request())
    sim(idle).poll_gate = trio.Event()  # never set: the task waits upstream
    with trio.CancelScope() as scope:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(work, idle, task_id)
            with trio.fail_after(5):
                await sim(idle).in_poll.wait()
            scope.cancel()
    task = await status(idle, task_id)
    assert task.status is TaskStatus.QUEUED and task.execution_token is None
    assert task.upstream_ref is not None  # the next run resumes polling
    sim(idle).poll_gate = None
    await work(idle, task_id)
    assert (await status(idle, task_id)).status is TaskStatus.SUCCEEDED
    assert sim(idle).submissions[task_id] == 1


async def test_a_stop_during_the_upstream_call_waits_for_its_answer(idle: Engine) -> None:
    task_id = await idle.submit(request())
    gate = sim(idle).submit_gate = trio.Event()
    sim(idle).poll_gate = trio.Event()  # waits upstream afterwards: the stop lands there
    scope = trio.CancelScope()

    async def stopped_worker() -> None:
        with scope:
            await work(idle, task_id)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(stopped_worker)
        with trio.fail_after(5):
            await sim(idle).in_submit.wait()
        scope.cancel()  # the stop arrives while the upstream call is under way
        await trio.testing.wait_all_tasks_blocked()
        gate.set()  # ...and the upstream answers
    task = await status(idle, task_id)
    # Not ambiguous: the reference was recorded, the task is requeued to resume polling.
    assert task.status is TaskStatus.QUEUED and task.upstream_ref is not None
    assert sim(idle).submissions[task_id] == 1 and task_id not in sim(idle).cancelled


@pytest.mark.parametrize("answers", [True, False])
async def test_a_hard_stop_of_the_generation_mid_submit_waits_the_grace(
    open_test_engine: OpenEngine, answers: bool
) -> None:
    """The same stop as a job of a running engine meets it: the generation's hard stop, seen
    by the watcher in the generation's work nursery (not one of the submission's own)."""
    provider = GatedProvider()
    provider.submit_gate = trio.Event()
    provider.poll_gate = trio.Event()  # waits upstream afterwards: the stop lands there
    async with open_test_engine(max_workers=4, simulated=provider) as eng:
        await eng.set_model("sim-model")
        eng.runner.submit_grace = 0.5
        task_id = await eng.submit(request())
        with trio.fail_after(10):
            await provider.in_submit.wait()
        (generation,) = eng.queue.generations
        generation.stop_and_cancel("test: hard stop")
        if answers:
            await trio.sleep(0.1)
            provider.submit_gate.set()
        with trio.fail_after(10):
            await generation.stopped.wait()
        task = await status(eng, task_id)
    if answers:
        # Recorded, then requeued by the stop: the next run resumes polling.
        assert task.status is TaskStatus.QUEUED and task.upstream_ref is not None, task
    else:
        assert task.status is TaskStatus.MANUAL_REVIEW, task
        assert "of a stop" in task.error["message"]


async def test_row_10_real_lock_timeout_before_submission_requeues(
    open_test_engine: OpenEngine, db_url: str
) -> None:
    config = make_config(**{"database.lock_timeout": "0.2"})
    async with open_test_engine(config, execute=False, simulated=GatedProvider()) as eng:
        await eng.set_model("sim-model")
        task_id = await eng.submit(request())
        locker = await connect(db_url)
        release = trio.Event()
        original_requeue = eng.store.requeue

        async def requeue(*a: Any, **k: Any) -> Any:
            release.set()  # the 55P03 happened; let the requeue through
            with trio.fail_after(5):
                while locker.raw.is_in_transaction():
                    await trio.sleep(0.01)
            return await original_requeue(*a, **k)

        eng.store.requeue = requeue  # type: ignore[method-assign]

        async def hold_lock_during_prepare() -> None:
            await sim(eng).in_prepare.wait()
            async with locker.transaction():
                await locker.execute("SELECT 1 FROM engine_task WHERE id = $1 FOR UPDATE", task_id)
                sim(eng).prepare_gate.set()  # type: ignore[union-attr]
                await release.wait()

        sim(eng).prepare_gate = trio.Event()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(hold_lock_during_prepare)
            with pytest.raises(JobSnooze) as snooze:
                await work(eng, task_id)
        await locker.close()
        assert snooze.value.seconds == 1.0
        task = await status(eng, task_id)
        assert task.status is TaskStatus.QUEUED and task.submitted_at is None
        assert sim(eng).submissions == {}
        with trio.fail_after(5):
            while not [e for e in await eng.events(task_id) if e.phase == "database_lock_timeout"]:
                await trio.sleep(0.02)
        (event,) = [e for e in await eng.events(task_id) if e.phase == "database_lock_timeout"]
        assert event.payload == {"code": "database_lock_timeout"}
        assert event.message == "async task queued after database lock timeout"


async def test_row_11_anything_else_fails_the_task_and_completes(idle: Engine) -> None:
    task_id = await idle.submit(request())

    async def engine_bug(task_id: uuid.UUID, token: uuid.UUID, **_: object) -> bool:
        raise RuntimeError("engine bug")

    idle.store.mark_submitting = engine_bug  # type: ignore[method-assign]
    await work(idle, task_id)  # returns: the job completes
    task = await status(idle, task_id)
    assert task.status is TaskStatus.FAILED
    assert task.error == {"code": "internal_error", "message": "engine bug"}
    assert sim(idle).submissions == {}


def _failure_log(caplog: pytest.LogCaptureFixture, event: str) -> logging.LogRecord:
    (record,) = [r for r in caplog.records if getattr(r, "event", None) == event]
    return record


@pytest.mark.parametrize("phase", ["prepare", "poll", "finalize"])
async def test_a_providers_own_exception_names_its_type_and_phase(
    idle: Engine, phase: str, caplog: pytest.LogCaptureFixture
) -> None:
    task_id = await idle.submit(request())
    if phase == "prepare":
        sim(idle).prepare_error = KeyError("text")
    else:
        sim(idle).errors[phase] = KeyError("text")
    with caplog.at_level(logging.WARNING, logger="engine.tasks.runner"):
        await work(idle, task_id)  # returns: the job completes
    task = await status(idle, task_id)
    assert task.status is TaskStatus.FAILED
    assert task.error == {
        "code": "provider_exception",
        "message": f"KeyError in {phase}: 'text'",
        "type": "KeyError",
        "phase": phase,
    }
    record = _failure_log(caplog, "task_failed")
    assert record.exc_info is not None and record.exc_info[0] is KeyError
    assert getattr(record, "phase", None) == phase
    # The traceback reaches into the provider, not only the engine's re-raise.
    assert f"in {phase}" in logging.Formatter().formatException(record.exc_info)


async def test_a_providers_own_exception_in_submit_goes_to_manual_review(
    idle: Engine, caplog: pytest.LogCaptureFixture
) -> None:
    # The call may have reached the upstream before it raised (here it did): failing the task
    # would say nothing runs upstream, and retrying it would submit twice.
    task_id = await idle.submit(request())
    sim(idle).errors["submit"] = ValueError("bad JSON in the answer")
    with caplog.at_level(logging.WARNING, logger="engine.tasks.runner"):
        await work(idle, task_id)
    task = await status(idle, task_id)
    assert task.status is TaskStatus.MANUAL_REVIEW
    assert task.error == {
        "code": "ambiguous_submission",
        "message": "ValueError in submit: bad JSON in the answer"
        " (the upstream may have received it)",
        "type": "ValueError",
        "phase": "submit",
    }
    assert sim(idle).submissions[task_id] == 1
    record = _failure_log(caplog, "task_manual_review")
    assert record.exc_info is not None and record.exc_info[0] is ValueError


async def test_an_engine_error_raised_in_a_provider_keeps_its_path(idle: Engine) -> None:
    # A provider that uses the database and loses it: requeued (the lost-connection path), not
    # failed as a provider exception.
    task_id = await idle.submit(request())
    sim(idle).errors["poll"] = ConnectionLost("connection was closed in the middle of operation")
    with pytest.raises(JobSnooze):
        await work(idle, task_id)
    task = await status(idle, task_id)
    assert task.status is TaskStatus.QUEUED and task.upstream_ref is not None
    assert task.error is None


async def _events_of(eng: Engine, task_id: uuid.UUID, type_: str) -> list[TaskEvent]:
    """The task's events of ``type_``, once at least one is written (events are buffered)."""
    with trio.fail_after(10):
        while not (found := [e for e in await eng.events(task_id) if e.type == type_]):
            await trio.sleep(0.02)
    return found


@pytest.mark.parametrize("limit", [None, 1], ids=["unlimited", "limited"])
async def test_a_task_with_no_provider_here_is_handed_back_untouched(
    idle: Engine, limit: int | None
) -> None:
    # Limited: the claim was pending (queued); unlimited: it had made the task running.
    await idle.set_model("live-model", concurrency_limit=limit)
    task_id = await idle.submit(request("live-model", run_mode=RunMode.LIVE))
    idle.runner.handback_delay = 2.5
    for _ in range(2):  # it keeps coming back here until an instance with the provider runs it
        with pytest.raises(JobSnooze) as snooze:
            await work(idle, task_id)
        assert snooze.value.seconds == 2.5
    task = await status(idle, task_id)
    assert task.status is TaskStatus.QUEUED and task.attempts == 0 and task.error is None
    assert task.started_at is None and task.progress == 0 and task.phase is None
    assert task.execution_token is None and task.execution_owner is None
    await idle.runner.events.flush()
    (event,) = await _events_of(idle, task_id, "task.handed_back")  # once, not once per visit
    assert event.status == "queued"
    assert event.payload == {
        "reason": "no_provider",
        "model": "live-model",
        "instance_id": idle.instance_id,
    }
    assert "task.started" not in [e.type for e in await idle.events(task_id)]
    held = await idle.db.tasks.fetchval(
        "SELECT (SELECT count(*) FROM engine_scope_lease)"
        " + (SELECT count(*) FROM engine_task_admission)"
    )
    assert held == 0  # it took no slot and joined no line


async def test_a_handed_back_task_runs_on_an_instance_with_its_provider(
    open_test_engine: OpenEngine,
) -> None:
    async with open_test_engine() as bare:  # executes, and has no provider for live-model
        bare.runner.handback_delay = 0.2
        await bare.set_model("live-model")
        task_id = await bare.submit(request("live-model", run_mode=RunMode.LIVE))
        # As a Go River client or an engine from before model routing inserts it: no model in
        # the args, so the claim filter lets every instance take it, this one included.
        await bare.db.tasks.execute(
            "UPDATE river_job SET args = args - 'model' WHERE args ->> 'task_id' = $1",
            str(task_id),
        )
        (event,) = await _events_of(bare, task_id, "task.handed_back")
        assert event.instance_id == bare.instance_id
        task = await status(bare, task_id)
        assert task.status is TaskStatus.QUEUED and task.attempts == 0
        provider = SimulatedProvider()
        async with open_test_engine(providers={"live-model": provider}) as serving:
            task = await serving.wait(task_id, timeout=20)
    assert task.status is TaskStatus.SUCCEEDED and task.attempts == 1
    assert task.execution_owner == serving.instance_id
    assert provider.submissions == {task_id: 1}


async def test_a_stale_executors_writes_are_rejected(idle: Engine) -> None:
    task_id = await idle.submit(request())
    store = idle.store
    old, new = uuid.uuid4(), uuid.uuid4()
    assert await store.claim(task_id, old) is not None
    assert await store.claim(task_id, new) is None  # held by a live token
    await idle.db.tasks.execute(
        "UPDATE engine_task SET lease_expires_at = now() - interval '1 s' WHERE id = $1", task_id
    )
    assert await store.claim(task_id, new) is not None  # the lease expired: taken over
    assert not await store.mark_submitting(task_id, old)
    assert not await store.record_upstream(task_id, old, "ref-old")
    assert not await store.finish(task_id, old, TaskStatus.SUCCEEDED)
    assert await store.requeue(task_id, old) is None
    task = await status(idle, task_id)
    assert task.execution_token == new and task.upstream_ref is None
    assert task.status is TaskStatus.RUNNING
    assert await store.finish(task_id, new, TaskStatus.SUCCEEDED, result={"ok": 1})


async def test_a_stale_execution_stops_when_its_lease_is_taken_over(idle: Engine) -> None:
    task_id = await idle.submit(request())
    gate = sim(idle).prepare_gate = trio.Event()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(work, idle, task_id)
        with trio.fail_after(5):
            await sim(idle).in_prepare.wait()
        # Another execution takes the task over after the lease expired.
        await idle.db.tasks.execute(
            "UPDATE engine_task SET execution_token = gen_random_uuid() WHERE id = $1", task_id
        )
        gate.set()
    task = await status(idle, task_id)
    assert task.status is TaskStatus.RUNNING and task.submitted_at is None
    assert sim(idle).submissions == {}  # the stale execution never reached the upstream


async def test_cancel_of_a_queued_task_is_immediate(idle: Engine) -> None:
    task_id = await idle.submit(request())
    task = await idle.cancel(task_id)
    assert task.status is TaskStatus.CANCELLED
    job = await idle.queue.get(task.river_job_id)  # type: ignore[arg-type]
    assert job is not None and job.state.value == "cancelled"
    await work(idle, task_id)
    assert sim(idle).submissions == {}


@pytest.mark.parametrize("phase", ["poll", "submit"])
async def test_cancel_of_a_running_task_ends_it(idle: Engine, phase: str) -> None:
    """The user's cancel ends a run waiting upstream (the provider is told), and a run in the
    middle of its upstream call, which a stop would wait for: the call is cut short."""
    task_id = await idle.submit(request())
    setattr(sim(idle), f"{phase}_gate", trio.Event())  # never set: only the cancel ends it
    async with trio.open_nursery() as nursery:
        nursery.start_soon(work, idle, task_id)
        with trio.fail_after(5):
            await getattr(sim(idle), f"in_{phase}").wait()
        await idle.cancel(task_id)
    task = await idle.wait(task_id, timeout=5)
    assert task.status is TaskStatus.CANCELLED, task
    if phase == "poll":
        assert task_id in sim(idle).cancelled
    else:
        assert sim(idle).submissions == {}


async def test_a_cancel_mid_submit_in_a_running_engine_cuts_the_call_short(
    open_test_engine: OpenEngine,
) -> None:
    """The user's cancel mid-submit, for a job of the engine's own generation (whose stops are
    watched from the generation's nursery): the call is cut short."""
    provider = GatedProvider()
    provider.submit_gate = trio.Event()
    async with open_test_engine(max_workers=4, simulated=provider) as eng:
        await eng.set_model("sim-model")
        task_id = await eng.submit(request())
        with trio.fail_after(10):
            await provider.in_submit.wait()
        await eng.cancel(task_id)
        task = await eng.wait(task_id, timeout=10)
    assert task.status is TaskStatus.CANCELLED, task
    assert provider.submissions == {}


async def test_a_lost_connection_requeues_the_task_instead_of_failing_it(idle: Engine) -> None:
    # The connection drops under the run (here: in the provider's own database call; the
    # chaos scenario `backend_kill` does it for real with pg_terminate_backend).
    task_id = await idle.submit(request())
    sim(idle).prepare_error = ConnectionLost("connection was closed in the middle of operation")
    with pytest.raises(JobSnooze):
        await work(idle, task_id)
    task = await status(idle, task_id)
    assert task.status is TaskStatus.QUEUED and task.execution_token is None
    sim(idle).prepare_error = None
    await work(idle, task_id)
    assert (await status(idle, task_id)).status is TaskStatus.SUCCEEDED
    assert sim(idle).submissions[task_id] == 1


class _OutageAfterUpstream(SimulatedProvider):
    """Once the upstream has answered (after submit, or after finalize), the link to the
    database is cut: every connection reset, new ones dropped, until the test heals it."""

    def __init__(self, proxy: TcpProxy, stage: str) -> None:
        super().__init__()
        self.proxy = proxy
        self.stage = stage
        self.down = trio.Event()

    def _outage(self) -> None:
        if not self.down.is_set():
            self.proxy.cut()
            self.down.set()

    async def submit(self, task: Task, prepared: Any) -> str:
        ref = await super().submit(task, prepared)
        if self.stage == "submit":
            self._outage()
        return ref

    async def finalize(self, task: Task, result: Any) -> Any:
        result = await super().finalize(task, result)
        if self.stage == "finalize":
            self._outage()
        return result


@pytest.mark.parametrize("stage", ["submit", "finalize"])
async def test_a_database_outage_after_the_upstream_answered_loses_nothing(
    db_url: str, stage: str
) -> None:
    """The reference (after submit) and the outcome (after finalize) exist only in this
    process until written: the run keeps its token and writes them once the database is back,
    so the task succeeds and is never sent to manual review by its live owner."""
    async with tcp_proxy(db_url) as proxy:
        provider = _OutageAfterUpstream(proxy, stage)
        config = make_config(**{"worker.hard_limit": 4})
        urls = DatabaseUrls.single(proxy.url(db_url))
        async with open_engine(config, urls=urls, simulated=provider) as eng:
            await eng.set_model("sim-model")
            task_id = await eng.submit(request())
            with trio.fail_after(30):
                await provider.down.wait()
            await trio.sleep(1.0)  # the outage: one second with no database
            proxy.heal()
            task = await eng.wait(task_id, timeout=30)
            events = [e.type for e in await eng.events(task_id)]
    assert task.status is TaskStatus.SUCCEEDED, (task.status, task.error)
    assert provider.submissions[task_id] == 1
    assert "task.requeued" not in events and "task.manual_review" not in events


async def test_a_submission_that_never_left_is_not_left_recorded(idle: Engine) -> None:
    """``NotSubmitted``: the call never reached the upstream, so ``submitted_at`` is cleared
    while the run waits to try again; a requeue or a recovery meanwhile sees nothing ambiguous
    (a queued task, not manual review)."""
    refused = trio.Event()
    provider = sim(idle)
    original = provider.submit

    async def submit(task: Task, prepared: Any) -> str:
        if not refused.is_set():
            refused.set()
            raise NotSubmitted("connection refused", retry_after=30.0)
        return await original(task, prepared)

    provider.submit = submit  # type: ignore[method-assign]
    task_id = await idle.submit(request())
    async with trio.open_nursery() as nursery:
        nursery.start_soon(work, idle, task_id)
        with trio.fail_after(10):
            await refused.wait()
            while (await status(idle, task_id)).submitted_at is not None:
                await trio.sleep(0.01)
        task = await status(idle, task_id)
        assert task.status is TaskStatus.RUNNING and task.upstream_ref is None
        # Its owner dies while it waits: recovery requeues it, no human needed.
        moved = await idle.db.tasks.fetch(
            QUERIES["task_recover_interrupted_many"], [task.execution_owner], 10, "rescuer"
        )
        assert [(r["id"], r["status"]) for r in moved] == [(task_id, "queued")]
        nursery.cancel_scope.cancel()
    assert provider.submissions == {}


async def test_a_slow_submit_without_a_stop_is_waited_for(idle: Engine) -> None:
    """The stop grace bounds the wait for an answer only once a stop came: a submit slower than
    the grace, with no stop, is an answer like any other."""
    idle.runner.submit_grace = 0.2
    provider = sim(idle)
    provider.submit_gate = trio.Event()
    task_id = await idle.submit(request())
    async with trio.open_nursery() as nursery:
        nursery.start_soon(work, idle, task_id)
        with trio.fail_after(10):
            await provider.in_submit.wait()
        await trio.sleep(0.5)  # well past the grace: the slow upstream, not a stop
        provider.submit_gate.set()
    task = await status(idle, task_id)
    assert task.status is TaskStatus.SUCCEEDED, task.error
    assert provider.submissions == {task_id: 1}


@pytest.mark.parametrize("answers", [True, False])
async def test_a_stop_mid_submit_waits_the_grace_for_the_answer(
    idle: Engine, answers: bool
) -> None:
    """A stop while the upstream call is in flight: an answer within the grace is kept (the
    task has its reference, never a human's decision); none within it leaves the submission
    ambiguous (manual review)."""
    idle.runner.submit_grace = 0.5
    provider = sim(idle)
    provider.submit_gate = trio.Event()
    task_id = await idle.submit(request())
    async with trio.open_nursery() as nursery:
        stop = trio.CancelScope()

        async def run() -> None:
            with stop:
                await work(idle, task_id)

        nursery.start_soon(run)
        with trio.fail_after(10):
            await provider.in_submit.wait()
        stop.cancel()  # the stop: the generation is cancelled
        if answers:
            await trio.sleep(0.1)
            provider.submit_gate.set()
    task = await status(idle, task_id)
    if answers:
        assert task.status is not TaskStatus.MANUAL_REVIEW and task.upstream_ref is not None, task
    else:
        assert task.status is TaskStatus.MANUAL_REVIEW
        assert "of a stop" in task.error["message"]
    provider.submit_gate.set()
