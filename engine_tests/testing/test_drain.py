"""drain: a manual engine runs what it stored, a running one finishes it; what ran comes back."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import trio

import engine
from engine.testing import DrainTimeout, all_submitted, drain, make_request

from .scripted import Scripted

T = engine.TaskStatus


class Chaining(Scripted):
    """Finalize submits the next task of the chain while the drain runs, up to ``n == 3``."""

    eng: engine.Engine | None = None

    async def finalize(self, task: engine.Task, result: Any) -> Any:
        answer = await super().finalize(task, result)
        if task.payload["n"] < 3:
            assert self.eng is not None
            await self.eng.submit(make_request(model="chain", payload={"n": task.payload["n"] + 1}))
        return answer


@pytest.fixture
def engine_providers() -> Mapping[str, engine.Provider]:
    return {
        "ok": Scripted(),
        "refused": Scripted(raises={"submit": engine.ProviderError("no")}),
        "slow": Scripted(polls=None, poll_interval=0.01),
        "chain": Chaining(),
    }


async def test_a_manual_engine_runs_what_it_stored(engine_manual: engine.Engine) -> None:
    ids = await engine_manual.submit(
        [make_request(model=m, payload={"n": n}) for n, m in enumerate(["ok", "refused", "ok"])]
    )
    cancelled = await engine_manual.submit(make_request(model="ok", payload={"n": 9}))
    await engine_manual.cancel(cancelled)
    assert [t.status for t in await all_submitted(engine_manual)] == [T.QUEUED] * 3 + [T.CANCELLED]
    ran = await drain(engine_manual)
    assert [(t.id, t.status) for t in ran] == [
        (ids[0], T.SUCCEEDED),
        (ids[1], T.FAILED),
        (ids[2], T.SUCCEEDED),
        (cancelled, T.CANCELLED),  # final since the engine opened: returned once too
    ]
    assert ran[0].result == {"final": {"ref": "ref-0"}, "payload": {"n": 0}}
    assert await drain(engine_manual) == []  # nothing new


async def test_each_drain_returns_what_ran_since_the_last(engine_manual: engine.Engine) -> None:
    first = await engine_manual.submit(make_request(model="ok", payload={"n": 1}))
    assert [t.id for t in await drain(engine_manual)] == [first]
    second = await engine_manual.submit(make_request(model="ok", payload={"n": 2}))
    assert [t.id for t in await drain(engine_manual)] == [second]


async def test_after_a_drain_a_manual_engine_runs_nothing_again(
    engine_manual: engine.Engine,
) -> None:
    await drain(engine_manual)
    task_id = await engine_manual.submit(make_request(model="ok", payload={"n": 1}))
    with trio.move_on_after(0.5):
        await engine_manual.wait(task_id)
    task = await engine_manual.get(task_id)
    assert task is not None and task.status is T.QUEUED
    assert engine_manual.queue.generations == [] and engine_manual.queue.slots.total == 0


async def test_tasks_submitted_while_draining_are_drained(
    engine_manual: engine.Engine, engine_providers: Mapping[str, engine.Provider]
) -> None:
    chain = engine_providers["chain"]
    assert isinstance(chain, Chaining)
    chain.eng = engine_manual
    await engine_manual.submit(make_request(model="chain", payload={"n": 1}))
    ran = await drain(engine_manual)
    assert [(t.payload["n"], t.status) for t in ran] == [(n, T.SUCCEEDED) for n in (1, 2, 3)]


async def test_a_running_engine_is_waited_for(engine_running: engine.Engine) -> None:
    ids = await engine_running.submit(
        [
            make_request(model="ok", payload={"n": 1}),
            make_request(model="ok", run_mode="simulation"),
        ]
    )
    ran = await drain(engine_running)
    assert [(t.id, t.status) for t in ran] == [(i, T.SUCCEEDED) for i in ids]


async def test_tasks_due_later_or_without_a_provider_are_left(
    engine_manual: engine.Engine,
) -> None:
    await engine_manual.set_model("nobody")
    later, unserved = await engine_manual.submit(
        [
            make_request(model="ok", run_at=datetime.now(UTC) + timedelta(hours=1)),
            make_request(model="nobody"),
        ]
    )
    with trio.fail_after(5):
        assert await drain(engine_manual) == []
    assert [t.id for t in await all_submitted(engine_manual, status="queued")] == [later, unserved]


async def test_a_drain_that_runs_out_of_time_says_what_is_left(
    engine_manual: engine.Engine,
) -> None:
    await engine_manual.submit(make_request(model="slow", payload={"n": 5}))
    with pytest.raises(DrainTimeout) as caught:
        await drain(engine_manual, timeout=0.3)
    assert isinstance(caught.value, trio.TooSlowError)
    # The run was stopped with the drain: the task is back in the queue, its reference kept.
    assert str(caught.value) == (
        "drain: not done after 0.3 s.\n"
        "1 task was left to run (oldest first):\n"
        "  - model='slow' tenant='test-tenant' status=queued payload={'n': 5}"
    )
    [task] = await all_submitted(engine_manual)
    assert (task.status, task.upstream_ref) == (T.QUEUED, "ref-5")
