"""Submitting: valid tasks run to the end; bad input is rejected and nothing is stored."""

from __future__ import annotations

import re
from datetime import datetime
from typing import Any

import pytest
import trio

from engine.admission.dispatcher import Dispatcher
from engine.config import QueueConfig, TasksConfig, load_config
from engine.db.bridge import Connection
from engine.db.database import Database
from engine.domain.tasks import Identity, RunMode, TaskRequest, TaskStatus
from engine.errors import ConfigError, ConnectionLost, DatabaseError, InvalidTask, LockTimeout
from engine.providers.simulated import SimulatedProvider
from engine.queue.insert import insert_tx, prepare
from engine.queue.job import InsertOpts
from engine.queue.unique import GATEWAY_UNIQUE_OPTS
from engine.recovery.rescuer import Rescuer
from engine.service.engine import Engine
from engine.service.settings import dispatcher_settings, recovery_settings
from engine.tasks.submit import submit_tasks
from engine_tests.tasks.conftest import IDENTITY, OpenEngine, request


async def _stored(eng: Engine) -> tuple[int, int]:
    tasks = await eng.db.tasks.fetchval("SELECT count(*) FROM engine_task")
    jobs = await eng.db.queue.fetchval("SELECT count(*) FROM river_job")
    return tasks, jobs


async def test_submitted_task_runs_to_success_and_wait_returns_it(eng: Engine) -> None:
    task_id = await eng.submit(request())
    task = await eng.wait(task_id, timeout=10)
    assert task.status is TaskStatus.SUCCEEDED
    assert task.result["output"] == "simulated"
    assert task.upstream_ref is not None and task.submitted_at is not None
    assert task.execution_token is None
    assert eng.simulated.submissions[task_id] == 1  # type: ignore[attr-defined]
    job = await eng.queue.get(task.river_job_id)  # type: ignore[arg-type]
    assert job is not None and job.tags == ("gateway-task",) and job.priority == 2
    assert job.max_attempts == 1000 and job.args == {"task_id": str(task_id)}
    with trio.fail_after(5):
        while [e.type for e in await eng.events(task_id)][-1:] != ["task.succeeded"]:
            await trio.sleep(0.02)
    types = [e.type for e in await eng.events(task_id)]
    assert types == ["task.queued", "task.started", "task.submitted", "task.succeeded"]


async def test_wait_returns_within_50ms_of_completion(eng: Engine) -> None:
    # A task that waits upstream until we let it finish: measure completion → wait() return.
    release = trio.Event()
    polling = trio.Event()
    finished_at: list[float] = []
    sim = eng.simulated
    original = sim.poll  # type: ignore[attr-defined]

    async def slow_poll(task, ref):  # type: ignore[no-untyped-def]
        polling.set()
        await release.wait()
        return await original(task, ref)

    sim.poll = slow_poll  # type: ignore[attr-defined]
    task_id = await eng.submit(request())
    returned_at: list[float] = []

    async def waiter() -> None:
        await eng.wait(task_id, timeout=10)
        returned_at.append(trio.current_time())

    original_finish = eng.store.finish

    async def finish(*a, **k):  # type: ignore[no-untyped-def]
        result = await original_finish(*a, **k)
        finished_at.append(trio.current_time())
        return result

    eng.store.finish = finish  # type: ignore[method-assign]
    async with trio.open_nursery() as nursery:
        nursery.start_soon(waiter)
        with trio.fail_after(10):
            await polling.wait()
        release.set()
    # wait() may return before the finishing coroutine resumes (the NOTIFY arrives first):
    # then the latency is negative, which passes.
    with trio.fail_after(10):
        while not finished_at:
            await trio.sleep(0.001)
    assert returned_at[0] - finished_at[0] < 0.050


def _nested(depth: int) -> object:
    value: object = "leaf"
    for _ in range(depth):
        value = {"a": [value]}
    return value


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"model": "no-such-model"}, "unknown model 'no-such-model'"),
        ({"payload": {"x": {1, 2}}}, "payload is not JSON"),
        ({"payload": {"x": float("nan")}}, "payload is not JSON"),
        ({"payload": "x" * 2_000_000}, "payload is 2000002 bytes; the limit is 1000000"),
        ({"identity": Identity(tenant_id="", user_id="u")}, "identity.tenant_id is required"),
        ({"identity": Identity(tenant_id="t")}, "identity needs user_id or gateway_user_id"),
        (
            {"identity": Identity(tenant_id="t", user_id="u" * 10_000_000)},
            "request 1: identity.user_id is 10000000 characters; the limit is 256 "
            "(tasks.max_field_length)",
        ),
        ({"group_key": "g" * 300}, "group_key is 300 characters; the limit is 256"),
        ({"model": "m" * 201}, "request 1: model is 201 characters; the limit is 200"),
        ({"identity": Identity(tenant_id="t\x00", user_id="u")}, "tenant_id holds a NUL"),
        ({"payload": {"text": "a\x00b"}}, "payload has text holding a NUL character"),
        ({"payload": {"k\x00": 1}}, "payload has a key 'k\\x00' holding a NUL character"),
        ({"payload": {"text": "\ud800"}}, "payload has text holding a lone surrogate (U+D800)"),
        ({"group_key": "\udfff"}, "group_key holds a lone surrogate (U+DFFF)"),
        ({"payload": _nested(5_000)}, "payload is nested deeper than 64 levels"),
        ({"id": "not-a-uuid"}, "request 1: id must be a uuid.UUID, not str"),
        ({"run_at": datetime(2026, 12, 1, 12, 0)}, "run_at must be a timezone-aware datetime"),
        ({"identity": {"tenant_id": "t"}}, "identity must be an engine.Identity, not dict"),
        ({"group_key": 7}, "request 1: group_key must be text, not int"),
    ],
)
async def test_bad_input_is_rejected_and_nothing_is_stored(
    eng: Engine, kwargs: dict[str, object], message: str
) -> None:
    kwargs = dict(kwargs)
    model = str(kwargs.pop("model", "sim-model"))
    with pytest.raises(InvalidTask, match=re.escape(message)):
        await eng.submit([request(), request(model, **kwargs)])  # type: ignore[arg-type]
    assert await _stored(eng) == (0, 0)


def test_rejected_input_is_a_permanent_error_and_an_outage_a_retryable_one() -> None:
    assert not InvalidTask.retryable and not ConfigError.retryable
    assert not DatabaseError.retryable
    assert ConnectionLost.retryable and LockTimeout.retryable


async def test_a_payload_at_the_depth_limit_is_accepted(eng: Engine) -> None:
    task_id = await eng.submit(request(payload=_nested(32)))  # 64 levels: 32 x (dict, list)
    assert (await eng.wait(task_id, timeout=10)).status is TaskStatus.SUCCEEDED


async def test_disabled_model_is_rejected(eng: Engine) -> None:
    await eng.set_model("off", enabled=False)
    with pytest.raises(InvalidTask, match="model 'off' is disabled"):
        await eng.submit(request("off"))
    assert await _stored(eng) == (0, 0)


async def test_submit_inside_callers_transaction_rolls_back_with_it(eng: Engine) -> None:
    async with eng.db.tasks.acquire() as conn:
        with pytest.raises(RuntimeError):
            async with conn.transaction():
                await eng.submit_tx(conn, [request()])
                raise RuntimeError("caller's rollback")
    assert await _stored(eng) == (0, 0)
    async with eng.db.tasks.acquire() as conn, conn.transaction():
        req = request()
        await eng.submit_tx(conn, [req])
    assert (await eng.wait(req.id, timeout=10)).status is TaskStatus.SUCCEEDED


async def test_failure_rate_fails_tasks_with_the_upstream_error(
    open_test_engine: OpenEngine,
) -> None:
    from engine.providers.simulated import SimulationConfig

    sim = SimulatedProvider(SimulationConfig(failure_rate=1.0, seed=1))
    async with open_test_engine(simulated=sim) as eng:
        await eng.set_model("sim-model")
        task = await eng.wait(await eng.submit(request()), timeout=10)
    assert task.status is TaskStatus.FAILED
    assert task.error == {"code": "upstream_failed", "message": "simulated upstream failure"}


async def test_identity_is_stored(eng: Engine) -> None:
    task_id = await eng.submit(request())
    task = await eng.get(task_id)
    assert task is not None and task.identity == IDENTITY


# ---------------------------------------------------------------------------------------------
# Model routing: a live task's job names its model, a simulation task's job does not


async def _submit_on(conn: Connection, requests: list[TaskRequest]) -> dict[str, Any]:
    """Submit on a bare connection (no engine executes them); return each task's job args."""
    async with conn.transaction():
        await submit_tasks(
            conn, requests, queue=QueueConfig(), tasks=TasksConfig(), instance_id="test"
        )
    return await _job_args(conn)


async def _job_args(conn: Connection) -> dict[str, Any]:
    """Each task's current job's args, by task id."""
    rows = await conn.fetch(
        "SELECT t.id::text AS id, j.args FROM engine_task t JOIN river_job j"
        " ON j.id = t.river_job_id"
    )
    return {r["id"]: r["args"] for r in rows}


async def test_live_tasks_jobs_carry_their_model_and_simulation_tasks_jobs_do_not(
    conn: Connection,
) -> None:
    await conn.execute("INSERT INTO engine_model (name) VALUES ('echo'), ('flux')")
    live_echo = request("echo", run_mode=RunMode.LIVE)
    live_flux = request("flux", run_mode=RunMode.LIVE)
    simulated = request("echo", run_mode=RunMode.SIMULATION)
    args = await _submit_on(conn, [live_echo, live_flux, simulated])
    assert args[str(live_echo.id)] == {"task_id": str(live_echo.id), "model": "echo"}
    assert args[str(live_flux.id)] == {"task_id": str(live_flux.id), "model": "flux"}
    # Exactly River's {"task_id"}: any instance may claim it.
    assert args[str(simulated.id)] == {"task_id": str(simulated.id)}


async def test_a_go_style_insert_without_the_model_dedupes_against_a_live_tasks_job(
    conn: Connection,
) -> None:
    await conn.execute("INSERT INTO engine_model (name) VALUES ('echo')")
    live = request("echo", run_mode=RunMode.LIVE)
    await _submit_on(conn, [live])
    queue = QueueConfig()
    # What a Go River client inserts for the same task: {"task_id"} only, the gateway options.
    go_job = prepare(
        {"task_id": str(live.id)},
        InsertOpts(queue=queue.name, unique=GATEWAY_UNIQUE_OPTS),
        kind=queue.job_kind,
    )
    (result,) = await insert_tx(conn, [go_job])
    assert result.skipped
    assert result.job.args == {"task_id": str(live.id), "model": "echo"}


async def test_recovery_and_the_dispatcher_give_new_jobs_the_same_routing(
    database: Database,
) -> None:
    config = load_config(env={}, overrides={})
    live = request("echo", run_mode=RunMode.LIVE)
    simulated = request("echo", run_mode=RunMode.SIMULATION)
    expected = {
        str(live.id): {"task_id": str(live.id), "model": "echo"},
        str(simulated.id): {"task_id": str(simulated.id)},
    }
    async with database.tasks.acquire() as conn:
        await conn.execute("INSERT INTO engine_model (name) VALUES ('echo')")
        await _submit_on(conn, [live, simulated])
    finish_jobs = "UPDATE river_job SET state = 'completed', finalized_at = now()"

    # Their jobs are gone: recovery gives the queued tasks new ones.
    await database.tasks.execute(finish_jobs)
    assert await Rescuer(recovery_settings(config), database, "test").reenqueue() == 2
    async with database.tasks.acquire() as conn:
        assert await _job_args(conn) == expected

    # Waiting for admission: the dispatcher gives them new ones when it admits them.
    await database.tasks.execute(finish_jobs)
    await database.tasks.execute(
        "INSERT INTO engine_task_admission (task_id, scopes, status)"
        " SELECT id, ARRAY['model:echo'], 'waiting' FROM engine_task"
    )
    assert (await Dispatcher(dispatcher_settings(config), database).run_once()).admitted == 2
    async with database.tasks.acquire() as conn:
        assert await _job_args(conn) == expected


class _Unstorable(SimulatedProvider):
    """Finalizes a task whose payload asks for it into a result jsonb refuses."""

    async def finalize(self, task: Any, result: Any) -> Any:
        result = await super().finalize(task, result)
        return {"score": float("nan")} if task.payload.get("bad") else result


async def test_a_result_that_cannot_be_stored_fails_its_own_task_only(
    open_test_engine: OpenEngine,
) -> None:
    """Tasks finishing together are recorded in one statement: one unstorable result must not
    fail the others."""
    async with open_test_engine(simulated=_Unstorable()) as eng:
        await eng.set_model("sim-model")
        ids = await eng.submit([request(payload={"bad": n == 3}) for n in range(8)])
        tasks = [await eng.wait(i, timeout=10) for i in ids]
    assert [t.status for t in tasks] == [
        TaskStatus.FAILED if n == 3 else TaskStatus.SUCCEEDED for n in range(8)
    ]
    assert tasks[3].error is not None and tasks[3].error["code"] == "result_not_storable"
    assert "is not JSON" in tasks[3].error["message"]
