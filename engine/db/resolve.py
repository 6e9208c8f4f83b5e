"""Where the engine's database is: a configured URL, or the embedded server in ``data_dir``.

:func:`database_urls` (blocking) and :func:`open_urls` (async, for trio code) turn the
``[database]`` section (:class:`~engine.db.config.DatabaseConfig`) and the top-level
``data_dir`` setting into :class:`~engine.db.database.DatabaseUrls`:

* ``database.url`` set: the three role URLs come from ``database.tasks_url`` /
  ``coordination_url`` / ``queue_url``, each defaulting to ``database.url``. Nothing is started
  and nothing is created: an external database is the operator's to provision.
* ``database.url`` unset: the embedded server in ``data_dir`` (default
  :func:`~engine.embedded.default_data_dir`) is held for the block, the database
  :data:`ENGINE_DATABASE` is created on it if missing, and all three roles use it. The role URLs
  ``tasks_url`` etc. are ignored then: they only make sense next to an external ``url``.
  Leaving the block releases the server, which stops it when this was the last process holding
  it and ``engine db start`` did not pin it.

:func:`migrate_databases` brings every distinct database of an open
:class:`~engine.db.database.Database` up to date; ``engine migrate`` and the service both use it.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import threading
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Final

import trio

from engine import embedded
from engine.db.bridge import asyncio_loop, connect
from engine.db.config import DatabaseConfig
from engine.db.database import Database, DatabaseUrls
from engine.db.dsn import redact, replace_database
from engine.db.migrate import MigrationReport, migrate
from engine.errors import ConfigError, DatabaseError, DataDirError, UniqueViolation

__all__ = [
    "ENGINE_DATABASE",
    "database_urls",
    "embedded_data_dir",
    "ensure_database",
    "ensure_database_blocking",
    "existing_cluster",
    "external_urls",
    "migrate_databases",
    "open_urls",
    "quote_identifier",
    "scratch_database",
]

log = logging.getLogger(__name__)

#: Name of the database engine creates and uses on its embedded server.
ENGINE_DATABASE: Final = "engine"

# SQLSTATE 42P04: CREATE DATABASE of a name that exists. A concurrent CREATE DATABASE of the
# same name can instead fail on pg_database's unique index (23505), depending on timing.
_DUPLICATE_DATABASE: Final = "42P04"


def quote_identifier(name: str) -> str:
    """``name`` as a double-quoted SQL identifier, inner double quotes doubled."""
    return '"' + name.replace('"', '""') + '"'


def external_urls(db: DatabaseConfig) -> DatabaseUrls | None:
    """The role URLs when ``database.url`` is set, else None (the embedded server is used)."""
    if not db.url:
        return None
    return DatabaseUrls(
        tasks=db.tasks_url or db.url,
        coordination=db.coordination_url or db.url,
        queue=db.queue_url or db.url,
    )


def embedded_data_dir(data_dir: Path | None) -> Path:
    """The embedded server's data directory: ``data_dir`` (the setting) or the platform
    default."""
    return data_dir or embedded.default_data_dir()


def existing_cluster(data_dir: Path) -> None:
    """Check that ``data_dir`` holds an embedded cluster already, for the commands that must
    never create one (a typo in ``data_dir`` would otherwise get a new, empty cluster).

    Raises:
        DataDirError: no engine data directory (or no cluster in it) at ``data_dir``; the
            message says how to create one.
    """
    data_dir = Path(data_dir).expanduser().resolve()
    # The embedded module's layout: its marker file and the cluster's PG_VERSION.
    if (data_dir / "engine-pg.json").is_file() and (data_dir / "pgdata" / "PG_VERSION").is_file():
        return
    what = "directory" if not data_dir.exists() else "cluster"
    raise DataDirError(
        f"no engine data {what} at {data_dir}: nothing was created. Create one with "
        "`python -m engine db start` (or `python -m engine run`), fix data_dir "
        "(--data-dir, ENGINE_DATA_DIR), or point database.url (--database-url, "
        "ENGINE_DATABASE_URL) at a server"
    )


@contextlib.asynccontextmanager
async def scratch_database(
    admin_url: str,
    prefix: str,
    *,
    migrated: bool = True,
    template: str | None = None,
    application_name: str = "engine",
) -> AsyncIterator[str]:
    """Yield the URL of a new database on ``admin_url``'s server, named ``prefix`` plus a random
    suffix: a copy of ``template``, else empty and migrated unless ``migrated`` is False.
    Dropped on exit (shielded, bounded), whatever connections are still open on it."""
    name = f"{prefix}{uuid.uuid4().hex[:12]}"
    source = "" if template is None else f" TEMPLATE {quote_identifier(template)}"
    admin = await connect(admin_url, application_name=application_name)
    try:
        await admin.execute(f"CREATE DATABASE {quote_identifier(name)}{source}")
    finally:
        await admin.close()
    url = replace_database(admin_url, name)
    try:
        if migrated and template is None:
            conn = await connect(url, application_name=application_name)
            try:
                await migrate(conn)
            finally:
                await conn.close()
        yield url
    finally:
        with trio.CancelScope(shield=True), trio.move_on_after(30):
            admin = await connect(admin_url, application_name=application_name)
            try:
                await admin.execute(
                    f"DROP DATABASE IF EXISTS {quote_identifier(name)} WITH (FORCE)"
                )
            finally:
                await admin.close()


async def ensure_database(admin_dsn: str, name: str) -> None:
    """Create database ``name`` through ``admin_dsn`` unless it exists.

    Safe against concurrent creators: another process creating it between our check and our
    ``CREATE DATABASE`` counts as success. Opens a trio-asyncio loop if none is open.

    Raises:
        DatabaseError: the server cannot be reached (``ConnectionLost``) or refused the creation
            (for example, the role lacks CREATEDB).
    """
    async with asyncio_loop():
        conn = await connect(admin_dsn, application_name="engine-setup")
        try:
            if await conn.fetchval("SELECT 1 FROM pg_database WHERE datname = $1", name):
                return
            try:
                await conn.execute(f"CREATE DATABASE {quote_identifier(name)}")
            except DatabaseError as exc:
                if not (isinstance(exc, UniqueViolation) or exc.sqlstate == _DUPLICATE_DATABASE):
                    raise
                return  # a concurrent creator won
            log.info(
                "created database",
                extra={"event": "database_created", "database": name, "url": redact(admin_dsn)},
            )
        finally:
            await conn.close()


def ensure_database_blocking(admin_dsn: str, name: str) -> None:
    """Blocking :func:`ensure_database`, for code outside trio (or in a worker thread).

    It runs its own ``trio.run`` in a new thread: a new thread starts with an empty context, so
    an enclosing trio-asyncio loop (a context variable) is never reused from the wrong thread.
    """
    _run_in_new_thread(functools.partial(trio.run, ensure_database, admin_dsn, name))


def _run_in_new_thread(fn: Callable[[], object]) -> None:
    error: list[BaseException] = []

    def target() -> None:
        try:
            fn()
        except BaseException as exc:
            error.append(exc)

    thread = threading.Thread(target=target, name="engine-ensure-database")
    thread.start()
    thread.join()
    if error:
        raise error[0]


@contextlib.contextmanager
def database_urls(db: DatabaseConfig, data_dir: Path | None) -> Iterator[DatabaseUrls]:
    """Resolve the database of the ``[database]`` section ``db`` and the ``data_dir`` setting
    for the ``with`` block (blocking; see the module docstring).

    With the embedded server, it is acquired (started if needed) before the block and released
    after it, and the database :data:`ENGINE_DATABASE` exists when the block starts. Call it
    before ``trio.run`` or from a worker thread; trio code uses :func:`open_urls`.

    Raises:
        EmbeddedPostgresError: the embedded server could not be found, started or used.
        DatabaseError: the ``engine`` database could not be created.
    """
    urls = external_urls(db)
    if urls is not None:
        yield urls
        return
    with embedded.embedded_server(embedded_data_dir(data_dir)) as server:
        ensure_database_blocking(server.dsn("postgres"), ENGINE_DATABASE)
        yield DatabaseUrls.single(server.dsn(ENGINE_DATABASE))


@contextlib.asynccontextmanager
async def open_urls(
    db: DatabaseConfig, data_dir: Path | None, *, create_cluster: bool = True
) -> AsyncIterator[DatabaseUrls]:
    """Async :func:`database_urls` for trio code: the blocking start and stop run in threads.

    ``create_cluster=False`` (the command line's client commands) starts an embedded cluster
    that exists but never creates one: :func:`existing_cluster` raises first.

    Cancellation while the server starts waits for the start to finish (a half-started server
    is not left behind), and the release at the end runs shielded, so a cancelled block still
    stops a server nobody else holds.

    Raises:
        EmbeddedPostgresError: the embedded server could not be found, started or used.
        DatabaseError: the ``engine`` database could not be created.
    """
    urls = external_urls(db)
    if urls is not None:
        yield urls
        return
    directory = embedded_data_dir(data_dir)
    if not create_cluster:
        await trio.to_thread.run_sync(existing_cluster, directory)
    server = await trio.to_thread.run_sync(embedded.acquire, directory)
    try:
        log.info(
            "using the embedded PostgreSQL server",
            extra={"event": "embedded_server_acquired", "data_dir": str(directory),
                   "port": server.port},
        )  # fmt: skip
        await ensure_database(server.dsn("postgres"), ENGINE_DATABASE)
        yield DatabaseUrls.single(server.dsn(ENGINE_DATABASE))
    finally:
        # Shielded: stopping a server that only we held must happen even when cancelled. Not
        # bounded here: pg_ctl stop has its own timeout inside embedded.
        with trio.CancelScope(shield=True):
            await trio.to_thread.run_sync(server.release)


async def migrate_databases(
    db: Database, *, river_indexes: bool = False
) -> list[tuple[str, MigrationReport]]:
    """Migrate each distinct database of ``db``; return (redacted URL, report) per database.
    ``river_indexes``: also build River's optional indexes (``queue.river_indexes``).

    Every role's database gets the full schema, so a separate coordination database has the
    tables it needs; one shared database is migrated once. Behind a transaction pooler the
    migrator runs on a connection of the pool's direct URL (``database.listen_url``): its
    advisory lock spans several transactions.

    Raises:
        MigrationError: a migration failed.
        DatabaseError: the database failed underneath.
        ConfigError: a pool is behind a transaction pooler and has no direct URL.
    """
    reports: list[tuple[str, MigrationReport]] = []
    done: set[str] = set()
    for pool in db.distinct_pools():
        if pool.pooler == "none":
            target = pool.dsn
            async with pool.acquire() as conn:
                report = await migrate(conn, river_indexes=river_indexes)
        else:
            if pool.listen_dsn is None:
                raise ConfigError(
                    [
                        f"cannot migrate {redact(pool.dsn)} through a transaction pooler "
                        "(database.pooler): migrations hold an advisory lock across "
                        "transactions. Set database.listen_url to a direct URL of the database"
                    ]
                )
            target = pool.listen_dsn
            if target in done:
                continue
            direct = await connect(target, application_name="engine-migrate")
            try:
                report = await migrate(direct, river_indexes=river_indexes)
            finally:
                await direct.close()
        done.add(target)
        log.info(
            "migrated database",
            extra={
                "event": "database_migrated",
                "url": redact(target),
                "applied": list(report.applied),
                "skipped": list(report.skipped),
                "already": len(report.already),
                "indexes_created": list(report.indexes_created),
            },
        )
        reports.append((redact(target), report))
    return reports
