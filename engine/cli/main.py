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
module, the parsers (:mod:`engine.cli.commands`), their argument types (:mod:`engine.cli.args`)
and the exit statuses (:mod:`engine.cli.exits`) use the standard library only. Every command is
a module of its own, imported when the command runs (:func:`engine.cli.args.lazy`): ``run`` and
``migrate`` :mod:`engine.cli.service`, ``db`` :mod:`engine.cli.db`, ``bench``
:mod:`engine.cli.bench`, the rest as :mod:`engine.cli.commands` lists them. Those modules import
downward only (shared helpers: :mod:`engine.cli.common`, :mod:`engine.cli.formats`,
:mod:`engine.cli.render`, :mod:`engine.cli.signals`), never this one.

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
    :mod:`engine.cli.common` (how they open it) and each group's module, where its ``--json``
    shapes are: :mod:`engine.cli.submit`, :mod:`engine.cli.status` (``status``, ``schedules``),
    :mod:`engine.cli.tasks`, :mod:`engine.cli.queue` (``jobs``, ``queue``),
    :mod:`engine.cli.models` (``models``, ``groups``). They never create an embedded cluster:
    without one in ``data_dir`` they say so and exit 2; and the read-only ones never migrate (a
    schema behind is an error, exit 1).

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
import logging
import os
import signal
import sys
import traceback
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Final, NoReturn

from engine._version import __version__
from engine.cli.args import CommandFn, join_dash_values, lazy
from engine.cli.commands import add_client_commands, add_json_option
from engine.cli.exits import (
    EXIT_ERROR,
    EXIT_INTERRUPTED,
    EXIT_NOT_RUNNING,
    EXIT_OK,
    EXIT_USAGE,
)

# Only the standard library at import: `--help` and a usage error answer without loading trio,
# asyncpg or the configuration (engine_tests/cli/test_startup.py). Each command's module is
# imported when it runs (lazy), and the few imports below that sit in functions are there for
# the same reason.
if TYPE_CHECKING:
    from engine.config import EngineConfig

__all__ = ["build_parser", "entry", "log_level", "main"]

_SERVICE: Final = "engine.cli.service"
#: ``run``, also the command when none is given.
_RUN: Final[CommandFn] = lazy(_SERVICE, "run_service")

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
    run.set_defaults(cli_run=_RUN)
    run.add_argument(
        "--app",
        metavar="MODULE:ATTR",
        help="your providers: a mapping of model name to provider, or a callable or async "
        "context manager giving one (the app setting, ENGINE_APP)",
    )
    migrate = commands.add_parser("migrate", help="apply pending database migrations")
    migrate.set_defaults(cli_run=lazy(_SERVICE, "run_migrate"))
    db = commands.add_parser("db", help="manage the embedded PostgreSQL server")
    db.set_defaults(cli_run=lazy("engine.cli.db", "run_db"))
    db_commands = db.add_subparsers(dest="db_command", metavar="DB_COMMAND", required=True)
    db_commands.add_parser("start", help="start the embedded server and keep it running")
    db_commands.add_parser("stop", help="stop the embedded server")
    status = db_commands.add_parser("status", help="describe the embedded server")
    add_json_option(status)
    db_commands.add_parser("url", help="print a psql-ready URL of the engine database")
    bench = commands.add_parser("bench", help="run benchmark scenarios and print their figures")
    bench.set_defaults(cli_run=lazy("engine.cli.bench", "run_bench"))
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
    add_client_commands(commands)
    return parser


def _load(args: argparse.Namespace) -> EngineConfig:
    from engine.config import load_config  # here, not at the top: --help stays light

    overrides: dict[str, object] = dict(args.settings)
    if args.database_url is not None:
        overrides["database.url"] = args.database_url
    if args.data_dir is not None:
        overrides["data_dir"] = args.data_dir
    if getattr(args, "app", None) is not None:
        overrides["app"] = args.app
    return load_config(toml_path=args.config, overrides=overrides)


def _dispatch(args: argparse.Namespace, config: EngineConfig) -> int:
    # Every command stores its runner as ``cli_run`` (``set_defaults``); none given is ``run``.
    run_command: CommandFn = getattr(args, "cli_run", None) or _RUN
    return int(run_command(args, config))


# ---------------------------------------------------------------------------------------------
# Errors


def _report_failure(exc: BaseException) -> int:
    """Print ``exc`` for the user and return the exit status."""
    import trio  # here, not at the top: --help stays light

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
        from engine.logs import configure_logging  # here, not at the top: --help stays light

        config = _load(args)
        configure_logging(config.logging.format, log_level(args, config.logging.level))
        return _dispatch(args, config)
    except BaseException as exc:
        if isinstance(exc, SystemExit):
            raise
        return _report_failure(exc)
