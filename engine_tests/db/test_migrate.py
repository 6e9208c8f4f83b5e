"""Migrations: applied in order, exactly once, also with several migrators at once."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
import trio

from engine.db.bridge import Connection, connect
from engine.db.migrate import migrate, pending_migrations
from engine.db.resolve import scratch_database
from engine.db.sqlfiles import load_migrations
from engine.errors import MigrationError


@pytest.fixture
async def empty_url(pg_admin_url: str, aio_loop: None) -> AsyncIterator[str]:
    async with scratch_database(pg_admin_url, "engine_e_", migrated=False) as url:
        yield url


@pytest.fixture
async def empty(empty_url: str) -> AsyncIterator[Connection]:
    """A connection to the empty database."""
    conn = await connect(empty_url)
    try:
        yield conn
    finally:
        await conn.close()


async def _river_migrated_to(conn: Connection, version: int) -> None:
    """What River's own migrator leaves behind, reduced to what the check looks at."""
    await conn.execute(
        "CREATE TABLE river_migration (line text, version bigint, created_at timestamptz)"
    )
    await conn.execute("INSERT INTO river_migration VALUES ('main', $1, now())", version)


async def test_migrate_applies_everything_once_then_nothing(empty: Connection) -> None:
    assert len(await pending_migrations(empty)) == len(load_migrations())
    first = await migrate(empty)
    assert first.applied == tuple(m.version for m in load_migrations())
    second = await migrate(empty)
    assert second.applied == ()
    assert second.already == first.applied
    assert await pending_migrations(empty) == []


async def test_three_concurrent_migrators_apply_each_migration_once(empty_url: str) -> None:
    reports = []

    async def one() -> None:
        conn = await connect(empty_url)
        try:
            reports.append(await migrate(conn))
        finally:
            await conn.close()

    async with trio.open_nursery() as nursery:
        for _ in range(3):
            nursery.start_soon(one)
    applied = [v for r in reports for v in r.applied]
    assert sorted(applied) == [m.version for m in load_migrations()]
    conn = await connect(empty_url)
    try:
        rows = await conn.fetch("SELECT version, count(*) FROM engine_migration GROUP BY 1")
        assert all(r[1] == 1 for r in rows)
        assert len(rows) == len(load_migrations())
    finally:
        await conn.close()


async def test_existing_river_schema_is_used_as_is(empty: Connection) -> None:
    await _river_migrated_to(empty, 6)
    report = await migrate(empty)
    assert 1 in report.skipped
    assert await empty.fetchval("SELECT to_regclass('river_job') IS NULL")


async def test_rivers_own_indexes_are_left_alone(empty: Connection) -> None:
    await _river_migrated_to(empty, 6)
    await empty.execute(
        "CREATE TABLE river_job (id bigserial PRIMARY KEY, kind text NOT NULL);"
        "CREATE INDEX river_job_kind ON river_job (kind)"
    )
    await migrate(empty)
    assert await empty.fetchval("SELECT to_regclass('river_job_kind') IS NOT NULL")


async def test_the_schema_engine_creates_has_no_kind_index(empty: Connection) -> None:
    await migrate(empty)
    assert await empty.fetchval("SELECT to_regclass('river_job_kind') IS NULL")
    assert await empty.fetchval("SELECT to_regclass('river_job_pkey') IS NOT NULL")


async def test_old_river_schema_is_refused_with_a_clear_error(empty: Connection) -> None:
    await _river_migrated_to(empty, 4)
    with pytest.raises(MigrationError, match=r"River's schema at version 4.*version 6"):
        await migrate(empty)


async def test_the_schema_engine_creates_is_at_rivers_latest_version(empty: Connection) -> None:
    await migrate(empty)
    versions = [r[0] for r in await empty.fetch("SELECT version FROM river_migration ORDER BY 1")]
    assert versions == list(range(1, 8))
    # What River's migration 7 leaves: its notification outbox, and no river_client tables.
    assert await empty.fetchval("SELECT to_regclass('river_notification_topic_id_idx') IS NOT NULL")
    assert await empty.fetchval("SELECT to_regclass('river_client') IS NULL")
    assert await empty.fetchval("SELECT to_regclass('river_client_queue') IS NULL")
    default = await empty.fetchval(
        "SELECT column_default FROM information_schema.columns"
        " WHERE table_name = 'river_job' AND column_name = 'max_attempts'"
    )
    assert default == "25"


@pytest.mark.parametrize("version", [6, 7])
async def test_an_existing_river_schema_at_6_or_7_stays_at_its_version(
    empty: Connection, version: int
) -> None:
    await _river_migrated_to(empty, version)
    report = await migrate(empty)
    assert 1 in report.skipped
    assert await empty.fetchval("SELECT max(version) FROM river_migration") == version
    assert await empty.fetchval("SELECT to_regclass('river_notification') IS NULL")


async def test_rivers_migrator_having_moved_our_schema_to_7_is_accepted(empty: Connection) -> None:
    """Our schema at 6 that River's own migrator then moved to 7 (as before migration 0010):
    0010 finds version 7 recorded and changes nothing (it would fail creating the tables)."""
    await migrate(empty)
    await empty.execute("DELETE FROM engine_migration WHERE version = 10")
    report = await migrate(empty)
    assert report.applied == (10,)
    assert await empty.fetchval("SELECT count(*) FROM river_migration WHERE version = 7") == 1


async def test_river_indexes_are_built_on_request_and_an_invalid_one_rebuilt(
    empty: Connection,
) -> None:
    first = await migrate(empty)
    assert first.indexes_created == ()
    assert await empty.fetchval("SELECT to_regclass('river_job_args_index') IS NULL")
    # A concurrent build that failed half-way leaves its index invalid: mark one so.
    await empty.execute("CREATE INDEX river_job_kind ON river_job (kind)")
    await empty.execute(
        "UPDATE pg_index SET indisvalid = false WHERE indexrelid = 'river_job_kind'::regclass"
    )
    report = await migrate(empty, river_indexes=True)
    assert report.indexes_created == (
        "river_job_args_index",
        "river_job_kind",
        "river_job_metadata_index",
    )
    valid = await empty.fetch(
        "SELECT indexrelid::regclass::text AS name, indisvalid FROM pg_index"
        " WHERE indrelid = 'river_job'::regclass AND indexrelid::regclass::text = ANY($1)",
        list(report.indexes_created),
    )
    assert sorted((r["name"], r["indisvalid"]) for r in valid) == [
        ("river_job_args_index", True),
        ("river_job_kind", True),
        ("river_job_metadata_index", True),
    ]
    again = await migrate(empty, river_indexes=True)
    assert again.indexes_created == ()
