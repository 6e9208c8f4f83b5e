"""``python -m engine``: run the engine, apply migrations, manage the embedded PostgreSQL server.

Usage: ``python -m engine [global options] [COMMAND]``; ``run`` is the default command. Global
options come before the command:

``--config FILE``, ``--database-url URL``, ``--data-dir DIR``, ``--set SECTION.FIELD=VALUE``
(repeatable), ``--json`` (the same as the command's own ``--json``, which may come after it),
``-v`` / ``-vv`` (log INFO / DEBUG lines), ``--version``, ``--help``.

Logging: the service's commands (``run``, ``migrate``, ``db``, ``demo``, ``dashboard``) log at
``logging.level``; the client commands (``submit`` and the inspection commands) log warnings and
errors only, so that their output is what they print, unless ``-v`` asks for INFO lines.

``--help`` and a usage error answer without importing trio, asyncpg or the configuration: this
module and the parsers (:mod:`engine.cli.commands`) use the standard library only, and each
command imports what it needs when it runs.

Configuration is read by :func:`engine.config.load_config` (defaults < TOML file <
``ENGINE_*`` environment < command line); ``--database-url`` and ``--data-dir`` are shorthands
for ``--set database.url=...`` and ``--set data_dir=...`` and win over ``--set``.

Commands:

``run [--app package.module:attr]``
    Run the service tree (:func:`engine.service.root.serve`, the same tree ``engine.open``
    runs), with your providers (``--app``, the ``app`` setting or ``ENGINE_APP``), metrics on
    unless ``metrics.enabled`` is false, and the demo catalogue on an empty database. Prints
    ``engine: running ...`` with the (redacted) database URL once ready. The first SIGINT or
    SIGTERM drains (no new claims; running tasks get ``worker.shutdown_drain_timeout``, then are
    requeued; exit 0), the second requeues what still runs at once, the third exits at once
    (130).
``migrate``
    Apply pending migrations to every configured database and print, per database, the
    versions applied, skipped (River's own schema already there) and already applied.
``db start``
    Start the embedded server and pin it, so it stays up after this process exits (until
    ``db stop``); create the ``engine`` database; print its URL on stdout.
``db stop``
    Unpin the embedded server and stop it unless a process (``engine run``) still uses it.
``db status [--json]``
    Describe the embedded server; ``--json`` prints one JSON object for scripts.
``db url``
    Print a URL of the ``engine`` database that psql accepts (creating the database if
    missing). The embedded server must be running (``db start``).
``submit``, ``status``, ``tasks``, ``jobs``, ``queue``, ``models``, ``groups``, ``schedules``
    Submit tasks and inspect or control the engine from a client-only engine; see
    :mod:`engine.cli.submit` and :mod:`engine.cli.inspect` (``--json`` shapes there). They
    never create an embedded cluster: without one in ``data_dir`` they say so and exit 2; and
    the read-only ones never migrate (a schema behind is an error, exit 1).

The ``db`` commands manage the embedded server only. With ``database.url`` set, ``db url``
prints that URL unchanged (password included: it is for your own tools) and exits 0, while
``db start``, ``db stop`` and ``db status`` explain that an external server is configured and
exit 2, the status of a configuration that contradicts the command.

Exit status: 0 success (including a graceful shutdown of ``run``); 1 an engine error (printed as
``engine: error: ...``) or an unexpected one (printed with its traceback); 2 invalid
configuration or usage (a ``data_dir`` without an embedded cluster, for the client commands, is
one); 3 ``db status`` found the server not running (as ``pg_ctl status``);
130 interrupted (Ctrl-C, also when it stops ``submit --follow`` or ``status --watch``, or a second
signal during shutdown).

Errors escaping trio nurseries and trio-asyncio arrive wrapped in exception groups
(``ExceptionGroup[ExceptionGroup[X]]``); :func:`main` flattens them and
reports the engine errors inside as one message each, without a traceback.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import traceback
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Final, NoReturn

from engine._version import __version__
from engine.cli.args import join_dash_values
from engine.cli.commands import add_client_commands, add_json_option

# Only the standard library at import: `--help` and a usage error answer without loading trio,
# asyncpg or the configuration (engine_tests/cli/test_startup.py). Each command imports what it
# needs.
if TYPE_CHECKING:
    import trio

    from engine.config import EngineConfig
    from engine.service.engine import Engine

__all__ = [
    "EXIT_ERROR",
    "EXIT_INTERRUPTED",
    "EXIT_NOT_RUNNING",
    "EXIT_OK",
    "EXIT_USAGE",
    "build_parser",
    "entry",
    "log_level",
    "main",
]

log = logging.getLogger("engine.cli")

EXIT_OK: Final = 0
#: An engine error or an unexpected exception.
EXIT_ERROR: Final = 1
#: Invalid configuration or command line (as argparse; ``engine.config.config_problems_exit_code``).
EXIT_USAGE: Final = 2
#: ``db status``: the embedded server is not running (as ``pg_ctl status``).
EXIT_NOT_RUNNING: Final = 3
#: Interrupted by Ctrl-C, or a second SIGINT/SIGTERM during a graceful shutdown.
EXIT_INTERRUPTED: Final = 130

_EPILOG: Final = f"""\
commands:
  run                 run the engine (the default): migrate, then work until SIGINT/SIGTERM
  dashboard           serve the web dashboard alone against the database (no execution)
  migrate             apply pending database migrations and report them
  db start            start the embedded PostgreSQL server and keep it up; print its URL
  db stop             stop the embedded server (unless `engine run` still uses it)
  db status [--json]  describe the embedded server
  db url              print a psql-ready URL of the engine database
  status [--watch]    capacity, instances, queues, task counts and the leader
  submit --model M    submit tasks (--count N, --payload JSON|@FILE|-, --follow to watch them)
  tasks list|show|cancel|retry|resolve   inspect and control tasks
  jobs list           list queue jobs
  queue pause|resume NAME        stop or restart fetching from a queue everywhere
  models list|set|delete   the model catalogue and its concurrency and rate limits
  groups list|set|delete   the group catalogue and its concurrency and rate limits
  schedules list      periodic schedules, their last and next periods
  (the inspection commands take --json, before or after them; they never create an embedded
  cluster, and the read-only ones never migrate; see `COMMAND --help`)

exit status:
  {EXIT_OK}    success, including a graceful shutdown of `run`
  {EXIT_ERROR}    an error (`engine: error: ...`)
  {EXIT_USAGE}    invalid configuration or command line
  {EXIT_NOT_RUNNING}    `db status`: the embedded server is not running
  {EXIT_INTERRUPTED}  interrupted (Ctrl-C, also of `submit --follow` and `status --watch`, or a
       second signal during shutdown)

Settings come from defaults, the TOML file (--config or ENGINE_CONFIG), ENGINE_<SECTION>_<FIELD>
environment variables and --set, each overriding the one before.
"""


# ---------------------------------------------------------------------------------------------
# Command line


def _setting(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise argparse.ArgumentTypeError(f"expected SECTION.FIELD=VALUE, got {text!r}")
    return key.strip(), value


def build_parser(prog: str = "engine") -> argparse.ArgumentParser:
    """The argument parser of ``python -m engine`` (global options, then a command)."""
    parser = argparse.ArgumentParser(
        prog=prog,
        description="A durable task engine for trio applications, on PostgreSQL.",
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--config",
        metavar="FILE",
        type=Path,
        help="TOML configuration file (default: $ENGINE_CONFIG)",
    )
    parser.add_argument(
        "--database-url",
        metavar="URL",
        help="PostgreSQL URL to use instead of the embedded server (database.url)",
    )
    parser.add_argument(
        "--data-dir", metavar="DIR", help="directory of the embedded server (data_dir)"
    )
    parser.add_argument(
        "--set",
        metavar="SECTION.FIELD=VALUE",
        dest="settings",
        action="append",
        type=_setting,
        default=[],
        help="set one setting, e.g. --set queue.fetch_cooldown=0.01 (repeatable)",
    )
    parser.add_argument(
        "--json",
        action="store_true",
        help="print one JSON document (the commands that can; the same as COMMAND --json)",
    )
    parser.add_argument(
        "-v",
        "--verbose",
        action="count",
        default=0,
        help="log more: -v logs INFO lines, which the client commands (submit, status, tasks, "
        "...) leave out by default; -vv logs DEBUG",
    )
    parser.add_argument("--version", action="version", version=f"engine {__version__}")

    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    run = commands.add_parser("run", help="run the engine (the default command)")
    run.add_argument(
        "--app",
        metavar="MODULE:ATTR",
        help="your providers: a mapping of model name to provider, or a callable or async "
        "context manager giving one (the app setting, ENGINE_APP)",
    )
    commands.add_parser("migrate", help="apply pending database migrations")
    db = commands.add_parser("db", help="manage the embedded PostgreSQL server")
    db_commands = db.add_subparsers(dest="db_command", metavar="DB_COMMAND", required=True)
    db_commands.add_parser("start", help="start the embedded server and keep it running")
    db_commands.add_parser("stop", help="stop the embedded server")
    status = db_commands.add_parser("status", help="describe the embedded server")
    add_json_option(status)
    db_commands.add_parser("url", help="print a psql-ready URL of the engine database")
    bench = commands.add_parser("bench", help="run benchmark scenarios and print their figures")
    bench.add_argument("scenario", help="a scenario name, or 'all'")
    bench.add_argument(
        "--json",
        dest="json_file",
        type=Path,
        metavar="FILE",
        help="also write the figures as JSON",
    )
    bench.add_argument("--markdown", type=Path, metavar="FILE", help="also write a markdown table")
    bench.add_argument("--quick", action="store_true", help="a tenth of the work, for smoke tests")
    bench.add_argument(
        "--tasks", type=int, metavar="N", help="how many tasks, for scenarios that take it (http)"
    )
    bench.add_argument(
        "--minutes",
        type=float,
        metavar="M",
        help="how long, for scenarios that run for a while (soak; default 60)",
    )
    # Their leaf commands store their runner as ``cli_run``, which _dispatch calls.
    add_client_commands(commands)
    return parser


def _load(args: argparse.Namespace) -> EngineConfig:
    from engine.config import load_config

    overrides: dict[str, object] = dict(args.settings)
    if args.database_url is not None:
        overrides["database.url"] = args.database_url
    if args.data_dir is not None:
        overrides["data_dir"] = args.data_dir
    if getattr(args, "app", None) is not None:
        overrides["app"] = args.app
    return load_config(toml_path=args.config, overrides=overrides)


# ---------------------------------------------------------------------------------------------
# Signals


class _Shutdown:
    """What the signals have asked for so far: the first stops the work (a drain), the second
    cuts the drain short (``on_second``), the third exits at once."""

    def __init__(self, work: trio.CancelScope) -> None:
        self.work = work
        self.received: list[str] = []
        #: Called on the second signal (the service: requeue what still runs at once).
        self.on_second: Callable[[], None] | None = None


async def _watch_signals(signals: AsyncIterator[int], shutdown: _Shutdown) -> None:
    async for signum in signals:
        name = signal.Signals(signum).name
        shutdown.received.append(name)
        count = len(shutdown.received)
        if count == 1:
            log.info(
                "shutting down: draining; send the signal again to requeue running tasks now",
                extra={"event": "shutdown_requested", "signal": name},
            )
            shutdown.work.cancel(reason=f"{name} received")
        elif count == 2 and shutdown.on_second is not None:
            print(
                f"engine: {name} again: requeueing running tasks now (once more to exit at once)",
                file=sys.stderr,
                flush=True,
            )
            shutdown.on_second()
        else:
            print(f"engine: {name} again: exiting at once", file=sys.stderr, flush=True)
            os._exit(EXIT_INTERRUPTED)


async def _until_signal(body: Callable[[_Shutdown], Awaitable[None]]) -> str | None:
    """Run ``body(shutdown)`` until it returns or SIGINT/SIGTERM arrives; return that signal's
    name.

    The first signal cancels ``body`` (a graceful shutdown: its cleanup runs). The watcher sits
    outside the cancelled scope, so later signals during that cleanup still reach it: the
    second calls ``shutdown.on_second`` if ``body`` set it (else it exits), the third ends the
    process at once with :data:`EXIT_INTERRUPTED`.
    """
    import trio

    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async with trio.open_nursery() as nursery:
            shutdown = _Shutdown(trio.CancelScope())
            nursery.start_soon(_watch_signals, signals, shutdown)
            with shutdown.work:
                await body(shutdown)
            nursery.cancel_scope.cancel(reason="command finished")
    return shutdown.received[0] if shutdown.received else None


# ---------------------------------------------------------------------------------------------
# Commands


def service_config(config: EngineConfig) -> EngineConfig:
    """The configuration as the command line's service runs it: metrics and the dashboard on
    unless ``metrics.enabled`` / ``dashboard.enabled`` say otherwise (an embedded engine has
    them off unless it says on)."""
    import attrs

    if config.metrics.enabled is None:
        config = attrs.evolve(config, metrics=attrs.evolve(config.metrics, enabled=True))
    if config.dashboard.enabled is None:
        config = attrs.evolve(config, dashboard=attrs.evolve(config.dashboard, enabled=True))
    return config


async def start_service(
    config: EngineConfig, nursery: trio.Nursery, shutdown: _Shutdown | None = None
) -> Engine:
    """Start the service tree in ``nursery`` as the command line runs it (demo simulation,
    demo catalogue on an empty database) and print where its metrics are."""
    import functools

    from engine.cli.catalogue import DEMO_SIMULATION, install_demo_catalogue
    from engine.providers.simulated import SimulatedProvider
    from engine.service.root import serve

    eng: Engine = await nursery.start(
        functools.partial(
            serve, service_config(config), simulated=SimulatedProvider(DEMO_SIMULATION)
        )
    )
    if shutdown is not None:
        shutdown.on_second = eng.stop_draining
    if config.tasks.demo_catalogue:
        await install_demo_catalogue(eng)
    if eng.metrics_url is not None:
        print(f"engine: metrics at {eng.metrics_url}", flush=True)
    if eng.dashboard_url is not None:
        print(f"engine: dashboard at {eng.dashboard_url}", flush=True)
    return eng


def _cmd_run(config: EngineConfig) -> int:
    import trio

    from engine.db.dsn import redact

    async def run(shutdown: _Shutdown) -> None:
        async with trio.open_nursery() as nursery:
            eng = await start_service(config, nursery, shutdown)
            served = ", ".join(sorted(eng.runner.providers)) or "none (simulation tasks only)"
            print(
                f"engine: running; database {redact(eng.urls.tasks)}; models {served} "
                "(Ctrl-C to stop)",
                flush=True,
            )

    signame = trio.run(_until_signal, run)
    if signame is not None:
        log.info("stopped", extra={"event": "shutdown_complete", "signal": signame})
    return EXIT_OK


def _format_versions(versions: Sequence[int]) -> str:
    return ", ".join(f"{v:04d}" for v in versions) if versions else "none"


def _cmd_migrate(config: EngineConfig) -> int:
    import trio

    from engine.db.bridge import asyncio_loop
    from engine.db.database import open_database
    from engine.db.migrate import MigrationReport
    from engine.db.resolve import migrate_databases, open_urls

    reports: list[tuple[str, MigrationReport]] = []

    async def run_migrations(_shutdown: _Shutdown) -> None:
        async with (
            asyncio_loop(),
            open_urls(config.database, config.data_dir) as urls,
            open_database(
                urls, config.database, min_size=1, max_size=1, application_name="engine-migrate"
            ) as db,
        ):
            reports.extend(await migrate_databases(db, river_indexes=config.queue.river_indexes))

    if trio.run(_until_signal, run_migrations) is not None:
        print("engine: migration interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    for url, report in reports:
        print(f"database: {url}")
        print(f"  applied: {_format_versions(report.applied)}")
        print(f"  skipped: {_format_versions(report.skipped)}")
        print(f"  already applied: {_format_versions(report.already)}")
        if report.indexes_created:
            print(f"  River indexes built: {', '.join(report.indexes_created)}")
    return EXIT_OK


def _external_server_error(config: EngineConfig, command: str) -> int:
    from engine.db.dsn import redact

    assert config.database.url is not None
    print(
        f"engine: error: `db {command}` manages the embedded PostgreSQL server, but "
        f"database.url is set ({redact(config.database.url)}), so the engine uses that "
        "external server. Unset database.url (ENGINE_DATABASE_URL, --database-url) to use the "
        "embedded server.",
        file=sys.stderr,
    )
    return EXIT_USAGE


def _cmd_db_start(config: EngineConfig) -> int:
    from engine.db import embedded
    from engine.db.resolve import ENGINE_DATABASE, embedded_data_dir, ensure_database_blocking

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


def _cmd_db_stop(config: EngineConfig) -> int:
    from engine.db import embedded
    from engine.db.resolve import embedded_data_dir

    print(embedded.stop(embedded_data_dir(config.data_dir)))
    return EXIT_OK


def _cmd_db_status(config: EngineConfig, *, as_json: bool) -> int:
    from engine.db import embedded
    from engine.db.resolve import ENGINE_DATABASE, embedded_data_dir

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


def _cmd_db_url(config: EngineConfig) -> int:
    from engine.db import embedded
    from engine.db.dsn import replace_database
    from engine.db.resolve import ENGINE_DATABASE, embedded_data_dir, ensure_database_blocking

    if config.database.url:
        print(config.database.url)
        return EXIT_OK
    admin = embedded.url(embedded_data_dir(config.data_dir))  # raises if not running
    ensure_database_blocking(admin, ENGINE_DATABASE)
    print(replace_database(admin, ENGINE_DATABASE))
    return EXIT_OK


def _cmd_bench(config: EngineConfig, args: argparse.Namespace) -> int:
    from engine.bench.runner import SCENARIOS, run_benchmarks

    if args.scenario != "all" and args.scenario not in SCENARIOS:
        known = ", ".join([*SCENARIOS, "all"])
        print(
            f"engine: error: unknown scenario {args.scenario!r}; choose one of {known}",
            file=sys.stderr,
        )
        return EXIT_USAGE
    run_benchmarks(
        config,
        [args.scenario],
        json_path=args.json_file,
        markdown_path=args.markdown,
        quick=args.quick,
        tasks=args.tasks,
        minutes=args.minutes,
    )
    return EXIT_OK


def _dispatch(args: argparse.Namespace, config: EngineConfig) -> int:
    command = args.command or "run"
    if command == "run":
        return _cmd_run(config)
    if command == "migrate":
        return _cmd_migrate(config)
    if command == "bench":
        return _cmd_bench(config, args)
    run_command = getattr(args, "cli_run", None)
    if run_command is not None:  # submit, status, tasks, jobs, queue, models, groups
        return int(run_command(args, config))
    assert command == "db"
    sub: str = args.db_command
    if sub == "url":
        return _cmd_db_url(config)
    if config.database.url:
        return _external_server_error(config, sub)
    if sub == "start":
        return _cmd_db_start(config)
    if sub == "stop":
        return _cmd_db_stop(config)
    assert sub == "status"
    return _cmd_db_status(config, as_json=args.json)


# ---------------------------------------------------------------------------------------------
# Errors


def _report_failure(exc: BaseException) -> int:
    """Print ``exc`` for the user and return the exit status."""
    import trio

    from engine.errors import ConfigError, EngineError, leaves

    # Cancelled only travels next to the error that caused the cancellation.
    found = list(leaves(exc))
    found = [e for e in found if not isinstance(e, trio.Cancelled)] or found
    if any(isinstance(e, KeyboardInterrupt) for e in found):
        return EXIT_INTERRUPTED
    for leaf in found:
        if isinstance(leaf, SystemExit):
            return leaf.code if isinstance(leaf.code, int) else EXIT_ERROR
    if all(isinstance(e, EngineError) for e in found):
        messages = list(dict.fromkeys(str(e) for e in found))
        for message in messages:
            print(f"engine: error: {message}", file=sys.stderr)
        return EXIT_USAGE if all(isinstance(e, ConfigError) for e in found) else EXIT_ERROR
    print("engine: unexpected error:", file=sys.stderr)
    traceback.print_exception(exc)
    return EXIT_ERROR


def _prog(argv0: str) -> str:
    name = os.path.basename(argv0)
    return "python -m engine" if name in ("__main__.py", "-c", "") else name


def entry() -> NoReturn:
    """The process entry point (``python -m engine``, the ``engine`` script): :func:`main`,
    then exit with its status. Once it has returned (a shutdown included) the work is done, so
    a SIGINT or SIGTERM arriving while the process exits is ignored: it must not turn a clean
    exit into a kill."""
    code = main()
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    sys.exit(code)


def log_level(args: argparse.Namespace, configured: str) -> int:
    """The level the command logs at: ``logging.level`` for the service's commands (``-v``:
    at least INFO, ``-vv``: DEBUG); for the client commands (``quiet_logs``: submit and the
    inspection commands) WARNING and above only, unless ``-v`` (INFO) or ``-vv`` (DEBUG) asks
    for more, so their output is what they print."""
    level = logging.getLevelName(configured.upper())
    level = level if isinstance(level, int) else logging.INFO
    verbose = int(getattr(args, "verbose", 0) or 0)
    if verbose >= 2:
        return logging.DEBUG
    if verbose == 1:
        return min(level, logging.INFO)
    if getattr(args, "quiet_logs", False):
        return max(level, logging.WARNING)
    return level


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line ``argv`` (default ``sys.argv[1:]``) and return the exit status."""
    parser = build_parser(_prog(sys.argv[0] if sys.argv else ""))
    raw = list(sys.argv[1:] if argv is None else argv)
    # Exits 2 on a usage error, 0 for --help / --version.
    args = parser.parse_args(join_dash_values(raw))
    if args.json is True and not getattr(args, "json_capable", False):
        parser.error(f"--json: `{args.command or 'run'}` has no JSON output")
    try:
        from engine.logs import configure_logging

        config = _load(args)
        configure_logging(config.logging.format, log_level(args, config.logging.level))
        return _dispatch(args, config)
    except BaseException as exc:
        if isinstance(exc, SystemExit):
            raise
        return _report_failure(exc)
