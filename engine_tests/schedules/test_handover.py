"""Schedules in the service: the leader runs them, and a leader killed mid-period hands over
without a period submitted twice or skipped."""

from __future__ import annotations

import itertools
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta

import pytest
import trio

from engine.db.database import DatabaseUrls
from engine.domain.tasks import RunMode
from engine.errors import ConfigError
from engine.schedules.model import Schedule, ScheduledTask, period_task_id
from engine.service.engine import Engine
from engine.service.root import open as open_engine
from engine_tests.schedules.schedule_worker import SCHEDULE
from engine_tests.tasks.conftest import make_config

REPORT = ScheduledTask(model="report", tenant_id="ops", run_mode=RunMode.SIMULATION)


@pytest.fixture
async def store(db_url: str) -> AsyncIterator[Engine]:
    """An engine that only stores and reads (it never leads), with the model ``report``."""
    async with open_engine(make_config(), urls=DatabaseUrls.single(db_url), control=False) as e:
        await e.set_model("report")
        yield e


async def test_the_leading_worker_runs_the_apps_schedules(store: Engine, db_url: str) -> None:
    schedule = Schedule(name="eager", every="1h", task=REPORT, run_on_start=True)
    config = make_config()
    async with open_engine(config, urls=DatabaseUrls.single(db_url), schedules=[schedule]) as eng:
        with trio.fail_after(15):
            while (row := await store.db.tasks.fetchrow("SELECT * FROM engine_schedule")) is None:
                await trio.sleep(0.05)
            while not row["fired_count"]:
                await trio.sleep(0.05)
                row = await store.db.tasks.fetchrow("SELECT * FROM engine_schedule")
        assert row["declared_by"] == eng.instance_id
        task = await store.get(period_task_id("eager", row["last_period"]))
        assert task is not None and task.identity.user_id == "schedule:eager"


async def test_an_invalid_app_schedule_is_a_config_error_at_start(db_url: str) -> None:
    bad = [
        Schedule(name="x", cron="61 * * * *", task=REPORT),
        Schedule(name="x", every="1m", task=REPORT),
    ]
    with pytest.raises(ConfigError) as caught:
        async with open_engine(make_config(), urls=DatabaseUrls.single(db_url), schedules=bad):
            pass
    text = str(caught.value)
    assert "schedules[0].cron: cron '61 * * * *' is not a valid cron expression" in text
    assert "schedules[1].name: 'x' is used by another schedule" in text


@asynccontextmanager
async def worker(db_url: str, name: str) -> AsyncIterator[trio.Process]:
    """A schedule worker process, up (it printed ``ready``); SIGKILLed at the end."""
    proc = await trio.lowlevel.open_process(
        [sys.executable, "-m", "engine_tests.schedules.schedule_worker", db_url, name],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )
    try:
        assert proc.stdout is not None
        with trio.fail_after(30):
            seen = b""
            while b"ready" not in seen:
                chunk = await proc.stdout.receive_some()
                assert chunk, "the worker exited before it was ready"
                seen += chunk
        yield proc
    finally:
        proc.send_signal(signal.SIGKILL)
        await proc.wait()


async def _schedule_row(store: Engine) -> dict[str, object]:
    row = await store.db.tasks.fetchrow(
        "SELECT declared_by, declared_at, fired_count, last_period FROM engine_schedule"
        " WHERE name = $1",
        SCHEDULE.name,
    )
    return {} if row is None else dict(row)


async def _wait_for(store: Engine, timeout: float, check: object) -> dict[str, object]:
    with trio.fail_after(timeout):
        while not check(row := await _schedule_row(store)):  # type: ignore[operator]
            await trio.sleep(0.02)
    return row


@pytest.mark.slow
async def test_a_leader_killed_mid_period_hands_over_without_a_gap_or_a_repeat(
    store: Engine, db_url: str
) -> None:
    started = datetime.now(UTC).replace(microsecond=0)
    async with worker(db_url, "a") as a, worker(db_url, "b"):
        # "a" was up before "b" started, so it won the first election.
        first = await _wait_for(store, 30, lambda r: r.get("fired_count", 0) >= 2)
        assert first["declared_by"] == "a"
        # Kill the leader just after it fired a period: mid-period, and no resignation.
        fired = first["fired_count"]
        await _wait_for(store, 10, lambda r: r["fired_count"] > fired)
        killed_at = datetime.now(UTC)
        a.send_signal(signal.SIGKILL)
        # "b" takes over once the dead leader's term runs out, and catches up.
        await _wait_for(
            store,
            30,
            lambda r: (
                r["declared_by"] == "b" and r["last_period"] >= killed_at + timedelta(seconds=3)
            ),
        )
    final = await _schedule_row(store)
    last = final["last_period"]
    assert isinstance(last, datetime)
    # Every period from the first fired to the cursor has exactly one task, and no other
    # task exists: none skipped, none twice.
    seconds = range(-5, int((last - started).total_seconds()) + 2)
    periods_by_id = {
        period_task_id(SCHEDULE.name, p): p
        for p in (started + timedelta(seconds=n) for n in seconds)
    }
    rows = await store.db.tasks.fetch("SELECT id, created_at FROM engine_task")
    assert [r["id"] for r in rows if r["id"] not in periods_by_id] == []
    periods = sorted(periods_by_id[r["id"]] for r in rows)
    assert periods[-1] == last
    gaps = {b - a for a, b in itertools.pairwise(periods)}
    assert gaps == {timedelta(seconds=1)}, f"periods not contiguous: {periods}"
    assert len(rows) == final["fired_count"]
    # The dead leader's term outlived the next boundary, so "b" had periods to catch up: some
    # period began before "b" led and was submitted by "b".
    took_over = final["declared_at"]
    assert isinstance(took_over, datetime)
    caught_up = [r for r in rows if periods_by_id[r["id"]] < took_over <= r["created_at"]]
    assert caught_up, f"no period was caught up; b led from {took_over}"
