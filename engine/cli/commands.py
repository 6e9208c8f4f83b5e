"""The parsers of the client commands: ``submit``, ``status``, ``tasks``, ``jobs``, ``queue``,
``models``, ``groups``, ``schedules``, and ``demo`` and ``dashboard``.

Building them imports nothing but the standard library (:mod:`engine.cli.args`): each leaf
stores its runner as ``cli_run``, a :func:`~engine.cli.args.lazy` function that imports the
command's module only when the command runs. The inspection commands run through
:func:`engine.cli.common.run_engine_command` and also store ``engine_command`` (the module and
the name of their body: :mod:`engine.cli.status`, :mod:`engine.cli.tasks`,
:mod:`engine.cli.queue`, :mod:`engine.cli.models`) and ``readonly`` (True: the command only
reads, so it never migrates; see :mod:`engine.cli.common`).

Every command that prints JSON takes ``--json`` after its name; the global ``--json`` (before
the command) means the same. Both store ``json``; the leaf's option has no default, so it never
overwrites the global one.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Final

from engine.cli.args import (
    JOB_STATES,
    TASK_STATUSES,
    before_arg,
    count_arg,
    json_arg,
    lazy,
    payload_arg,
    positive_int,
    rate_arg,
    task_id_arg,
)

__all__ = [
    "DEFAULT_LIMIT",
    "add_client_commands",
    "add_json_option",
]

if TYPE_CHECKING:
    Subparsers = argparse._SubParsersAction[argparse.ArgumentParser]

#: Rows ``tasks list`` and ``jobs list`` show unless ``--limit`` says otherwise.
DEFAULT_LIMIT: Final = 50
#: Seconds between two refreshes of ``status --watch`` unless given.
WATCH_INTERVAL: Final = 2.0

_STATUS: Final = "engine.cli.status"
_TASKS: Final = "engine.cli.tasks"
_QUEUE: Final = "engine.cli.queue"
_MODELS: Final = "engine.cli.models"


def add_json_option(parser: argparse.ArgumentParser) -> None:
    """``--json`` after the command; marks the command as one that prints JSON."""
    parser.add_argument(
        "--json", action="store_true", default=argparse.SUPPRESS, help="print one JSON document"
    )
    parser.set_defaults(json_capable=True)


def _leaf(
    commands: Subparsers, name: str, body: tuple[str, str], help: str, *, readonly: bool
) -> argparse.ArgumentParser:
    """An inspection command: ``body`` is the module and the name of its
    :data:`~engine.cli.common.EngineCommand`."""
    parser: argparse.ArgumentParser = commands.add_parser(name, help=help, description=help)
    add_json_option(parser)
    parser.set_defaults(
        cli_run=lazy("engine.cli.common", "run_engine_command"),
        engine_command=body,
        readonly=readonly,
        quiet_logs=True,
    )
    return parser


def _group(commands: Subparsers, name: str, help: str) -> Subparsers:
    parser = commands.add_parser(name, help=help, description=help)
    sub: Subparsers = parser.add_subparsers(
        dest=f"{name}_command", metavar="SUBCOMMAND", required=True
    )
    return sub


def _watch_interval(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not 0.1 <= value <= 3600:
        raise argparse.ArgumentTypeError(f"expected seconds from 0.1 to 3600, got {text!r}")
    return value


def _catalogue_options(parser: argparse.ArgumentParser) -> None:
    limit = parser.add_mutually_exclusive_group()
    limit.add_argument(
        "--limit", type=positive_int, metavar="N", help="concurrency limit (running tasks)"
    )
    limit.add_argument("--unlimited", action="store_true", help="remove the concurrency limit")
    rate = parser.add_mutually_exclusive_group()
    rate.add_argument(
        "--rate",
        type=rate_arg,
        metavar="N/S",
        help="rate limit: at most N requests per S seconds (e.g. 10/1, or 10/1s as `list` "
        "prints it)",
    )
    rate.add_argument("--no-rate", action="store_true", help="remove the rate limit")
    enabled = parser.add_mutually_exclusive_group()
    enabled.add_argument("--enable", dest="enabled", action="store_const", const=True)
    enabled.add_argument("--disable", dest="enabled", action="store_const", const=False)


def _add_inspect(commands: Subparsers) -> None:
    status = _leaf(
        commands,
        "status",
        (_STATUS, "cmd_status"),
        "capacity, instances, queues, task counts, the leader",
        readonly=True,
    )
    status.add_argument(
        "--watch",
        nargs="?",
        const=WATCH_INTERVAL,
        type=_watch_interval,
        metavar="SECONDS",
        help=f"redraw every SECONDS (default {WATCH_INTERVAL:g}) until Ctrl-C",
    )

    tasks = _group(commands, "tasks", "list, show, cancel, retry and resolve tasks")
    tasks_list = _leaf(
        tasks, "list", (_TASKS, "cmd_tasks_list"), "list tasks, newest first", readonly=True
    )
    tasks_list.add_argument("--status", choices=TASK_STATUSES)
    tasks_list.add_argument("--model", metavar="M")
    tasks_list.add_argument("--tenant", metavar="T", help="only this tenant's tasks")
    tasks_list.add_argument(
        "--before",
        type=before_arg,
        metavar="ID|TIME",
        help="the next page: tasks older than task ID (as the last line suggests), or created "
        "before an ISO 8601 TIME",
    )
    tasks_list.add_argument("--limit", type=positive_int, default=DEFAULT_LIMIT, metavar="N")
    _leaf(
        tasks, "show", (_TASKS, "cmd_tasks_show"), "show a task and its events", readonly=True
    ).add_argument("id", type=task_id_arg, metavar="ID")
    for name, text in [
        ("cancel", "cancel a queued or running task"),
        ("retry", "queue a failed, cancelled or manual_review task again"),
    ]:
        _leaf(tasks, name, (_TASKS, f"cmd_tasks_{name}"), text, readonly=False).add_argument(
            "id", type=task_id_arg, metavar="ID"
        )
    resolve = _leaf(
        tasks,
        "resolve",
        (_TASKS, "cmd_tasks_resolve"),
        "decide a manual_review task: mark it succeeded or failed, or resubmit it",
        readonly=False,
    )
    resolve.add_argument("id", type=task_id_arg, metavar="ID")
    decision = resolve.add_mutually_exclusive_group(required=True)
    decision.add_argument("--succeeded", action="store_true", help="mark it succeeded")
    decision.add_argument("--failed", action="store_true", help="mark it failed")
    decision.add_argument(
        "--resubmit",
        action="store_true",
        help="queue it again: the upstream call is made again (needs --may-run-twice)",
    )
    resolve.add_argument(
        "--result", type=json_arg, metavar="JSON", help="the result, with --succeeded"
    )
    resolve.add_argument("--reason", required=True, help="why (recorded in the task's events)")
    resolve.add_argument("--actor", help="who decides (default: user@host)")
    resolve.add_argument(
        "--may-run-twice",
        action="store_true",
        help="confirm that a resubmitted task may run upstream twice",
    )

    jobs = _group(commands, "jobs", "inspect queue jobs")
    jobs_list = _leaf(
        jobs, "list", (_QUEUE, "cmd_jobs_list"), "list jobs, newest first", readonly=True
    )
    jobs_list.add_argument("--state", choices=JOB_STATES)
    jobs_list.add_argument("--queue", metavar="Q")
    jobs_list.add_argument("--limit", type=positive_int, default=DEFAULT_LIMIT, metavar="N")

    queue = _group(commands, "queue", "pause or resume a queue in every process")
    for name, text in [("pause", "stop fetching from a queue"), ("resume", "fetch again")]:
        _leaf(queue, name, (_QUEUE, f"cmd_queue_{name}"), text, readonly=False).add_argument("name")

    models = _group(commands, "models", "the model catalogue")
    _leaf(models, "list", (_MODELS, "cmd_models_list"), "list models", readonly=True)
    models_set = _leaf(
        models, "set", (_MODELS, "cmd_models_set"), "create or change a model", readonly=False
    )
    models_set.add_argument("name", metavar="NAME")
    _catalogue_options(models_set)
    models_set.add_argument("--provider", metavar="P", help="provider of live tasks")
    _leaf(
        models,
        "delete",
        (_MODELS, "cmd_models_delete"),
        "remove a model no unfinished task uses",
        readonly=False,
    ).add_argument("name", metavar="NAME")

    schedules = _group(commands, "schedules", "periodic schedules")
    _leaf(
        schedules,
        "list",
        (_STATUS, "cmd_schedules_list"),
        "list schedules, their last and next periods",
        readonly=True,
    )

    groups = _group(commands, "groups", "the group catalogue")
    _leaf(groups, "list", (_MODELS, "cmd_groups_list"), "list groups", readonly=True)
    groups_set = _leaf(
        groups, "set", (_MODELS, "cmd_groups_set"), "create or change a group", readonly=False
    )
    groups_set.add_argument("key", metavar="KEY")
    _catalogue_options(groups_set)
    _leaf(
        groups,
        "delete",
        (_MODELS, "cmd_groups_delete"),
        "remove a group no unfinished task uses",
        readonly=False,
    ).add_argument("key", metavar="KEY")


def _add_submit(commands: Subparsers) -> None:
    help = "submit tasks (--follow: watch them until they finish)"
    parser = commands.add_parser("submit", help=help, description=help)
    parser.add_argument("--model", required=True, metavar="M", help="the model to run")
    parser.add_argument(
        "--count",
        type=count_arg,
        default=1,
        metavar="N",
        help="tasks to submit (default 1, at most 1,000,000; stored in batches)",
    )
    parser.add_argument(
        "--payload",
        type=payload_arg,
        metavar="JSON|@FILE|-",
        help="the payload of each task: JSON text, @FILE for the JSON in a file, - for the "
        "JSON on standard input (default {})",
    )
    parser.add_argument("--tenant", default="cli", metavar="T", help="tenant id (default cli)")
    parser.add_argument("--user", default="cli", metavar="U", help="user id (default cli)")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument(
        "--simulation",
        dest="run_mode",
        action="store_const",
        const="simulation",
        help="run on the simulated provider (the default)",
    )
    mode.add_argument(
        "--live",
        dest="run_mode",
        action="store_const",
        const="live",
        help="call the model's provider",
    )
    parser.set_defaults(
        run_mode="simulation", cli_run=lazy("engine.cli.submit", "run_submit"), quiet_logs=True
    )
    parser.add_argument(
        "--follow", action="store_true", help="show progress until every task is final"
    )
    add_json_option(parser)


def _add_demo(commands: Subparsers) -> None:
    help = "run the service and a batch of demo tasks in one process, then stop"
    parser = commands.add_parser("demo", help=help, description=help)
    parser.add_argument(
        "--model", default="demo-image", metavar="M", help="the model to run (default demo-image)"
    )
    parser.add_argument(
        "--count", type=positive_int, default=50, metavar="N", help="tasks to submit (default 50)"
    )
    parser.add_argument(
        "--upstream",
        choices=("simulation", "http"),
        default="simulation",
        help="where the tasks run: the simulation (default), or a fake HTTP upstream served on "
        "loopback, through the HTTP provider kit (model demo-http)",
    )
    parser.set_defaults(cli_run=lazy("engine.cli.demo", "run_demo"))


def _add_dashboard(commands: Subparsers) -> None:
    help = "serve the web dashboard alone against the database (no execution)"
    parser = commands.add_parser("dashboard", help=help, description=help)
    parser.add_argument("--host", metavar="H", help="address to bind (default metrics.host)")
    parser.add_argument(
        "--port", type=int, metavar="N", help="port to bind; 0 for any (default metrics.port)"
    )
    parser.set_defaults(cli_run=lazy("engine.cli.dashboard", "run_dashboard"))


def add_client_commands(commands: Subparsers) -> None:
    """Add ``submit``, ``demo``, ``dashboard`` and the inspection commands to the CLI."""
    _add_submit(commands)
    _add_demo(commands)
    _add_dashboard(commands)
    _add_inspect(commands)
