"""One LISTEN connection per process: the service listens on every channel over one backend,
and a NOTIFY on each channel reaches its consumer through it.

Every poll interval is set far beyond the test's deadlines (producers, capacity refresh,
admission rounds, lease renewals), so only a notification can make each step happen in time.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

import trio

from engine.db import channels
from engine.db.bridge import Connection
from engine.db.listen import LISTEN_APPLICATION_NAME
from engine.domain.tasks import TaskStatus
from engine.service.engine import Engine
from engine_tests.service.test_service import service, wait_for
from engine_tests.tasks.conftest import request
from engine_tests.tasks.test_runner import GatedProvider

#: Far beyond every deadline below: what happens in time was woken by a notification.
SLOW = {
    "queue.fetch_poll_interval": 30,
    "worker.refresh_interval": 30,
    "recovery.stale_after": 90,
    "admission.stale_after": 90,
    "admission.dispatch_interval": 30,
    "tasks.lease_ttl": 60,
    "tasks.lease_renew_interval": 30,
}


async def _listening_backends(conn: Connection) -> list[dict[str, Any]]:
    """Backends of this test's database that are LISTEN connections or last ran a LISTEN."""
    rows = await conn.fetch(
        "SELECT pid, application_name, query FROM pg_stat_activity"
        " WHERE datname = current_database() AND pid <> pg_backend_pid()"
        " AND (application_name = $1 OR query ILIKE 'LISTEN%')",
        LISTEN_APPLICATION_NAME,
    )
    return [dict(r) for r in rows]


async def _allocated(eng: Engine, n: int) -> bool:
    return bool(
        await eng.db.coordination.fetchval("SELECT allocated = $1 FROM engine_worker_instance", n)
    )


async def _admission(eng: Engine, task_id: uuid.UUID) -> str | None:
    value = await eng.db.tasks.fetchval(
        "SELECT status FROM engine_task_admission WHERE task_id = $1", task_id
    )
    return None if value is None else str(value)


async def test_the_service_listens_on_every_channel_over_one_connection(
    db_url: str, conn: Connection
) -> None:
    provider = GatedProvider()
    async with service(db_url, provider, **SLOW) as (eng, _):
        hub = eng.queue.notifier.hub
        assert set(hub.channels) == set(channels.every_channel(eng.queue.channels))
        [backend] = await _listening_backends(conn)
        assert hub.listener.connection is not None
        assert backend["pid"] == hub.listener.connection.backend_pid

        # engine_catalog: a catalogue change refreshes capacity (the tick is 30 s away).
        await eng.set_model("sim-model", concurrency_limit=1)
        await eng.set_model("spare-model", concurrency_limit=1)
        await wait_for(lambda: _allocated(eng, 2), timeout=5)

        # river_insert: a submitted task is claimed at once; it holds sim-model's only slot.
        provider.poll_gate = gate = trio.Event()
        first = await eng.submit(request())
        with trio.fail_after(5):
            await provider.in_poll.wait()
        # The second waits for admission: its scope is full (its job completes).
        second = await eng.submit(request())
        await wait_for(lambda: _is_waiting(eng, second), timeout=5)

        # engine_admission (the first one's slot is released) wakes the dispatcher, whose job
        # insert wakes a producer (river_insert), and the finish wakes the waiter
        # (engine_task_finished): all within 5 s, while every poll is 30 s away.
        finished = eng.notices.waiter(second)
        gate.set()
        with trio.fail_after(5):
            await finished.wait()
        assert (await eng.wait(first, timeout=5)).status is TaskStatus.SUCCEEDED
        assert (await eng.wait(second, timeout=5)).status is TaskStatus.SUCCEEDED

        # engine_task_cancel and engine_task_callback reach the task notices' hooks.
        cancels: list[uuid.UUID] = []
        callbacks: list[uuid.UUID | None] = []
        eng.notices.on_cancel = cancels.append
        eng.notices.on_callback = callbacks.append
        someone = uuid.uuid4()
        await conn.execute(
            "SELECT pg_notify($1, $3), pg_notify($2, $3)",
            channels.TASK_CANCEL,
            channels.TASK_CALLBACK,
            str(someone),
        )
        await wait_for(lambda: _nonempty(cancels, callbacks), timeout=5)
        assert cancels == [someone] and callbacks == [someone]

        # river_control reaches the control subscribers, river_leadership the electors.
        controls: list[dict[str, Any]] = []
        with (
            eng.queue.notifier.subscribe_control(controls.append),
            eng.queue.notifier.subscribe_leadership() as resigned,
        ):
            await eng.queue.pause("paused-queue")
            await conn.execute(
                "SELECT pg_notify($1, $2)",
                eng.queue.channels.leadership,
                json.dumps({"action": "resigned"}),
            )
            with trio.fail_after(5):
                await resigned.wait()
            await wait_for(lambda: _nonempty(controls), timeout=5)
        assert controls == [{"action": "pause", "queue": "paused-queue"}]

        # Every consumer ran, and still only the one connection listens.
        [after] = await _listening_backends(conn)
        assert after["pid"] == backend["pid"]
        assert hub.listener.reconnects == 0


async def test_a_client_process_listens_over_one_connection_too(
    db_url: str, conn: Connection
) -> None:
    async with service(db_url, **{**SLOW, "worker.mode": "client"}) as (eng, _):
        [backend] = await _listening_backends(conn)
        await eng.set_model("sim-model")
        task_id = await eng.submit(request())
        finished = eng.notices.waiter(task_id)
        # Finish it from outside, as another instance would: the trigger's NOTIFY wakes us.
        await conn.execute(
            "UPDATE engine_task SET status = 'cancelled', finished_at = now() WHERE id = $1",
            task_id,
        )
        with trio.fail_after(5):
            await finished.wait()
        [after] = await _listening_backends(conn)
        assert after["pid"] == backend["pid"]


async def test_without_a_listen_url_behind_a_transaction_pooler_nothing_listens(
    db_url: str, conn: Connection
) -> None:
    """``database.pooler = "transaction"`` and no ``listen_url``: no LISTEN connection, and
    tasks still run (every consumer polls)."""
    async with service(db_url, **{"database.pooler": "transaction"}) as (eng, _):
        assert eng.queue.notifier.hub.dsn is None
        await eng.set_model("sim-model")
        task_id = await eng.submit(request())
        assert (await eng.wait(task_id, timeout=20)).status is TaskStatus.SUCCEEDED
        assert await _listening_backends(conn) == []


async def _is_waiting(eng: Engine, task_id: uuid.UUID) -> bool:
    return await _admission(eng, task_id) == "waiting"


async def _nonempty(*lists: list[Any]) -> bool:
    return all(lists)
