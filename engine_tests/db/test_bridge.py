"""The trio–asyncpg bridge: errors, transactions, cancellation, pools."""

from __future__ import annotations

import logging
import uuid

import pytest
import trio

from engine.db.bridge import Connection, asyncio_loop, connect, create_pool, uuid_of
from engine.db.database import Database
from engine.errors import DatabaseError, LockTimeout, TransactionConflict, UniqueViolation


async def test_query_round_trip_and_json_codec(conn: Connection) -> None:
    assert await conn.fetchval("SELECT 1") == 1
    assert await conn.fetchval("SELECT $1::jsonb", {"a": [1, 2]}) == {"a": [1, 2]}
    assert await conn.fetchval("SELECT ARRAY['{\"x\":1}'::jsonb]") == [{"x": 1}]


async def test_errors_are_mapped_to_engine_types(conn: Connection) -> None:
    await conn.execute("CREATE TABLE u (id int PRIMARY KEY)")
    await conn.execute("INSERT INTO u VALUES (1)")
    with pytest.raises(UniqueViolation) as info:
        await conn.execute("INSERT INTO u VALUES (1)")
    assert info.value.constraint_name == "u_pkey"
    with pytest.raises(DatabaseError, match="does not exist") as bad:
        await conn.execute("SELECT * FROM missing_table")
    assert bad.value.sqlstate == "42P01"


async def test_transaction_commits_and_rolls_back(conn: Connection) -> None:
    await conn.execute("CREATE TABLE t (v int)")
    async with conn.transaction():
        await conn.execute("INSERT INTO t VALUES (1)")
    with pytest.raises(RuntimeError, match="boom"):
        async with conn.transaction():
            await conn.execute("INSERT INTO t VALUES (2)")
            raise RuntimeError("boom")
    assert await conn.fetch("SELECT v FROM t") == [(1,)]


async def test_real_lock_timeout_is_lock_timeout(db_url: str, conn: Connection) -> None:
    await conn.execute("CREATE TABLE l (id int PRIMARY KEY); INSERT INTO l VALUES (1)")
    pool = await create_pool(db_url, lock_timeout=0.05)
    try:
        async with conn.transaction():
            await conn.execute("SELECT * FROM l WHERE id = 1 FOR UPDATE")
            with pytest.raises(LockTimeout):
                await pool.execute("UPDATE l SET id = 2 WHERE id = 1")
    finally:
        await pool.close()


async def test_cancelled_query_returns_connection_and_leaves_server(
    database: Database, conn: Connection
) -> None:
    pool = database.tasks
    with trio.move_on_after(0.3) as scope:
        await pool.fetchval("SELECT pg_sleep(30)")
    assert scope.cancelled_caught
    assert pool.in_use() == 0
    # The server-side query is gone too: asyncpg sent a cancel request.
    with trio.fail_after(5):
        while await conn.fetchval(
            "SELECT count(*) FROM pg_stat_activity"
            " WHERE state = 'active' AND query LIKE 'SELECT pg_sleep(30)%'"
        ):
            await trio.sleep(0.01)
    assert await pool.fetchval("SELECT 41 + 1") == 42


@pytest.mark.parametrize("way", ["acquire", "pooled statement"])
async def test_cancelling_many_borrowers_leaks_nothing(database: Database, way: str) -> None:
    pool = database.tasks

    async def borrow() -> None:
        if way == "pooled statement":  # borrowed and given back on the asyncio side
            await pool.fetchval("SELECT pg_sleep(30)")
            return
        async with pool.acquire() as c:
            await c.fetchval("SELECT pg_sleep(30)")

    with trio.move_on_after(0.3):
        async with trio.open_nursery() as nursery:
            for _ in range(20):
                nursery.start_soon(borrow)
    assert pool.in_use() == 0


async def test_a_real_deadlock_is_a_transaction_conflict(db_url: str) -> None:
    a, b = await connect(db_url), await connect(db_url)
    try:
        await a.execute("CREATE TABLE dl (id int PRIMARY KEY, n int)")
        await a.execute("INSERT INTO dl VALUES (1, 0), (2, 0)")
        both_hold_one = trio.Event()
        held = 0
        errors: list[BaseException] = []

        async def cross(conn: Connection, first: int, second: int) -> None:
            nonlocal held
            try:
                async with conn.transaction():
                    await conn.execute("UPDATE dl SET n = n + 1 WHERE id = $1", first)
                    held += 1
                    if held == 2:
                        both_hold_one.set()
                    await both_hold_one.wait()
                    await conn.execute("UPDATE dl SET n = n + 1 WHERE id = $1", second)
            except TransactionConflict as exc:
                errors.append(exc)

        with trio.fail_after(30):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(cross, a, 1, 2)
                nursery.start_soon(cross, b, 2, 1)
        assert len(errors) == 1  # the server broke the cycle by rolling back one side
        assert "deadlock" in str(errors[0])
    finally:
        await a.close()
        await b.close()


async def test_a_connection_released_inside_a_transaction_leaves_the_loop_working(
    pg_admin_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """asyncpg reports such a release to the loop's exception handler. trio-asyncio's default
    handler would raise the report inside the loop's task nursery, cancelling every socket
    watcher, and every query still waiting would then wait forever. The loop is this test's
    own (no ``aio_loop`` fixture), so that bug fails the test at once instead of hanging it."""

    def reports() -> list[logging.LogRecord]:
        return [r for r in caplog.records if getattr(r, "event", None) == "asyncio_error"]

    async with asyncio_loop():
        pool = await create_pool(pg_admin_url, min_size=2, max_size=2)
        try:
            async with pool.acquire() as conn, pool.acquire() as other:
                await conn.execute("BEGIN")
                await conn.execute("SELECT 1")
                await other.execute("SELECT 1")  # a second connection, with a watcher too
            with trio.fail_after(5):
                while not reports():  # the report, handled, and whatever it scheduled has run
                    await trio.sleep(0.01)
                async with pool.acquire() as first, pool.acquire() as second:
                    assert await first.fetchval("SELECT 1") == 1
                    assert await second.fetchval("SELECT 1") == 1
                    # asyncpg rolled the transaction back on release, as it reported.
                    assert not first.raw.is_in_transaction()
                    assert not second.raw.is_in_transaction()
        finally:
            await pool.close()
    assert "active transaction" in reports()[0].getMessage()


async def test_a_nested_transaction_is_a_savepoint(conn: Connection) -> None:
    await conn.execute("CREATE TABLE n (v int)")
    async with conn.transaction():
        await conn.execute("INSERT INTO n VALUES (1)")
        with pytest.raises(UniqueViolation):
            async with conn.transaction():
                await conn.execute("INSERT INTO n VALUES (2)")
                await conn.execute("CREATE UNIQUE INDEX ON n (v)")
                await conn.execute("INSERT INTO n VALUES (1)")
        await conn.execute("INSERT INTO n VALUES (3)")  # the outer transaction goes on
        with pytest.raises(ValueError, match="savepoint"):
            async with conn.transaction("serializable"):
                pass
    assert sorted(r[0] for r in await conn.fetch("SELECT v FROM n")) == [1, 3]
    with pytest.raises(ValueError, match="isolation must be one of"):
        async with conn.transaction("snapshot"):
            pass


@pytest.mark.parametrize(
    "text",
    [
        "3d8c8392-6028-4700-9422-d15d4b5232cf",
        "3D8C8392602847009422D15D4B5232CF",
        "{3d8c8392-6028-4700-9422-d15d4b5232cf}",
        "urn:uuid:3d8c8392-6028-4700-9422-d15d4b5232cf",
    ],
)
def test_uuid_of_reads_what_the_stdlib_reads(text: str) -> None:
    parsed = uuid_of(text)
    assert isinstance(parsed, uuid.UUID)
    assert parsed == uuid.UUID(text) and hash(parsed) == hash(uuid.UUID(text))
    assert str(parsed) == str(uuid.UUID(text))


def test_uuid_of_16_bytes_and_of_nonsense() -> None:
    raw = bytes(range(16))
    assert uuid_of(raw) == uuid.UUID(bytes=raw)
    with pytest.raises(ValueError):
        uuid_of("not a uuid")


async def test_uuid_of_is_sent_and_read_back_as_a_uuid(conn: Connection) -> None:
    token = uuid_of(bytes(range(16)))
    assert await conn.fetchval("SELECT $1::uuid", token) == token
    assert await conn.fetchval("SELECT $1::uuid[]", [token, uuid.UUID(int=1)]) == [
        token,
        uuid.UUID(int=1),
    ]
