"""Test fixtures: one real PostgreSQL per session, a fresh database per test.

``ENGINE_TEST_DATABASE_URL`` points the suite at an existing server (a superuser URL: tests
create databases); otherwise one embedded server starts for the session with fsync off, from the
binaries in ``ENGINE_TEST_PG_BINDIR`` when set (``/usr/lib/postgresql/15/bin``: the suite on
Debian's PostgreSQL 15), else the embedded PostgreSQL. A
template database is migrated once; each test gets ``CREATE DATABASE ... TEMPLATE``, so tests are
isolated and cheap (tens of milliseconds each).
"""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import asyncpg
import pytest
import trio

from engine import embedded
from engine.db.bridge import Connection, asyncio_loop, connect
from engine.db.database import Database, DatabaseUrls, open_database
from engine.db.dsn import replace_database
from engine.db.migrate import migrate
from engine.db.resolve import scratch_database


def _make_data_dir() -> Path:
    # Our own directory, traversable by the unprivileged server user when we run as root.
    path = Path(tempfile.mkdtemp(prefix="engine-test-pg-"))
    path.chmod(0o755)
    return path


@pytest.fixture(scope="session")
def pg_admin_url() -> Iterator[str]:
    """A superuser URL of the session's server."""
    url = os.environ.get("ENGINE_TEST_DATABASE_URL")
    if url:
        yield url
        return
    data_dir = _make_data_dir()
    bindir = os.environ.get("ENGINE_TEST_PG_BINDIR") or None
    server = embedded.acquire(data_dir, unsafe_fast=True, bindir=bindir)
    try:
        yield server.dsn("postgres")
    finally:
        server.release()
        shutil.rmtree(data_dir, ignore_errors=True)


@pytest.fixture(scope="session")
def template_db(pg_admin_url: str) -> Iterator[str]:
    """The name of a migrated template database, made once per session."""
    name = f"engine_tmpl_{uuid.uuid4().hex[:8]}"

    async def create() -> None:
        async with asyncio_loop():
            admin = await connect(pg_admin_url)
            try:
                await admin.execute(f'CREATE DATABASE "{name}"')
            finally:
                await admin.close()
            conn = await connect(replace_database(pg_admin_url, name))
            try:
                await migrate(conn)
            finally:
                await conn.close()

    trio.run(create)
    yield name

    async def drop() -> None:
        admin = await asyncpg.connect(pg_admin_url)
        try:
            await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        finally:
            await admin.close()

    asyncio.run(drop())


@pytest.fixture
async def aio_loop() -> AsyncIterator[None]:
    """The trio-asyncio loop every database call in a test runs through."""
    async with asyncio_loop():
        yield


@pytest.fixture
async def db_url(pg_admin_url: str, template_db: str, aio_loop: None) -> AsyncIterator[str]:
    """A fresh, migrated database for this test; dropped afterwards."""
    async with scratch_database(pg_admin_url, "engine_t_", template=template_db) as url:
        yield url


@pytest.fixture
async def database(db_url: str) -> AsyncIterator[Database]:
    """Open role pools on this test's database; fails the test if a connection leaked."""
    async with open_database(DatabaseUrls.single(db_url), max_size=10) as db:
        yield db
        leaked = {id(p): p.in_use() for p in db.distinct_pools()}
        assert sum(leaked.values()) == 0, f"pool connections still in use at teardown: {leaked}"


@pytest.fixture
async def conn(db_url: str) -> AsyncIterator[Connection]:
    """A dedicated connection to this test's database."""
    c = await connect(db_url)
    try:
        yield c
    finally:
        await c.close()


def pytest_report_header(config: pytest.Config) -> str:
    """Say which server the suite runs on."""
    if os.environ.get("ENGINE_TEST_DATABASE_URL"):
        return "PostgreSQL: ENGINE_TEST_DATABASE_URL"
    return f"PostgreSQL: {os.environ.get('ENGINE_TEST_PG_BINDIR') or 'embedded'}"


@pytest.fixture
def private_data_dir() -> Iterator[Path]:
    """A data directory for a test's own embedded server, in a directory the server's own user
    can enter (when we run as root, pytest's ``tmp_path`` is closed to it); removed after."""
    path = Path(tempfile.mkdtemp(prefix="engine-private-"))
    path.chmod(0o755)
    try:
        yield path / "pg"
    finally:
        shutil.rmtree(path, ignore_errors=True)
