"""The event writer: history survives a stop that lands while a batch is being written; lease
renewals go out in bounded chunks."""

from __future__ import annotations

import json
import uuid

import pytest
import trio
import trio.testing

from engine.db.bridge import Connection, Counters
from engine.db.database import Database
from engine.domain.tasks import TaskEvent, TaskStatus
from engine.tasks import store as store_module
from engine.tasks.store import EventWriter, TaskStore
from engine_tests.tasks.conftest import insert_running_tasks


async def test_a_stop_during_a_write_keeps_the_batch(database: Database, conn: Connection) -> None:
    writer = EventWriter(database.tasks, interval=0.01)
    task_id = uuid.uuid4()
    stop = trio.CancelScope()

    async def run_writer(*, task_status: trio.TaskStatus[None]) -> None:
        with stop:
            await writer.run(task_status=task_status)

    async with trio.open_nursery() as nursery:
        await nursery.start(run_writer)
        # Hold the table so the writer's INSERT waits on the lock, then stop the writer.
        await conn.execute("BEGIN")
        await conn.execute("LOCK TABLE engine_task_event IN EXCLUSIVE MODE")
        writer.emit(TaskEvent(task_id, "task.requeued", status="queued"))
        # Polled from another connection: in the locking transaction the statistics views
        # keep the snapshot of their first read.
        with trio.fail_after(10):
            while not await database.tasks.fetchval(
                "SELECT count(*) FROM pg_stat_activity"
                " WHERE wait_event_type = 'Lock' AND pid <> pg_backend_pid()"
                " AND query LIKE '%INSERT INTO engine_task_event%'"
            ):
                await trio.sleep(0.01)
        stop.cancel()
        await trio.testing.wait_all_tasks_blocked()  # the cancellation reached the writer
        await conn.execute("COMMIT")
    rows = await conn.fetch("SELECT type FROM engine_task_event WHERE task_id = $1", task_id)
    assert [r["type"] for r in rows] == ["task.requeued"]


async def test_a_renewal_goes_out_in_chunks_and_reports_every_lease(
    database: Database, conn: Connection, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A process holding 50,000 executions renews them in bounded statements, and the answer is
    # the same as one statement's: held leases (with their cancel requests), lost ones absent.
    monkeypatch.setattr(store_module, "LEASE_CHUNK", 100)
    ids = await insert_running_tasks(conn, 250, phase="waiting_upstream", lease_seconds=1.0)
    cancelled = set(ids[95:105])  # straddles the first chunk's end
    await conn.execute(
        "UPDATE engine_task SET cancel_requested_at = now() WHERE id = ANY($1::uuid[])",
        list(cancelled),
    )
    lost = ids[-1]
    leases = [(i, i if i != lost else uuid.uuid4()) for i in ids]
    store = TaskStore(database.tasks, "owner", lease_ttl=600.0)
    before = Counters.statements
    held = await store.renew(leases)
    assert Counters.statements - before == 3
    assert held == {i: i in cancelled for i in ids if i != lost}
    extended = await conn.fetchval(
        "SELECT count(*) FROM engine_task WHERE lease_expires_at > now() + interval '500 s'"
    )
    assert extended == len(ids) - 1


@pytest.mark.parametrize(
    ("result", "problem"),
    [
        ({"text": "plain"}, None),
        ({"text": "café 😀"}, None),  # non-ASCII and a surrogate pair (escaped in the text)
        ({"text": "a backslash then u0000: \\u0000"}, None),  # only looks like an escape
        ({"text": "a\x00b"}, "has text holding a NUL character"),
        ({"k\x00": 1}, "has a key 'k\\x00' holding a NUL character"),
        (["\ud800"], "has text holding a lone surrogate (U+D800)"),
        ({"score": float("nan")}, "is not JSON (Out of range float values are not JSON"),
    ],
)
async def test_an_outcome_is_stored_unless_jsonb_would_refuse_it(
    conn: Connection, result: object, problem: str | None
) -> None:
    status, text, _ = store_module.storable_outcome(TaskStatus.SUCCEEDED, result, None)
    if problem is None:
        assert status is TaskStatus.SUCCEEDED
        assert text is not None
        assert await conn.fetchval("SELECT $1::text::jsonb = $2::jsonb", text, result)
    else:
        assert (status, text) == (TaskStatus.FAILED, None)
        _, _, error = store_module.storable_outcome(TaskStatus.SUCCEEDED, result, None)
        assert error is not None
        assert json.loads(error)["message"].startswith(f"the provider's result {problem}")
