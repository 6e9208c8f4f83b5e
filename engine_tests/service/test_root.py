"""The one service tree, embedded: ``engine.open`` runs the whole control plane, stops by the
shutdown policy, keeps its boundaries clean, and supervises its siblings."""

from __future__ import annotations

import functools
import uuid
from typing import Any

import pytest
import trio
import trio.testing

import engine
from engine.config import EngineConfig
from engine.db.database import DatabaseUrls
from engine.domain.tasks import Identity, TaskRequest, TaskStatus
from engine.errors import InvalidProvider
from engine.service.health import Health
from engine.service.supervise import supervise
from engine_tests.service.sample_service_app import NoPoll, SleepyEcho
from engine_tests.tasks.conftest import make_config

IDENTITY = Identity(tenant_id="acme", user_id="user-1")

# The library's defaults but faster: the registry refresher (no fixed capacity), recovery and
# the admission dispatcher all run, as in `python -m engine run`.
EMBEDDED = {
    "worker.capacity": "registry",
    "worker.refresh_interval": "0.5",
    "recovery.interval": "0.5",
    "recovery.stale_after": "3",
    "admission.stale_after": "3",
    "worker.shutdown_drain_timeout": "10",
}


def embedded_config(**overrides: Any) -> EngineConfig:
    return make_config(**{**EMBEDDED, **overrides})


def live(model: str, **payload: Any) -> TaskRequest:
    return TaskRequest(model=model, payload=payload, identity=IDENTITY)


async def test_an_embedded_app_with_a_limit_of_2_runs_all_10_tasks(db_url: str) -> None:
    providers = {"echo": SleepyEcho("echo")}
    async with engine.open(
        embedded_config(), urls=DatabaseUrls.single(db_url), providers=providers
    ) as eng:
        await eng.set_model("echo", concurrency_limit=2)
        ids = await eng.submit([live("echo", text=f"t{n}", sleep=0.1) for n in range(10)])
        tasks = [await eng.wait(task_id, timeout=30) for task_id in ids]
    assert [t.status for t in tasks] == [TaskStatus.SUCCEEDED] * 10
    assert [t.result for t in tasks] == [{"echo": f"t{n}", "by": "echo"} for n in range(10)]


async def test_two_instances_with_disjoint_providers_each_run_their_own_models(
    db_url: str,
) -> None:
    urls = DatabaseUrls.single(db_url)
    config = embedded_config()
    async with (
        engine.open(config, urls=urls, providers={"a": SleepyEcho("a")}) as eng_a,
        engine.open(config, urls=urls, providers={"b": SleepyEcho("b")}) as eng_b,
    ):
        await eng_a.set_model("a")
        await eng_a.set_model("b")
        ids = await eng_a.submit(
            [live(model, text=str(n)) for n in range(10) for model in ("a", "b")]
        )
        tasks = [await eng_b.wait(task_id, timeout=30) for task_id in ids]
        runs = await started_events(eng_a, ids)
    by_instance = {eng_a.instance_id: "a", eng_b.instance_id: "b"}
    model = {t.id: t.model for t in tasks}
    for task in tasks:
        assert task.status is TaskStatus.SUCCEEDED, task.error
        assert task.result == {"echo": task.payload["text"], "by": task.model}
        assert task.attempts == 1
    # Claimed only where its provider is: one run per task, by the instance serving its model.
    assert sorted((str(e.task_id), by_instance[e.instance_id or ""]) for e in runs) == sorted(
        (str(t), model[t]) for t in ids
    )


async def test_leaving_the_block_drains_a_running_task_to_success(db_url: str) -> None:
    async with engine.open(
        embedded_config(), urls=DatabaseUrls.single(db_url), providers={"echo": SleepyEcho("e")}
    ) as eng:
        await eng.set_model("echo")
        task_id = await eng.submit(live("echo", text="slow", sleep=2))
        await wait_polling(eng, task_id)
    # The block's end drained: the 2 s task finished instead of being requeued.
    async with engine.open(
        embedded_config(), urls=DatabaseUrls.single(db_url), control=False
    ) as reader:
        task = await reader.get(task_id)
    assert task is not None and task.status is TaskStatus.SUCCEEDED, task


async def test_hurrying_the_drain_requeues_the_running_task_keeping_its_reference(
    db_url: str,
) -> None:
    async with engine.open(
        embedded_config(), urls=DatabaseUrls.single(db_url), providers={"echo": SleepyEcho("e")}
    ) as eng:
        await eng.set_model("echo")
        task_id = await eng.submit(live("echo", text="slow", sleep=60))
        await wait_polling(eng, task_id)
        eng.stop_draining()  # the second signal: no drain
    async with engine.open(
        embedded_config(), urls=DatabaseUrls.single(db_url), control=False
    ) as reader:
        task = await reader.get(task_id)
        events = [e.type for e in await reader.events(task_id)]
    assert task is not None and task.status is TaskStatus.QUEUED
    # Already submitted upstream: the next run resumes polling that request.
    assert task.upstream_ref == f"e-{task_id}" and task.attempts == 1
    assert "task.requeued" in events


async def started_events(eng: engine.Engine, ids: list[uuid.UUID]) -> list[Any]:
    """Every task's ``task.started`` events, once each task has one (events are written in
    batches, so the last may lag its task's final state by a flush)."""
    with trio.fail_after(10):
        while True:
            runs = [e for t in ids for e in await eng.events(t) if e.type == "task.started"]
            if {e.task_id for e in runs} == set(ids):
                return runs
            await trio.sleep(0.05)


async def wait_polling(eng: engine.Engine, task_id: uuid.UUID) -> None:
    """Return once the task was submitted upstream (its provider polls it now)."""
    with trio.fail_after(15):
        while True:
            task = await eng.get(task_id)
            if task is not None and task.upstream_ref is not None:
                return
            await trio.sleep(0.02)


async def test_an_exception_in_the_block_comes_out_as_itself(db_url: str) -> None:
    with pytest.raises(KeyError) as raised:
        async with engine.open(embedded_config(), urls=DatabaseUrls.single(db_url)):
            raise KeyError("the app's own")
    assert type(raised.value) is KeyError and raised.value.args == ("the app's own",)


async def test_a_provider_missing_poll_is_refused_at_registration_with_its_name(
    db_url: str,
) -> None:
    pattern = r"^provider for model 'broken' \(NoPoll\) is missing poll; "
    with pytest.raises(InvalidProvider, match=pattern):
        async with engine.open(
            embedded_config(), urls=DatabaseUrls.single(db_url), providers={"broken": NoPoll()}
        ):
            raise AssertionError("the engine opened with a broken provider")


async def test_serve_in_an_apps_nursery_hands_back_an_engine_usable_from_the_app(
    db_url: str,
) -> None:
    # No trio-asyncio loop in this task: the engine's own serves the app's calls.
    async with trio.open_nursery() as nursery:
        eng: engine.Engine = await nursery.start(
            functools.partial(
                engine.serve,
                embedded_config(),
                urls=DatabaseUrls.single(db_url),
                providers={"echo": SleepyEcho("echo")},
            )
        )
        await eng.set_model("echo")
        task = await eng.wait(await eng.submit(live("echo", text="hi")), timeout=15)
        assert task.status is TaskStatus.SUCCEEDED and task.result == {"echo": "hi", "by": "echo"}
        assert eng.ready
        nursery.cancel_scope.cancel()


async def test_a_crashed_sibling_is_restarted_fresh_and_readiness_follows(
    autojump_clock: trio.testing.MockClock,
) -> None:
    health = Health()
    health.serving = True
    made: list[int] = []
    crash = trio.Event()

    def make() -> Any:
        made.append(len(made))
        run_number = len(made)

        async def run(*, task_status: trio.TaskStatus[int]) -> None:
            task_status.started(run_number)
            if run_number == 1:
                await crash.wait()
                raise RuntimeError("a bug")
            await trio.sleep_forever()

        return run

    async with trio.open_nursery() as nursery:
        first = await nursery.start(supervise, "svc", make, health)
        assert first == 1 and health.ready()
        crash.set()
        await trio.testing.wait_all_tasks_blocked()
        assert not health.ready() and health.down() == ["svc"]
        with trio.fail_after(5):
            while not health.ready():
                await trio.sleep(0.1)
        assert made == [0, 1]  # made afresh for the restart
        nursery.cancel_scope.cancel()


async def test_a_sibling_that_cannot_start_fails_the_start_as_itself() -> None:
    def make() -> Any:
        async def run(*, task_status: trio.TaskStatus[None]) -> None:
            raise ValueError("cannot start")

        return run

    with pytest.raises(ValueError, match=r"^cannot start$"):
        await supervise("svc", make, Health())
