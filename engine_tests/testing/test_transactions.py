"""submit_tx on the app's own connection: the tasks exist, and run, only if it commits."""

from __future__ import annotations

from collections.abc import Mapping

import pytest

import engine
from engine.db.bridge import connect
from engine.testing import assert_submitted, drain, make_request, refute_submitted

from .scripted import Scripted

ORDERS = "CREATE TABLE IF NOT EXISTS app_order (id text PRIMARY KEY, task_id uuid NOT NULL)"


class Abort(Exception):
    """The app's own failure, later in the same transaction."""


@pytest.fixture
def engine_providers() -> Mapping[str, engine.Provider]:
    return {"m": Scripted()}


async def place_order(eng: engine.Engine, conn: engine.Connection, order: str) -> None:
    """An app's submit path: its own row and the task, in the caller's transaction."""
    request = make_request(model="m", payload={"order": order})
    await conn.execute(ORDERS)
    await conn.execute("INSERT INTO app_order (id, task_id) VALUES ($1, $2)", order, request.id)
    await eng.submit_tx(conn, [request])


async def orders(eng: engine.Engine) -> list[str]:
    async with eng.db.tasks.acquire() as conn:
        if not await conn.fetchval("SELECT to_regclass('app_order') IS NOT NULL"):
            return []
        return [r["id"] for r in await conn.fetch("SELECT id FROM app_order ORDER BY id")]


async def test_a_committed_transaction_stores_the_task_with_the_apps_row(
    engine_manual: engine.Engine,
) -> None:
    async with engine_manual.db.tasks.transaction() as conn:
        await place_order(engine_manual, conn, "o1")
        await refute_submitted(engine_manual)  # not visible before the commit
    [task] = await assert_submitted(engine_manual, payload={"order": "o1"})
    assert await orders(engine_manual) == ["o1"]
    [ran] = await drain(engine_manual)
    assert ran.id == task.id and ran.status is engine.TaskStatus.SUCCEEDED


async def test_a_rolled_back_transaction_leaves_no_task_and_no_job(
    engine_manual: engine.Engine,
) -> None:
    with pytest.raises(Abort):
        async with engine_manual.db.tasks.transaction() as conn:
            await place_order(engine_manual, conn, "o1")
            raise Abort
    await refute_submitted(engine_manual)
    assert await orders(engine_manual) == []
    assert await engine_manual.queue.counts() == {}  # no job either
    assert await drain(engine_manual) == []


async def test_an_invalid_request_rolls_back_the_apps_row_too(
    engine_manual: engine.Engine,
) -> None:
    async with engine_manual.db.tasks.acquire() as conn:
        await conn.execute(ORDERS)
    with pytest.raises(engine.InvalidTask, match="unknown model 'nope'"):
        async with engine_manual.db.tasks.transaction() as conn:
            await conn.execute(
                "INSERT INTO app_order (id, task_id) VALUES ('o1', gen_random_uuid())"
            )
            await engine_manual.submit_tx(conn, [make_request(model="nope")])
    assert await orders(engine_manual) == []


async def test_a_savepoint_undoes_only_its_own_task(engine_manual: engine.Engine) -> None:
    async with engine_manual.db.tasks.transaction() as conn:
        await place_order(engine_manual, conn, "o1")
        with pytest.raises(Abort):
            async with conn.transaction():  # nested: a savepoint
                await place_order(engine_manual, conn, "o2")
                raise Abort
    await assert_submitted(engine_manual, count=1, payload={"order": "o1"})
    assert await orders(engine_manual) == ["o1"]


async def test_a_connection_of_the_apps_own(
    engine_running: engine.Engine, engine_database_url: str
) -> None:
    """A connection the app opened itself (``engine.db.bridge.connect``: the engine's codecs)
    to the tasks database works the same."""
    conn: engine.Connection = await connect(engine_database_url)
    try:
        with pytest.raises(Abort):
            async with conn.transaction():
                await place_order(engine_running, conn, "o1")
                raise Abort
        async with conn.transaction():
            await place_order(engine_running, conn, "o2")
    finally:
        await conn.close()
    [task] = await assert_submitted(engine_running)
    assert task.payload == {"order": "o2"}
    done = await engine_running.wait(task.id, timeout=10)
    assert done.status is engine.TaskStatus.SUCCEEDED
