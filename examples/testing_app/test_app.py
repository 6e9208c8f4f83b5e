"""The example app's tests: its provider without a database, its submit path on a manual
engine, and the whole path on a running one."""

from __future__ import annotations

import pytest
import trio

import engine
from engine.testing import (
    all_submitted,
    assert_submitted,
    drain,
    make_task,
    refute_submitted,
    run_provider,
)

from .app import (
    MODEL,
    InMemoryUpstream,
    InvalidDocument,
    SummaryProvider,
    request_summary,
    requested,
    summarize,
)

TEXT = "engine runs tasks on providers and records every outcome in the database"


def document(document_id: str, text: str = TEXT, max_words: int = 3) -> dict[str, object]:
    """A task payload as the app's submit path writes it."""
    return {"document_id": document_id, "text": text, "max_words": max_words}


# ---- the provider, without a database --------------------------------------------------------


async def test_a_summary_is_the_first_words(provider: SummaryProvider) -> None:
    task = await run_provider(provider, make_task(model=MODEL, payload=document("d1")))
    assert task.status is engine.TaskStatus.SUCCEEDED
    assert task.result == {"summary": "engine runs tasks", "words": 3}
    assert task.upstream_ref == "job-1"


async def test_a_refused_request_fails_the_task(
    provider: SummaryProvider, upstream: InMemoryUpstream
) -> None:
    upstream.refuse("d1", "quota exceeded")
    task = await run_provider(provider, make_task(model=MODEL, payload=document("d1")))
    assert task.status is engine.TaskStatus.FAILED
    assert task.error == {"code": "upstream_refused", "message": "quota exceeded"}


async def test_a_lost_answer_goes_to_manual_review(
    provider: SummaryProvider, upstream: InMemoryUpstream
) -> None:
    upstream.lose_answer("d1")
    task = await run_provider(provider, make_task(model=MODEL, payload=document("d1")))
    assert task.status is engine.TaskStatus.MANUAL_REVIEW
    assert task.error["code"] == "ambiguous_submission"
    assert len(upstream.requests) == 1  # sent once, and never again


async def test_an_upstream_that_never_finishes_times_out(upstream: InMemoryUpstream) -> None:
    upstream.stall("d1")
    provider = SummaryProvider(upstream, poll_interval=0.01, max_wait=0.05)
    task = await run_provider(provider, make_task(model=MODEL, payload=document("d1")))
    assert task.status is engine.TaskStatus.FAILED
    assert task.error == {"code": "upstream_timeout", "message": "no summary after 0.05 s"}


# ---- the submit path, on an engine that runs nothing -------------------------------------------


async def test_a_request_is_stored_with_its_record(
    engine_manual: engine.Engine, upstream: InMemoryUpstream
) -> None:
    task_id = await summarize(engine_manual, tenant="acme", user="ann", document_id="d1", text=TEXT)
    [task] = await assert_submitted(
        engine_manual, model=MODEL, tenant="acme", payload={"document_id": "d1"}, status="queued"
    )
    assert task.id == task_id
    async with engine_manual.db.tasks.acquire() as conn:
        assert await requested(conn, "d1") == task_id
    assert upstream.requests == []  # stored, not run


async def test_invalid_documents_store_nothing(engine_manual: engine.Engine) -> None:
    with pytest.raises(InvalidDocument, match="is empty"):
        await summarize(engine_manual, tenant="acme", user="ann", document_id="d1", text=" ")
    with pytest.raises(engine.InvalidTask, match="identity needs user_id"):
        await summarize(engine_manual, tenant="acme", user="", document_id="d2", text=TEXT)
    await refute_submitted(engine_manual)
    async with engine_manual.db.tasks.acquire() as conn:
        assert await requested(conn, "d2") is None  # the app's row went with the task


async def test_a_rolled_back_transaction_leaves_no_task(engine_manual: engine.Engine) -> None:
    class Abort(Exception):
        pass

    with pytest.raises(Abort):
        async with engine_manual.db.tasks.transaction() as conn:
            await request_summary(
                engine_manual, conn, tenant="acme", user="ann", document_id="d1", text=TEXT
            )
            raise Abort  # e.g. the app's next write failed
    await refute_submitted(engine_manual, model=MODEL)
    async with engine_manual.db.tasks.acquire() as conn:
        assert await requested(conn, "d1") is None


async def test_drain_runs_what_was_queued(
    engine_manual: engine.Engine, upstream: InMemoryUpstream
) -> None:
    upstream.refuse("d2", "quota exceeded")
    for document_id in ("d1", "d2", "d3"):
        await summarize(
            engine_manual, tenant="acme", user="ann", document_id=document_id, text=TEXT
        )
    ran = await drain(engine_manual)
    assert [(t.payload["document_id"], t.status) for t in ran] == [
        ("d1", engine.TaskStatus.SUCCEEDED),
        ("d2", engine.TaskStatus.FAILED),
        ("d3", engine.TaskStatus.SUCCEEDED),
    ]
    assert await all_submitted(engine_manual, status="queued") == []


# ---- the whole path, on an engine that runs tasks ----------------------------------------------


async def test_a_summary_runs_end_to_end(engine_running: engine.Engine) -> None:
    task_id = await summarize(
        engine_running, tenant="acme", user="ann", document_id="d1", text=TEXT
    )
    task = await engine_running.wait(task_id, timeout=10)
    assert task.status is engine.TaskStatus.SUCCEEDED
    assert task.result == {"summary": TEXT, "words": 12}


async def test_waiting_for_a_stalled_upstream_times_out(
    engine_running: engine.Engine, upstream: InMemoryUpstream, provider: SummaryProvider
) -> None:
    upstream.stall("d1")
    provider.poll_interval = 0.01  # the engine polls it again and again meanwhile
    task_id = await summarize(
        engine_running, tenant="acme", user="ann", document_id="d1", text=TEXT
    )
    with pytest.raises(trio.TooSlowError):
        await engine_running.wait(task_id, timeout=0.1)
    task = await engine_running.get(task_id)
    assert task is not None and task.status is engine.TaskStatus.RUNNING
