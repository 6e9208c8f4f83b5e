"""The provider's task context: progress reports (coalesced, rate limited, fenced by the token),
the context accessor, and the provider's service-long ``lifespan``, on a real database."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from typing import Any, cast

import pytest
import trio

import engine
from engine.db.database import DatabaseUrls
from engine.domain.tasks import RunMode, Task, TaskStatus
from engine.providers.base import PollResult
from engine.providers.context import TaskContext, current_task_context, open_lifespans
from engine.service.engine import Engine
from engine.tasks.store import ProgressReport
from engine_tests.tasks.conftest import make_config, request

MODEL = "ctx-model"


class ReportingProvider:
    """Reports progress ``reports`` times in a tight loop in each poll; done on poll two.
    Records what it saw of its context, and its lifespan."""

    poll_interval = 0.3

    def __init__(self, reports: int = 1000) -> None:
        self.reports = reports
        self.polls = 0
        self.seen: list[tuple[uuid.UUID, Any, str | None]] = []
        self.lifespan_log: list[str] = []

    @asynccontextmanager
    async def lifespan(self) -> AsyncIterator[dict[str, str]]:
        self.lifespan_log.append("enter")
        try:
            yield {"client": "shared"}
        finally:
            self.lifespan_log.append("exit")

    async def prepare(self, task: Task) -> Any:
        context = engine.current_task_context()
        self.seen.append((context.task.id, context.resources, context.callback_url))
        return None

    async def submit(self, task: Task, prepared: Any) -> str:
        return "ref-1"

    async def poll(self, task: Task, upstream_ref: str) -> PollResult:
        self.polls += 1
        context = current_task_context()
        for n in range(self.reports):
            context.report_progress((n + 1) / self.reports, f"step {n + 1}")
        if self.polls == 1:
            return PollResult(done=False)
        self.lifespan_log.append("last poll")
        return PollResult(done=True, result={"ok": True})

    async def finalize(self, task: Task, result: Any) -> Any:
        return result

    async def cancel(self, task: Task, upstream_ref: str) -> None:
        return None


def open_test_engine(db_url: str, **kw: Any) -> Any:
    """An engine on this test's database (``execute=False``: the records layer only)."""
    execute = kw.pop("execute", True)
    config = make_config(**{"worker.hard_limit": 8})
    return engine.open(config, urls=DatabaseUrls.single(db_url), control=execute, **kw)


async def progress_events(eng: Engine, task_id: uuid.UUID) -> list[Any]:
    return [e for e in await eng.events(task_id) if e.type == "task.progress"]


async def test_progress_reports_are_coalesced_and_recorded(db_url: str) -> None:
    provider = ReportingProvider(reports=1000)
    async with open_test_engine(db_url, providers={MODEL: provider}) as eng:
        await eng.set_model(MODEL)
        task_id = await eng.submit(request(model=MODEL, run_mode=RunMode.LIVE))
        task = await eng.wait(task_id, timeout=15)
        with trio.fail_after(10):
            while not await progress_events(eng, task_id):
                await trio.sleep(0.02)  # events are written in batches
        events = await progress_events(eng, task_id)
        written = eng.event_writer.progress_written
    assert task.status is TaskStatus.SUCCEEDED
    # 2,000 reports over two polls 0.3 s apart: at most one write per task and second, so
    # one or two (the first poll's last report, perhaps the second's before the finish).
    assert 1 <= len(events) <= 2, [(e.progress, e.payload) for e in events]
    assert written == len(events)
    first = events[0]
    assert first.phase == "waiting_upstream" and first.status == "running"
    # The latest report of the first poll won: all of the phase's work, 0.4 → 0.9.
    assert first.payload == {"fraction": 1.0} and first.message == "step 1000"
    assert first.progress == pytest.approx(0.9)


async def test_a_stale_token_cannot_write_progress(db_url: str) -> None:
    async with open_test_engine(db_url, execute=False) as eng:
        await eng.set_model(MODEL)
        task_id = await eng.submit(request(model=MODEL, run_mode=RunMode.LIVE))
        token = uuid.uuid4()
        claimed = await eng.store.claim(task_id, token)
        assert claimed is not None and claimed.status is TaskStatus.RUNNING

        def report(with_token: uuid.UUID, fraction: float) -> None:
            eng.event_writer.report_progress(
                ProgressReport(
                    task_id,
                    with_token,
                    "preparing",
                    0.1 + 0.2 * fraction,
                    fraction,
                    None,
                    False,
                    "test",
                    datetime.now(UTC),
                )
            )

        report(uuid.uuid4(), 0.5)  # an execution that no longer holds the task
        await eng.event_writer.flush(retry=False)
        stale = await eng.get(task_id)
        stale_events = await progress_events(eng, task_id)
        report(token, 0.5)
        await eng.event_writer.flush(retry=False)
        held = await eng.get(task_id)
        held_events = await progress_events(eng, task_id)
    assert stale is not None and stale.progress == pytest.approx(0.1)
    assert stale_events == []
    assert held is not None and held.progress == pytest.approx(0.2)
    assert [e.payload for e in held_events] == [{"fraction": 0.5}]


async def test_the_lifespan_is_entered_once_and_exited_at_shutdown(db_url: str) -> None:
    provider = ReportingProvider(reports=1)
    config = make_config(**{"worker.hard_limit": 4})
    # One provider serving two models: entered once.
    providers = {MODEL: provider, "ctx-other": provider}
    async with engine.open(config, urls=DatabaseUrls.single(db_url), providers=providers) as eng:
        assert provider.lifespan_log == ["enter"]
        await eng.set_model(MODEL)
        task = await eng.wait(
            await eng.submit(request(model=MODEL, run_mode=RunMode.LIVE)), timeout=15
        )
        assert provider.lifespan_log == ["enter", "last poll"]
    assert provider.lifespan_log == ["enter", "last poll", "exit"]
    assert task.status is TaskStatus.SUCCEEDED
    # The task saw what the lifespan yielded; no hooks served here, so no callback URL.
    assert provider.seen == [(task.id, {"client": "shared"}, None)]


async def test_open_lifespans_refuses_a_lifespan_that_is_no_context_manager() -> None:
    class Bad:
        def lifespan(self) -> int:
            return 1

    with pytest.raises(engine.InvalidProvider, match="lifespan"):
        async with open_lifespans({"m": Bad()}):
            pass


def test_there_is_no_task_context_outside_a_provider_method() -> None:
    with pytest.raises(RuntimeError, match="only inside a provider method"):
        engine.current_task_context()


def test_report_progress_refuses_what_is_not_a_fraction() -> None:
    context = TaskContext(cast(Task, None), uuid.uuid4())
    for bad in (float("nan"), "half", True):
        with pytest.raises(ValueError):
            context.report_progress(bad)  # type: ignore[arg-type]
    context.report_progress(7.0)
    assert context.last_report == (1.0, None)
