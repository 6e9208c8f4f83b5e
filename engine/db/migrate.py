"""Apply ``sql/migrations/`` in order, exactly once, even with many migrators at once.

Every migrator takes one session advisory lock, reads what is applied, and applies the rest each
in its own transaction, recording it in ``engine_migration``. River's own migrator takes no lock,
so pods migrating with it at once can race (the loser fails and must start again); with this
one they do not.

A migration whose first line is ``-- engine: skip_when_river_schema`` is recorded as skipped when
River's own schema (line ``main``, version 6 or later) is already in the database, so a River
application and engine share its tables as they are.

With ``river_indexes`` the migrator then builds, concurrently, the three indexes of River's
schema that engine leaves out (River's reindexer and River UI expect them); an index a failed
build left invalid is dropped and built again.
"""

from __future__ import annotations

import zlib

import attrs
import trio

from engine.db.bridge import RELEASE_TIMEOUT, Connection
from engine.db.sqlfiles import QUERIES, Migration, load_migrations
from engine.errors import DatabaseError, MigrationError

__all__ = [
    "MIGRATION_LOCK_KEY",
    "RIVER_INDEXES",
    "MigrationReport",
    "migrate",
    "pending_migrations",
]

#: Advisory lock key shared by every engine migrator (a stable hash of a fixed name).
MIGRATION_LOCK_KEY = zlib.crc32(b"engine.migrate")
_SKIP_DIRECTIVE = "-- engine: skip_when_river_schema"
_RIVER_MIN_VERSION = 6

_TABLE_CREATE = QUERIES["migration_table_create"]
_LOCK = QUERIES["migration_lock"]
_UNLOCK = QUERIES["migration_unlock"]
_GET_APPLIED = QUERIES["migration_get_applied"]
_INSERT = QUERIES["migration_insert"]
_RIVER_EXISTS = QUERIES["migration_river_table_exists"]
_RIVER_VERSION = QUERIES["migration_river_version"]
_INDEX_VALID = QUERIES["job_index_valid"]

#: River's indexes that engine's schema leaves out, each with the words of its named queries.
RIVER_INDEXES: dict[str, str] = {
    "river_job_args_index": "args",
    "river_job_kind": "kind",
    "river_job_metadata_index": "metadata",
}


@attrs.frozen
class MigrationReport:
    """What one :func:`migrate` call did."""

    applied: tuple[int, ...]
    skipped: tuple[int, ...]
    already: tuple[int, ...]
    indexes_created: tuple[str, ...] = ()


async def _river_version(conn: Connection) -> int | None:
    if not await conn.fetchval(_RIVER_EXISTS):
        return None
    version = await conn.fetchval(_RIVER_VERSION)
    return None if version is None else int(version)


async def pending_migrations(conn: Connection) -> list[Migration]:
    """Migrations not yet recorded (the table may not exist yet: then all of them)."""
    exists = await conn.fetchval("SELECT to_regclass('engine_migration') IS NOT NULL")
    done = {r["version"] for r in await conn.fetch(_GET_APPLIED)} if exists else set()
    return [m for m in load_migrations() if m.version not in done]


async def _create_river_indexes(conn: Connection) -> tuple[str, ...]:
    """Build each of :data:`RIVER_INDEXES` that is missing or invalid; return those built."""
    built: list[str] = []
    for name, word in RIVER_INDEXES.items():
        valid = await conn.fetchval(_INDEX_VALID, name)
        if valid:
            continue
        if valid is not None:  # left invalid by a build that failed half-way
            await conn.execute(QUERIES[f"job_index_drop_{word}"])
        await conn.execute(QUERIES[f"job_index_create_{word}"])
        built.append(name)
    return tuple(built)


async def migrate(conn: Connection, *, river_indexes: bool = False) -> MigrationReport:
    """Bring the database on ``conn`` up to the newest migration; with ``river_indexes``, also
    build River's optional indexes (the module docstring).

    Raises:
        MigrationError: a migration failed (its transaction is rolled back and nothing after it
            runs), or River's schema is present but older than version 6.
    """
    applied: list[int] = []
    skipped: list[int] = []
    await conn.execute(_LOCK, MIGRATION_LOCK_KEY)
    try:
        await conn.execute(_TABLE_CREATE)
        done = {r["version"] for r in await conn.fetch(_GET_APPLIED)}
        todo = [m for m in load_migrations() if m.version not in done]
        for migration in todo:
            skip = False
            if migration.sql.startswith(_SKIP_DIRECTIVE):
                river = await _river_version(conn)
                if river is not None and river < _RIVER_MIN_VERSION:
                    raise MigrationError(
                        f"this database holds River's schema at version {river}; engine needs "
                        f"version {_RIVER_MIN_VERSION} or later: run River's migrations first"
                    )
                skip = river is not None
            try:
                async with conn.transaction():
                    if not skip:
                        await conn.execute(migration.sql)
                    await conn.execute(_INSERT, migration.version, migration.name, skip)
            except DatabaseError as exc:
                raise MigrationError(
                    f"migration {migration.version:04d}_{migration.name} failed: {exc}"
                ) from exc
            (skipped if skip else applied).append(migration.version)
        built = await _create_river_indexes(conn) if river_indexes else ()
        return MigrationReport(tuple(applied), tuple(skipped), tuple(sorted(done)), built)
    finally:
        # Shielded: a cancelled migrator must not keep other migrators waiting on its lock.
        with trio.move_on_after(RELEASE_TIMEOUT, shield=True):
            if not conn.is_closed():
                await conn.execute(_UNLOCK, MIGRATION_LOCK_KEY)
