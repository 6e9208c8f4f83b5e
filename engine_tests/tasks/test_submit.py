"""Submitting: valid tasks run to the end; bad input is rejected and nothing is stored."""

from __future__ import annotations

import re

import pytest
import trio

from engine.errors import InvalidTask
from engine.providers.simulated import SimulatedProvider
from engine.service.engine import Engine
from engine.tasks.models import Identity, TaskStatus
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
    assert returned_at[0] - finished_at[0] < 0.050


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"model": "no-such-model"}, "unknown model 'no-such-model'"),
        ({"payload": {"x": {1, 2}}}, "payload is not JSON"),
        ({"payload": {"x": float("nan")}}, "payload is not JSON"),
        ({"payload": "x" * 2_000_000}, "payload is 2000002 bytes; the limit is 1000000"),
        ({"identity": Identity(tenant_id="", user_id="u")}, "identity.tenant_id is required"),
        ({"identity": Identity(tenant_id="t")}, "identity needs user_id or gateway_user_id"),
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
