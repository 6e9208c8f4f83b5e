"""The engine through PgBouncer in transaction pooling mode (``database.pooler``).

Every test runs a private PgBouncer (:mod:`engine.testing.pgbouncer`: Debian's ``pgbouncer``,
``pool_mode = transaction``) in front of the session's server, with ``default_pool_size`` server
connections per database, at most. Without the binary the tests are skipped; CI installs it.
"""

from __future__ import annotations

import os
import sys
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
import trio

from engine.cli.main import main as cli_main
from engine.config import config_problems_exit_code, load_config
from engine.db.bridge import Connection, connect
from engine.db.config import DatabaseConfig
from engine.db.database import DatabaseUrls, open_database
from engine.db.listen import LISTEN_APPLICATION_NAME
from engine.db.migrate import pending_migrations
from engine.db.resolve import migrate_databases, scratch_database
from engine.domain.tasks import TaskStatus
from engine.errors import ConfigError, LockTimeout
from engine.service.engine import Engine
from engine.service.root import open as open_engine
from engine.testing.pgbouncer import (
    PGBOUNCER_INSTALL_HINT,
    PgBouncer,
    find_pgbouncer,
    open_pgbouncer,
)
from engine_tests.tasks.conftest import make_config, request

pytestmark = pytest.mark.skipif(
    find_pgbouncer() is None, reason=f"no pgbouncer binary: {PGBOUNCER_INSTALL_HINT}"
)

#: Server connections PgBouncer opens per database (and at most: max_db_connections).
SERVER_CONNECTIONS = 3


@pytest.fixture
async def bouncer(pg_admin_url: str, aio_loop: None) -> AsyncIterator[PgBouncer]:
    """A private PgBouncer in transaction mode in front of the session's server."""
    async with open_pgbouncer(pg_admin_url, default_pool_size=SERVER_CONNECTIONS) as running:
        yield running


async def _server_backends(direct: Connection) -> int:
    """Backends on the test's database other than ``direct`` and LISTEN connections: the
    server connections PgBouncer holds."""
    return int(
        await direct.fetchval(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
            " AND pid <> pg_backend_pid() AND backend_type = 'client backend'"
            " AND application_name <> $1",
            LISTEN_APPLICATION_NAME,
        )
    )


async def _listeners(direct: Connection) -> int:
    return int(
        await direct.fetchval(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
            " AND application_name = $1",
            LISTEN_APPLICATION_NAME,
        )
    )


async def _sample_while(
    busy: Callable[[], Awaitable[None]], sample: Callable[[], Awaitable[int]]
) -> tuple[int, int]:
    """Run ``busy``, calling ``sample`` every 5 ms meanwhile; (samples, highest value).

    The first sample is taken before ``busy`` starts its work, so at least one is taken
    however quickly ``busy`` finishes."""
    highest = samples = 0
    async with trio.open_nursery() as nursery:

        async def sampler(task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
            nonlocal highest, samples
            while True:
                highest = max(highest, await sample())
                samples += 1
                if samples == 1:
                    task_status.started()
                await trio.sleep(0.005)

        await nursery.start(sampler)
        await busy()
        nursery.cancel_scope.cancel()
    return samples, highest


@pytest.mark.parametrize("listen", [True, False], ids=["listen_url", "polling"])
async def test_tasks_run_through_pgbouncer_on_fewer_server_connections(
    bouncer: PgBouncer, db_url: str, listen: bool
) -> None:
    """30 concurrent tasks on a pool of 8 client connections share PgBouncer's 3 server
    connections, and all succeed: with LISTEN on a direct URL, and without it (polling)."""
    settings: dict[str, Any] = {
        "database.pooler": "transaction",
        "database.pool_min_size": 8,
        "database.pool_max_size": 10,
        "database.lock_timeout": 5,
        "worker.hard_limit": 30,
    }
    if listen:
        settings["database.listen_url"] = db_url
    direct = await connect(db_url)
    try:
        async with open_engine(
            make_config(**settings), urls=DatabaseUrls.single(bouncer.url_for(db_url))
        ) as eng:
            await eng.set_model("sim-model")
            pool = eng.db.tasks
            assert pool.pooler == "transaction" and pool.size() >= 8
            assert pool.listen_dsn == (db_url if listen else None)
            ids: list[uuid.UUID] = []

            async def run_all() -> None:
                submitted = await eng.submit([request() for _ in range(30)])
                ids.extend(submitted)
                with trio.fail_after(60):
                    for task_id in ids:
                        await eng.wait(task_id)

            samples, most = await _sample_while(run_all, lambda: _server_backends(direct))
            statuses = {(await _final(eng, i)).status for i in ids}
            listeners = await _listeners(direct)
    finally:
        await direct.close()
    assert statuses == {TaskStatus.SUCCEEDED}
    # More client connections than server connections, all busy at once: PgBouncer
    # multiplexed them (it never opens more than SERVER_CONNECTIONS).
    assert samples >= 2 and 1 <= most <= SERVER_CONNECTIONS, (samples, most)
    if listen:
        assert listeners == 1  # the process's one LISTEN connection, on listen_url
    else:
        assert listeners == 0


async def _final(eng: Engine, task_id: uuid.UUID) -> Any:
    task = await eng.get(task_id)
    assert task is not None
    return task


async def test_an_insert_notification_arrives_on_listen_url(
    bouncer: PgBouncer, db_url: str
) -> None:
    """With producers polling only every 30 s, a task runs at once: the insert NOTIFY reached
    the engine's LISTEN connection on ``listen_url`` (and its finish woke ``wait``)."""
    config = make_config(
        **{
            "database.pooler": "transaction",
            "database.listen_url": db_url,
            "queue.fetch_poll_interval": 30,
        }
    )
    async with open_engine(config, urls=DatabaseUrls.single(bouncer.url_for(db_url))) as eng:
        await eng.set_model("sim-model")
        # The producers' first fetch found nothing; only a notification wakes them now.
        await trio.sleep(0.5)
        [task_id] = await eng.submit([request()])
        with trio.fail_after(5):
            done = await eng.wait(task_id)
    assert done.status == TaskStatus.SUCCEEDED


async def test_lock_timeout_applies_per_transaction_through_the_pooler(
    pg_admin_url: str, db_url: str, aio_loop: None
) -> None:
    """``lock_timeout`` reaches every statement through PgBouncer (in a transaction and
    outside one), and is gone from the server connection once the transaction ends, while a
    session ``SET`` would stay there for the next client."""
    async with open_pgbouncer(pg_admin_url, default_pool_size=1) as single:
        pooled_url = single.url_for(db_url)
        holder = await connect(db_url)
        plain = await connect(pooled_url, statement_cache_size=0)
        try:
            await holder.execute("CREATE TABLE locked_row (id int PRIMARY KEY)")
            await holder.execute("INSERT INTO locked_row VALUES (1)")
            async with open_database(
                DatabaseUrls.single(pooled_url),
                DatabaseConfig(pooler="transaction", lock_timeout=0.2, migrate_on_start=False),
                max_size=2,
            ) as db:
                async with holder.transaction():
                    await holder.execute("SELECT id FROM locked_row FOR UPDATE")
                    with trio.fail_after(5):
                        with pytest.raises(LockTimeout):
                            await db.tasks.execute("UPDATE locked_row SET id = 1")
                        with pytest.raises(LockTimeout):
                            async with db.tasks.transaction() as tx:
                                await tx.execute("UPDATE locked_row SET id = 1")
                async with db.tasks.transaction() as tx:
                    inside = await tx.fetchval("SELECT current_setting('lock_timeout')")
                    engine_pid = await tx.fetchval("SELECT pg_backend_pid()")
                # The next client on the same (only) server connection sees no lock_timeout.
                after = await plain.fetchval("SELECT current_setting('lock_timeout')")
                plain_pid = await plain.fetchval("SELECT pg_backend_pid()")
            assert inside == "200ms"
            assert (plain_pid, after) == (engine_pid, "0")
            # Why it matters: a session setting stays on the shared server connection.
            await plain.execute("SET lock_timeout = '1s'")
            other = await connect(pooled_url, statement_cache_size=0)
            try:
                leaked = await other.fetchval("SELECT current_setting('lock_timeout')")
            finally:
                await other.close()
            assert leaked == "1s"
        finally:
            await plain.close()
            await holder.close()


async def test_migrations_run_on_the_direct_url(
    bouncer: PgBouncer, pg_admin_url: str, aio_loop: None
) -> None:
    """Behind the pooler, ``migrate_databases`` migrates over ``listen_url``; without one it
    refuses with a ConfigError naming the setting."""
    async with scratch_database(pg_admin_url, "engine_t_", migrated=False) as empty_url:
        pooled = DatabaseUrls.single(bouncer.url_for(empty_url))
        # No listen_url: migrate_on_start must be off, but migrate_databases may be called.
        no_direct_url = DatabaseConfig(pooler="transaction", migrate_on_start=False)
        async with open_database(pooled, no_direct_url, max_size=2) as db:
            with pytest.raises(ConfigError, match=r"database\.listen_url"):
                await migrate_databases(db)
        async with open_database(
            pooled, DatabaseConfig(pooler="transaction", listen_url=empty_url), max_size=2
        ) as db:
            [(where, report)] = await migrate_databases(db)
            assert report.applied and where == empty_url
            async with db.tasks.acquire() as conn:
                assert await pending_migrations(conn) == []


async def test_listen_url_of_another_database_is_refused(
    bouncer: PgBouncer, pg_admin_url: str, db_url: str
) -> None:
    async with scratch_database(pg_admin_url, "engine_t_", migrated=False) as other_url:
        with pytest.raises(ConfigError, match=r"database\.listen_url .* another database"):
            async with open_database(
                DatabaseUrls.single(bouncer.url_for(db_url)),
                DatabaseConfig(pooler="transaction", listen_url=other_url),
            ):
                pass


def test_transaction_pooler_without_a_direct_url_cannot_migrate_on_start() -> None:
    settings = {"database.url": "postgresql://u@pgbouncer:6432/engine"}
    with pytest.raises(ConfigError) as raised:
        load_config(env={}, overrides={**settings, "database.pooler": "transaction"})
    text = str(raised.value)
    assert "database.listen_url" in text and "database.migrate_on_start" in text
    # Either fix is accepted.
    load_config(
        env={},
        overrides={
            **settings,
            "database.pooler": "transaction",
            "database.migrate_on_start": "false",
        },
    )
    load_config(
        env={},
        overrides={
            **settings,
            "database.pooler": "transaction",
            "database.listen_url": "postgresql://u@db:5432/engine",
        },
    )


def test_cli_exits_2_on_the_inconsistent_combination(capsys: pytest.CaptureFixture[str]) -> None:
    code = cli_main(
        [
            "--database-url",
            "postgresql://u@127.0.0.1:1/engine",
            "--set",
            "database.pooler=transaction",
            "migrate",
        ]
    )
    assert code == config_problems_exit_code == 2
    assert "database.listen_url" in capsys.readouterr().err


async def test_cli_migrates_through_the_pooler_with_listen_url(
    bouncer: PgBouncer, pg_admin_url: str, aio_loop: None
) -> None:
    async with scratch_database(pg_admin_url, "engine_t_", migrated=False) as empty_url:
        argv = [
            sys.executable,
            "-m",
            "engine",
            "--database-url",
            bouncer.url_for(empty_url),
            "--set",
            "database.pooler=transaction",
            "--set",
            f"database.listen_url={empty_url}",
            "migrate",
        ]
        # A process of its own: the CLI runs trio and listens for signals in its main thread.
        env = {k: v for k, v in os.environ.items() if not k.startswith("ENGINE_")}
        done = await trio.run_process(argv, env=env, capture_stderr=True, check=False)
        assert done.returncode == 0, done.stderr.decode(errors="replace")
        conn = await connect(empty_url)
        try:
            assert await pending_migrations(conn) == []
        finally:
            await conn.close()
