"""The ``[database]`` section: where the database is and how the connection pools behave.

The one home of these settings' defaults and documentation; :mod:`engine.db.resolve` and
:func:`engine.db.database.open_database` take this section.
"""

from typing import Any, ClassVar, Literal
from urllib.parse import urlsplit

import attrs

from engine.settings import (
    Requirement,
    Rule,
    boolean,
    choice,
    enforce_section_rules,
    integer,
    not_above_rule,
    number,
    setting,
)

__all__ = ["DatabaseConfig"]


def _postgres_url(*, optional: bool = False) -> Any:
    return Requirement(
        "must be a postgresql:// or postgres:// URL, each port a number from 1 to 65535",
        lambda v: (
            isinstance(v, str)
            and urlsplit(v).scheme in ("postgresql", "postgres")
            and _ports_valid(v)
        ),
        optional,
    )


def _ports_valid(url: str) -> bool:
    """Every ``host:port`` of ``url`` (libpq accepts several, comma-separated) has a port
    from 1 to 65535, or none; the driver would otherwise fail with its own parse error."""
    hosts = urlsplit(url).netloc.rpartition("@")[2]
    for host in hosts.split(","):
        if host.startswith("["):  # an IPv6 literal: [::1]:5432
            host = host.partition("]")[2]
        _, colon, port = host.rpartition(":")
        if colon and port and not (port.isdigit() and 1 <= int(port) <= 65535):
            return False
    return True


@attrs.frozen
class DatabaseConfig:
    """PostgreSQL connections: where the database is and how the connection pools behave."""

    url: str | None = setting(
        None,
        "URL of the PostgreSQL database (`postgresql://user:password@host:port/dbname`) that "
        "holds the tasks, the job queue and the coordination tables. Unset starts the embedded "
        "PostgreSQL server under `data_dir` instead.",
        _postgres_url(optional=True),
    )
    tasks_url: str | None = setting(
        None,
        "URL for the task-store pool (task rows and the enqueue transaction); unset means "
        "`database.url`. Must reach the same database as `database.queue_url`, since a task "
        "and its job are written in one transaction.",
        _postgres_url(optional=True),
    )
    coordination_url: str | None = setting(
        None,
        "URL for the coordination pool (capacity, worker registry, recovery and admissions); "
        "unset means `database.url`. For now it must reach the same database as "
        "`database.tasks_url`: engine refuses at start a URL that reaches another database (a "
        "different user or host name for the same database is fine).",
        _postgres_url(optional=True),
    )
    queue_url: str | None = setting(
        None,
        "URL for the job-queue pool (fetch, completion and maintenance); unset means "
        "`database.url`. Must reach the same database as `database.tasks_url`.",
        _postgres_url(optional=True),
    )
    pool_min_size: int = setting(
        1,
        "Connections each pool opens at start and keeps open.",
        integer(0),
    )
    pool_max_size: int = setting(
        10,
        "Most connections each pool holds at once; the load controller compares connections in "
        "use with this.",
        integer(1),
    )
    connect_attempts: int = setting(
        3,
        "How many times to try to reach an unreachable database server when opening the pools "
        "before giving up (every command that connects; the service does this once per "
        "`worker.startup_attempts` attempt).",
        integer(1),
    )
    connect_retry_delay: float = setting(
        2.0,
        "Seconds to wait between two attempts to reach the database server.",
        number(ge=0),
    )
    migrate_on_start: bool = setting(
        True,
        "Apply pending schema migrations at start. Turn it off when migrations are applied "
        "separately before a deploy.",
        boolean(),
    )
    embedded_check_interval: float = setting(
        5.0,
        "Seconds between two looks at the embedded server while the engine runs: one that "
        "stopped under it (killed, a full disk) is logged with the tail of its log and started "
        "again, with backoff. Unused with an external server.",
        number(gt=0),
    )
    probe_interval: float = setting(
        5.0,
        "Seconds between two probes of the database (`SELECT 1` on each pool, 5 s to answer) "
        "while the engine runs: `/healthz` fails while it does not answer, and the outage is "
        "logged once when it starts and once when it ends.",
        number(gt=0),
    )
    statement_cache_size: int = setting(
        100,
        "Prepared statements asyncpg caches per connection. Ignored (no cache) with "
        '`database.pooler = "transaction"`, where a named prepared statement does not survive '
        "its transaction.",
        integer(0),
    )
    lock_timeout: float | None = setting(
        None,
        "PostgreSQL `lock_timeout` for every statement, in seconds; unset keeps the server's "
        "setting. A statement that waits longer fails with SQLSTATE 55P03, which a task run "
        "handles as a lock timeout. Set once per connection; with "
        '`database.pooler = "transaction"` set with `SET LOCAL` in every transaction instead '
        "(a statement outside a transaction then runs in one of its own).",
        number(gt=0, optional=True),
    )
    pooler: Literal["none", "transaction"] = setting(
        "none",
        "What the database URLs go through: `none` (PostgreSQL itself, or a pooler in session "
        "mode) or `transaction` (PgBouncer's `pool_mode = transaction`, or another pooler that "
        "may run each transaction on another server connection). With `transaction` the "
        "engine keeps no session state on its pools: no prepared statement cache, "
        "`lock_timeout` per transaction, LISTEN and migrations only on `database.listen_url`. "
        "See docs/operations.md, Behind PgBouncer.",
        choice("none", "transaction"),
    )
    listen_url: str | None = setting(
        None,
        "A direct URL of the engine's database (not through a transaction pooler) for the "
        "work that needs a session of its own: LISTEN for notifications and, with "
        '`database.pooler = "transaction"`, schema migrations (their advisory lock spans '
        "several transactions). Unset: LISTEN on each pool's own URL without a pooler; behind "
        "a transaction pooler no LISTEN at all (every consumer works at its poll interval: "
        "`queue.fetch_poll_interval` for new jobs, `tasks.lease_renew_interval` for cancels "
        "of running tasks, `worker.refresh_interval`, `admission.dispatch_interval`) and no "
        "migrations.",
        _postgres_url(optional=True),
    )
    command_timeout: float | None = setting(
        None,
        "Default timeout of one SQL statement on the client side, in seconds (asyncpg's "
        "`command_timeout`); unset means none.",
        number(gt=0, optional=True),
    )

    rules: ClassVar[tuple[Rule, ...]] = (
        not_above_rule("database.pool_min_size", "database.pool_max_size"),
        Rule(
            ("database.pooler", "database.listen_url", "database.migrate_on_start"),
            'database.pooler = "transaction" with database.migrate_on_start needs '
            "database.listen_url: migrations hold an advisory lock across transactions, which a "
            "transaction pooler does not keep. Set database.listen_url to a direct URL of the "
            "database, or set database.migrate_on_start = false and migrate with "
            "`python -m engine migrate` and a direct database.url",
            lambda v: (
                v["database.pooler"] != "transaction"
                or v["database.listen_url"] is not None
                or not v["database.migrate_on_start"]
            ),
        ),
    )
    """The rules among these fields."""

    def __attrs_post_init__(self) -> None:
        enforce_section_rules(self, self.rules)
