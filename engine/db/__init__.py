"""The database: where it is, its pools, its schema, and every call to it.

This package owns the trio ↔ asyncio bridge (every asyncpg call, error mapping, connections
released under a shield), the three role pools, the named SQL of ``sql/queries/``, migrations,
the process's one LISTEN connection, every NOTIFY channel name, and where the database is: the
``[database]`` section's URL, or the embedded server in ``data_dir``.

What a program that opens the database itself needs (to run :func:`engine.queue.open_queue`
on pools of its own, say)::

    async with engine.db.open_urls(config.database, config.data_dir) as urls:
        async with engine.db.open_database(urls, config.database) as db:
            await engine.db.migrate_databases(db)
            ...

or ``engine.db.DatabaseUrls.single(url)`` for a URL in hand. The names load on first use, so
importing a lower module of this package (``engine.db.config``) does not load the driver.
"""

from typing import TYPE_CHECKING, Any

from engine.lazy import LazyExports

if TYPE_CHECKING:
    from engine.db.bridge import Connection as Connection
    from engine.db.bridge import Pool as Pool
    from engine.db.config import DatabaseConfig as DatabaseConfig
    from engine.db.database import Database as Database
    from engine.db.database import DatabaseUrls as DatabaseUrls
    from engine.db.database import open_database as open_database
    from engine.db.migrate import MigrationReport as MigrationReport
    from engine.db.resolve import migrate_databases as migrate_databases
    from engine.db.resolve import open_urls as open_urls

#: Where each public name lives (loaded on first use, PEP 562).
_LAZY: dict[str, str] = {
    "Connection": "engine.db.bridge",
    "Pool": "engine.db.bridge",
    "DatabaseConfig": "engine.db.config",
    "Database": "engine.db.database",
    "DatabaseUrls": "engine.db.database",
    "open_database": "engine.db.database",
    "MigrationReport": "engine.db.migrate",
    "migrate_databases": "engine.db.resolve",
    "open_urls": "engine.db.resolve",
}

__all__ = [
    "Connection",
    "Database",
    "DatabaseConfig",
    "DatabaseUrls",
    "MigrationReport",
    "Pool",
    "migrate_databases",
    "open_database",
    "open_urls",
]


_EXPORTS = LazyExports(__name__, _LAZY, globals())


def __getattr__(name: str) -> Any:
    """Load a public name on first use (``engine.db.open_database``)."""
    return _EXPORTS.load(name)


def __dir__() -> list[str]:
    """The module's names, the lazy ones included."""
    return _EXPORTS.names(__all__)
