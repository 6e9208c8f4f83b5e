"""How the client commands open the engine: ``submit``, ``status``, ``tasks``, ``jobs``,
``queue``, ``models``, ``groups``, ``schedules``.

Every command opens the engine's records layer only (``engine.open(config, control=False)``: no
execution), does its reads or writes, and prints a human table (:mod:`engine.cli.render`: fit to
the terminal, statuses coloured, user data never interpreted as markup or control sequences),
or with ``--json`` (before or after the command) one JSON document on one line for scripts
(:mod:`engine.cli.formats`). Each command group's module documents its commands and their
``--json`` documents: :mod:`engine.cli.status` (``status``, ``schedules list``),
:mod:`engine.cli.tasks`, :mod:`engine.cli.queue` (``jobs list``, ``queue pause|resume``),
:mod:`engine.cli.models` (``models``, ``groups``) and :mod:`engine.cli.submit`.

Where the database is, and what a command may change there:

* They never create an embedded cluster. With no ``database.url``, ``data_dir`` must hold one
  already (``python -m engine db start`` or ``run`` made it); otherwise the command says that no
  engine data directory exists at that path and how to make one, creates nothing, and exits 2.
  An existing cluster whose server is stopped is started for the command and stopped after it
  (unless another process uses it), as every engine process does.
* The read-only commands (``status``, ``tasks list``, ``tasks show``, ``jobs list``, ``models
  list``, ``groups list``, ``schedules list``) never migrate: if the schema is behind (a
  database never migrated, or an engine upgrade not applied yet) they say so, suggest
  ``python -m engine migrate`` and exit 1, with the database unchanged. The commands that write
  (``submit``, ``tasks cancel|retry|resolve``, ``queue``, ``models set|delete``, ``groups
  set|delete``) migrate first as the service does, unless ``database.migrate_on_start`` is
  false.

Errors are engine errors, reported by :func:`engine.cli.main.main` as ``engine: error: ...`` with
exit status 1 (``no task <id>`` for an unknown task id); a malformed option is a usage error
(exit 2).
"""

from __future__ import annotations

import argparse
import getpass
import importlib
import socket
from collections.abc import Awaitable, Callable

import attrs
import trio

from engine.config import EngineConfig
from engine.db.bridge import asyncio_loop
from engine.db.database import DatabaseUrls, open_database
from engine.db.dsn import redact
from engine.db.migrate import pending_migrations
from engine.db.resolve import open_urls
from engine.errors import MigrationError
from engine.service.engine import Engine
from engine.service.root import open as open_engine

__all__ = [
    "EngineCommand",
    "check_schema",
    "default_actor",
    "run_engine_command",
    "run_with_engine",
]

#: The body of an inspection command: given an open client-only engine, print, return the status.
EngineCommand = Callable[[Engine, argparse.Namespace], Awaitable[int]]


async def check_schema(config: EngineConfig, urls: DatabaseUrls) -> None:
    """Refuse a database whose schema is behind, without changing it (read-only commands).

    Raises:
        MigrationError: migrations are pending on one of the databases; the message names them
            and ``python -m engine migrate``.
        DatabaseError: the database cannot be reached.
    """
    async with open_database(
        urls, config.database, min_size=1, max_size=1, application_name="engine-cli"
    ) as db:
        for pool in db.distinct_pools():
            async with pool.acquire() as conn:
                pending = await pending_migrations(conn)
            if pending:
                names = ", ".join(f"{m.version:04d}_{m.name}" for m in pending[:3])
                more = f" and {len(pending) - 3} more" if len(pending) > 3 else ""
                raise MigrationError(
                    f"the schema of {redact(pool.dsn)} is behind: {len(pending)} migration(s) "
                    f"not applied ({names}{more}). Read-only commands never migrate: run "
                    "`python -m engine migrate` (or `python -m engine run`) first"
                )


def run_with_engine(
    config: EngineConfig, body: Callable[[Engine], Awaitable[int]], *, readonly: bool = False
) -> int:
    """Open a client-only engine (no execution), run ``body`` with it, return its status.

    It never creates an embedded cluster (``open_urls(create_cluster=False)``); with
    ``readonly`` it never migrates either (:func:`check_schema` refuses a schema behind).
    Errors escape to :func:`engine.cli.main.main`, which reports them; Ctrl-C ends the command
    with ``KeyboardInterrupt`` (exit 130) after the engine closed.
    """
    if readonly:
        config = attrs.evolve(
            config, database=attrs.evolve(config.database, migrate_on_start=False)
        )

    async def main() -> int:
        async with (
            asyncio_loop(),
            open_urls(config.database, config.data_dir, create_cluster=False) as urls,
        ):
            if readonly:
                await check_schema(config, urls)
            async with open_engine(config, control=False, urls=urls) as eng:
                return await body(eng)

    return trio.run(main)


def run_engine_command(args: argparse.Namespace, config: EngineConfig) -> int:
    """Run an inspection command with a client-only engine: its body ``args.engine_command``
    (``(module, name)``, an :data:`EngineCommand`, set by :mod:`engine.cli.commands` and
    imported now); ``args.readonly`` says it only reads."""
    module, name = args.engine_command
    command: EngineCommand = getattr(importlib.import_module(module), name)
    return run_with_engine(config, lambda eng: command(eng, args), readonly=bool(args.readonly))


def default_actor() -> str:
    """Who runs this command, for the events it records: ``user@host``."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = "unknown"
    return f"{user}@{socket.gethostname()}"
