"""The periodic scheduler on a real database: each period submitted once, by whoever leads,
errors retried without passing a period over."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import attrs
import pytest
import trio

from engine.db.bridge import Connection
from engine.db.database import DatabaseUrls
from engine.domain.tasks import Identity, RunMode, TaskRequest
from engine.queue.insert import InsertParams, insert_tx
from engine.schedules.model import (
    CatchUp,
    Schedule,
    ScheduledJob,
    ScheduledTask,
    period_task_id,
)
from engine.schedules.scheduler import PeriodicScheduler
from engine.service.engine import Engine
from engine.service.root import open as open_engine
from engine_tests.tasks.conftest import make_config

T0 = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
REPORT = ScheduledTask(model="report", tenant_id="ops", run_mode=RunMode.SIMULATION)


def _m(n: float) -> datetime:
    return T0 + timedelta(minutes=n)


@attrs.define
class Clock:
    """The scheduler's wall clock, set by the test."""

    now: datetime

    def __call__(self) -> datetime:
        return self.now


@pytest.fixture
async def eng(db_url: str) -> AsyncIterator[Engine]:
    """An engine that stores tasks and runs nothing (the scheduler is driven by hand)."""
    async with open_engine(make_config(), urls=DatabaseUrls.single(db_url), control=False) as e:
        await e.set_model("report")
        yield e


def scheduler(
    eng: Engine, clock: Clock, *schedules: Schedule, leader: str = "leader-a"
) -> PeriodicScheduler:
    async def insert_jobs(conn: Connection, params: Sequence[InsertParams]) -> Any:
        return await insert_tx(conn, params, eng.queue.channels.insert)

    return PeriodicScheduler(
        eng.db.tasks, schedules, eng.submit_tx, insert_jobs, leader_id=leader, clock=clock
    )


async def task_ids(eng: Engine) -> list[Any]:
    return [r["id"] for r in await eng.db.tasks.fetch("SELECT id FROM engine_task ORDER BY id")]


async def row(eng: Engine, name: str) -> Any:
    return await eng.db.tasks.fetchrow("SELECT * FROM engine_schedule WHERE name = $1", name)


async def test_each_period_is_submitted_once_under_its_own_task_id(eng: Engine) -> None:
    clock = Clock(_m(0.9))
    every_minute = Schedule(name="minutely", every="1m", task=REPORT)
    s = scheduler(eng, clock, every_minute)
    await s.declare()
    wake = await s.run_once()
    assert await task_ids(eng) == []  # a new schedule waits for its next boundary
    assert wake == _m(1) + timedelta(milliseconds=2)
    clock.now = _m(3.2)
    await s.run_once()
    await s.run_once()
    expected = sorted(period_task_id("minutely", _m(n)) for n in (1, 2, 3))
    assert await task_ids(eng) == expected
    task = await eng.get(period_task_id("minutely", _m(2)))
    assert task is not None and task.model == "report"
    assert task.identity.user_id == "schedule:minutely"
    r = await row(eng, "minutely")
    assert (r["last_period"], r["next_period"], r["fired_count"]) == (_m(3), _m(4), 3)
    assert r["timing"] == "every 1m" and r["target"] == "task report"


async def test_two_leaders_overlapping_submit_each_period_once(
    eng: Engine, caplog: pytest.LogCaptureFixture
) -> None:
    clock = Clock(_m(0.5))
    tasks = Schedule(name="overlap", every=60, task=REPORT)
    jobs = Schedule(name="overlap-jobs", every=60, job=ScheduledJob(kind="sweep"))
    a = scheduler(eng, clock, tasks, jobs, leader="a")
    b = scheduler(eng, clock, tasks, jobs, leader="b")
    await a.declare()
    await a.run_once()
    for minute in range(1, 6):
        clock.now = _m(minute + 0.1)
        async with trio.open_nursery() as nursery:
            for s in (a, b, a, b):
                nursery.start_soon(s.run_once)
    assert await task_ids(eng) == sorted(period_task_id("overlap", _m(n)) for n in range(1, 6))
    periods = await eng.db.queue.fetch(
        "SELECT metadata->>'engine:period' AS p FROM river_job WHERE kind = 'sweep' ORDER BY 1"
    )
    assert [r["p"] for r in periods] == [_m(n).isoformat() for n in range(1, 6)]
    # Neither leader's pass failed: the second waited for the first's row lock.
    assert not [r for r in caplog.records if getattr(r, "event", "") == "schedule_failed"]
    r = await row(eng, "overlap")
    assert r["fired_count"] == 5 and r["last_error"] is None


async def test_catch_up_latest_submits_only_the_newest_missed_period(eng: Engine) -> None:
    clock = Clock(_m(0.5))
    s = scheduler(
        eng, clock, Schedule(name="latest", every="1m", task=REPORT, catch_up=CatchUp.LATEST)
    )
    await s.declare()
    await s.run_once()
    clock.now = _m(5.5)
    await s.run_once()
    assert await task_ids(eng) == [period_task_id("latest", _m(5))]
    r = await row(eng, "latest")
    assert (r["fired_count"], r["passed_over_count"]) == (1, 4)


async def test_run_on_start_submits_the_period_under_way_once(eng: Engine) -> None:
    clock = Clock(_m(2.5))
    schedule = Schedule(name="eager", every="1m", task=REPORT, run_on_start=True)
    s = scheduler(eng, clock, schedule)
    await s.declare()
    await s.run_once()
    # A second leader starting in the same period does not submit it again.
    other = scheduler(eng, clock, schedule, leader="b")
    await other.declare()
    await other.run_once()
    assert await task_ids(eng) == [period_task_id("eager", _m(2))]


async def test_a_job_schedule_inserts_jobs_with_rivers_periodic_metadata(eng: Engine) -> None:
    clock = Clock(_m(0.5))
    job = ScheduledJob(kind="cleanup", args={"deep": True}, queue="maintenance", priority=3)
    s = scheduler(eng, clock, Schedule(name="sweep", every="1m", job=job))
    await s.declare()
    await s.run_once()
    clock.now = _m(2.5)
    await s.run_once()
    jobs = await eng.db.queue.fetch(
        "SELECT kind, args, queue, priority, metadata FROM river_job ORDER BY id"
    )
    assert [(j["kind"], j["args"], j["queue"], j["priority"]) for j in jobs] == [
        ("cleanup", {"deep": True}, "maintenance", 3)
    ] * 2
    assert [j["metadata"] for j in jobs] == [
        {"periodic": True, "river:periodic_job_id": "sweep", "engine:period": p.isoformat()}
        for p in (_m(1), _m(2))
    ]


async def test_a_failed_pass_is_recorded_retried_and_passes_nothing_over(eng: Engine) -> None:
    clock = Clock(_m(0.5))
    unknown = attrs.evolve(REPORT, model="not-yet")
    s = scheduler(eng, clock, Schedule(name="early", every="1m", task=unknown))
    await s.declare()
    await s.run_once()
    clock.now = _m(2.5)
    wake = await s.run_once()
    assert await task_ids(eng) == []
    r = await row(eng, "early")
    assert "unknown model 'not-yet'" in r["last_error"]
    assert r["last_period"] == _m(0)  # the failed pass moved nothing
    assert wake == clock.now + timedelta(seconds=10)
    await eng.set_model("not-yet")
    await s.run_once()
    assert await task_ids(eng) == sorted(period_task_id("early", _m(n)) for n in (1, 2))
    assert (await row(eng, "early"))["last_error"] is None


async def test_a_builder_function_gets_the_period_and_its_id_is_derived(eng: Engine) -> None:
    clock = Clock(_m(0.5))

    def build(period: datetime) -> TaskRequest:
        return TaskRequest(
            model="report",
            payload={"day": period.isoformat()},
            identity=Identity(tenant_id="ops", user_id="cron"),
            run_mode=RunMode.SIMULATION,
        )

    s = scheduler(eng, clock, Schedule(name="built", every="1m", task=build))
    await s.declare()
    await s.run_once()
    clock.now = _m(1.5)
    await s.run_once()
    task = await eng.get(period_task_id("built", _m(1)))
    assert task is not None and task.payload == {"day": _m(1).isoformat()}


async def test_a_period_whose_task_exists_is_not_submitted_again(eng: Engine) -> None:
    clock = Clock(_m(0.5))
    s = scheduler(eng, clock, Schedule(name="again", every="1m", task=REPORT))
    await s.declare()
    await s.run_once()
    clock.now = _m(2.5)
    await s.run_once()
    # An operator winds the cursor back: the periods already submitted are not submitted twice.
    await eng.db.tasks.execute("UPDATE engine_schedule SET last_period = $1", _m(0))
    await s.run_once()
    assert len(await task_ids(eng)) == 2
    assert (await row(eng, "again"))["last_error"] is None
