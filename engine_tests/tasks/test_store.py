"""The event writer: history survives a stop that lands while a batch is being written."""

from __future__ import annotations

import uuid

import trio
import trio.testing

from engine.db.bridge import Connection
from engine.db.database import Database
from engine.domain.tasks import TaskEvent
from engine.tasks.store import EventWriter


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
