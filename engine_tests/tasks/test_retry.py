"""``Engine.retry``: a failed, cancelled or manual_review task runs again with a new job; any
other task is refused and nothing changes.

The engine is the records layer only (``execute=False``): nothing claims the jobs, so every
state a test sets up stays as it is until ``retry`` acts on it. The CLI's ``tasks retry``, a
thin caller, is covered in engine_tests/acceptance/test_inspect_cli.py.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

import pytest

from engine.db.bridge import Connection
from engine.domain.tasks import RunMode, TaskStatus
from engine.errors import TaskError, TaskNotFound
from engine.service.engine import Engine
from engine_tests.tasks.conftest import OpenEngine, request


@pytest.fixture
async def records(open_test_engine: OpenEngine) -> AsyncIterator[Engine]:
    """A client-only engine (no execution) with the model ``sim-model``."""
    async with open_test_engine(execute=False) as engine:
        await engine.set_model("sim-model")
        yield engine


async def _finish(conn: Connection, task_id: uuid.UUID, status: str) -> None:
    """Make a task look as if it ran and ended ``status``, submitted upstream as ``up-1``."""
    await conn.execute(
        """UPDATE engine_task
           SET status = $2, finished_at = now(), submitted_at = now(), upstream_ref = 'up-1',
               attempts = 1, error = '{"code": "boom"}', result = NULL
           WHERE id = $1""",
        task_id,
        status,
    )
    await conn.execute(
        "UPDATE river_job SET state = 'completed', finalized_at = now() "
        "WHERE id = (SELECT river_job_id FROM engine_task WHERE id = $1)",
        task_id,
    )


async def _job(conn: Connection, job_id: int | None) -> tuple[str, dict[str, str]]:
    row = await conn.fetchrow(
        "SELECT state::text AS state, args FROM river_job WHERE id = $1", job_id
    )
    assert row is not None
    return row["state"], row["args"]


async def test_retry_of_a_cancelled_task_queues_it_with_a_new_job(
    records: Engine, conn: Connection
) -> None:
    task_id = await records.submit(request())
    before = await records.cancel(task_id)
    assert before.status is TaskStatus.CANCELLED

    task = await records.retry(task_id)
    assert task.status is TaskStatus.QUEUED and task.finished_at is None
    assert task.cancel_requested_at is None and task.error is None
    assert task.river_job_id is not None and task.river_job_id != before.river_job_id
    # As committed: what retry returned is what the database holds.
    assert await records.get(task_id) == task
    assert await _job(conn, task.river_job_id) == ("available", {"task_id": str(task_id)})
    assert [e.type for e in await records.events(task_id)] == ["task.queued", "task.retried"]


async def test_retry_of_a_failed_or_manual_review_task_submits_upstream_again(
    records: Engine, conn: Connection
) -> None:
    failed = await records.submit(request())
    manual = await records.submit(request(run_mode=RunMode.LIVE))
    await _finish(conn, failed, "failed")
    await _finish(conn, manual, "manual_review")
    for task_id in (failed, manual):
        task = await records.retry(task_id)
        assert task.status is TaskStatus.QUEUED
        assert task.submitted_at is None and task.upstream_ref is None
        assert task.error is None and task.attempts == 1
    # The live task's new job carries its model, so only an instance serving it claims it.
    retried = await records.get(manual)
    assert retried is not None
    assert await _job(conn, retried.river_job_id) == (
        "available",
        {"task_id": str(manual), "model": "sim-model"},
    )


async def test_retry_refuses_other_statuses_and_changes_nothing(
    records: Engine, conn: Connection
) -> None:
    queued, succeeded, running = await records.submit([request() for _ in range(3)])
    await conn.execute(
        "UPDATE engine_task SET status = 'succeeded', finished_at = now() WHERE id = $1",
        succeeded,
    )
    await conn.execute(
        "UPDATE engine_task SET status = 'running', phase = 'preparing', attempts = 1, "
        "execution_token = gen_random_uuid(), execution_owner = 'elsewhere', "
        "lease_expires_at = now() + interval '1 minute' WHERE id = $1",
        running,
    )
    before = {t: await records.get(t) for t in (queued, succeeded, running)}
    with pytest.raises(TaskError) as refused:
        await records.retry(queued)
    assert str(refused.value) == (
        f"task {queued} is queued: it has not run yet, so there is nothing to retry"
    )
    with pytest.raises(TaskError) as refused:
        await records.retry(succeeded)
    assert str(refused.value) == (
        f"task {succeeded} is succeeded; only failed, cancelled and manual_review tasks can be "
        "retried"
    )
    with pytest.raises(TaskError) as refused:
        await records.retry(running)
    assert str(refused.value) == (
        f"task {running} is running: cancel it first if it must start over (only failed, "
        "cancelled and manual_review tasks can be retried)"
    )
    assert {t: await records.get(t) for t in before} == before
    missing = uuid.uuid4()
    with pytest.raises(TaskNotFound) as not_found:
        await records.retry(missing)
    assert str(not_found.value) == f"no task {missing}"


async def test_retry_refuses_a_task_whose_previous_job_still_runs(
    records: Engine, conn: Connection
) -> None:
    task_id = await records.submit(request())
    cancelled = await records.cancel(task_id)
    # Its job is still running (a run that would not pick the task up again).
    await conn.execute(
        "UPDATE river_job SET state = 'running', attempt = 1, attempted_at = now(), "
        "finalized_at = NULL WHERE id = $1",
        cancelled.river_job_id,
    )
    events = await records.events(task_id)
    with pytest.raises(TaskError) as refused:
        await records.retry(task_id)
    assert str(refused.value) == (
        f"task {task_id}: its previous job {cancelled.river_job_id} is still running; retry "
        "again once it has finished"
    )
    # Rolled back: the task, its events and the jobs are as before.
    assert await records.get(task_id) == cancelled
    assert await records.events(task_id) == events
    assert await conn.fetchval("SELECT count(*) FROM river_job") == 1
