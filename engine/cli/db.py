"""``python -m engine db start|stop|status|url``: the embedded PostgreSQL server.

``db start`` starts it and pins it (it stays up after this process exits, until ``db stop``),
creates the ``engine`` database and prints its URL; ``db stop`` unpins it and stops it unless a
process (``engine run``) still uses it; ``db status [--json]`` describes it (exit 3 when it is
not running, as ``pg_ctl status``); ``db url`` prints a URL of the ``engine`` database that psql
accepts.

With ``database.url`` set, ``db url`` prints that URL unchanged (password included: it is for
your own tools) and exits 0, while ``db start``, ``db stop`` and ``db status`` explain that an
external server is configured and exit 2.
"""

from __future__ import annotations

import argparse
import json
import sys

from engine import embedded
from engine.cli.exits import EXIT_NOT_RUNNING, EXIT_OK, EXIT_USAGE
from engine.config import EngineConfig
from engine.db.dsn import redact, replace_database
from engine.db.resolve import ENGINE_DATABASE, embedded_data_dir, ensure_database_blocking

__all__ = ["run_db"]


def _external_server_error(config: EngineConfig, command: str) -> int:
    assert config.database.url is not None
    print(
        f"engine: error: `db {command}` manages the embedded PostgreSQL server, but "
        f"database.url is set ({redact(config.database.url)}), so the engine uses that "
        "external server. Unset database.url (ENGINE_DATABASE_URL, --database-url) to use the "
        "embedded server.",
        file=sys.stderr,
    )
    return EXIT_USAGE


def _db_start(config: EngineConfig) -> int:
    data_dir = embedded_data_dir(config.data_dir)
    server = embedded.acquire(data_dir, pin=True)
    ensure_database_blocking(server.dsn("postgres"), ENGINE_DATABASE)
    print(
        f"engine: the embedded PostgreSQL server in {server.data_dir} is running on port "
        f"{server.port}; it stays up until `db stop`.",
        file=sys.stderr,
    )
    print(server.dsn(ENGINE_DATABASE))
    return EXIT_OK


def _db_stop(config: EngineConfig) -> int:
    print(embedded.stop(embedded_data_dir(config.data_dir)))
    return EXIT_OK


def _db_status(config: EngineConfig, *, as_json: bool) -> int:
    st = embedded.status(embedded_data_dir(config.data_dir))
    url = (
        embedded.EmbeddedServer(st.data_dir, st.port).dsn(ENGINE_DATABASE)
        if st.running and st.port is not None
        else None
    )
    if as_json:
        data = {
            "data_dir": str(st.data_dir),
            "running": st.running,
            "port": st.port,
            "pid": st.pid,
            "pinned": st.pinned,
            "holders": st.holders,
            "url": url,
        }
        print(json.dumps(data))
    else:
        if st.running:
            print(f"embedded PostgreSQL server: running (pid {st.pid}, port {st.port})")
        else:
            print("embedded PostgreSQL server: not running")
        print(f"data directory: {st.data_dir}")
        if st.running:
            print(f"url: {url}")
            print("pinned: " + ("yes, until `db stop`" if st.pinned else "no"))
            users = ", ".join(str(p) for p in st.holders) or "none"
            print(f"used by processes: {users}")
    return EXIT_OK if st.running else EXIT_NOT_RUNNING


def _db_url(config: EngineConfig) -> int:
    if config.database.url:
        print(config.database.url)
        return EXIT_OK
    admin = embedded.url(embedded_data_dir(config.data_dir))  # raises if not running
    ensure_database_blocking(admin, ENGINE_DATABASE)
    print(replace_database(admin, ENGINE_DATABASE))
    return EXIT_OK


def run_db(args: argparse.Namespace, config: EngineConfig) -> int:
    """Run ``db DB_COMMAND``; see the module docstring."""
    sub: str = args.db_command
    if sub == "url":
        return _db_url(config)
    if config.database.url:
        return _external_server_error(config, sub)
    if sub == "start":
        return _db_start(config)
    if sub == "stop":
        return _db_stop(config)
    assert sub == "status"
    return _db_status(config, as_json=args.json)
