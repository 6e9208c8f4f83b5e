"""The engine service that ``python -m engine run`` runs.

Placeholder for this round: it opens the role pools, migrates (unless
``database.migrate_on_start`` is false), reports readiness and waits to be cancelled. The
services (producer, completer, elector, recovery, ...) are started here in dependency order in a
later round; the contract below stays.
"""

from __future__ import annotations

import logging

import trio

from engine.config import EngineConfig
from engine.db.database import DatabaseUrls, open_database
from engine.db.dsn import redact
from engine.db.resolve import migrate_databases

__all__ = ["run_service"]

log = logging.getLogger(__name__)


async def run_service(
    config: EngineConfig,
    urls: DatabaseUrls,
    *,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Run the engine against the databases at ``urls`` until cancelled.

    Calls ``task_status.started()`` once the service is ready (pools open, migrations applied),
    so ``await nursery.start(run_service, config, urls)`` returns only then; the CLI prints its
    "running" line at that point. Only returns when cancelled; any error escapes and ends the
    process with a non-zero status.

    Raises:
        ConnectionLost: the database could not be reached after ``database.connect_attempts``.
        MigrationError: a migration failed.
    """
    db_config = config.database
    async with open_database(
        urls,
        min_size=db_config.pool_min_size,
        max_size=db_config.pool_max_size,
        statement_cache_size=db_config.statement_cache_size,
        lock_timeout=db_config.lock_timeout,
        command_timeout=db_config.command_timeout,
        attempts=db_config.connect_attempts,
        retry_delay=db_config.connect_retry_delay,
    ) as db:
        if db_config.migrate_on_start:
            await migrate_databases(db)
        log.info(
            "service started",
            extra={"event": "service_started", "url": redact(urls.tasks)},
        )
        task_status.started()
        await trio.sleep_forever()
