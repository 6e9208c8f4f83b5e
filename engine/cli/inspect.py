"""Inspection and control commands of ``python -m engine``: status, tasks, jobs, queues, catalogue.

Every command opens the engine's records layer only (``engine.open(config, control=False)``: no
execution; it migrates unless ``database.migrate_on_start`` is false), does its reads or writes,
and prints a human table, or with ``--json`` one JSON document on one line for scripts.
Timestamps in JSON are ISO 8601 with a UTC offset; ids of tasks are UUID strings.

Commands and their ``--json`` documents:

``status``
    ``{"capacity": {"desired", "capacity", "hard_limit", "capped", "enabled_models",
    "unlimited_models", "model_desired", "enabled_groups", "unlimited_groups", "group_desired"},
    "leader": {"leader_id", "elected_at", "expires_at"} | null, "instances": [INSTANCE],
    "queues": {NAME: {"paused": bool, "paused_at", "jobs": {STATE: n for every job state}}},
    "tasks": {STATUS: n for every task status}, "unserved_models": {MODEL: n}}``. ``capacity``
    is the global capacity computed from the catalogue with ``worker.hard_limit``
    (:func:`~engine.capacity.registry.load_capacity`);
    INSTANCE is one registry row (:class:`~engine.capacity.registry.InstanceInfo`: ``instance_id``,
    ``status``, ``allocated``, ``desired_capacity``, ``capacity_limit``, ``safe_capacity``,
    ``heavy_capacity``, ``load_mode``, ``active_tasks``, ``preparing_tasks``,
    ``waiting_upstream_tasks``, ``finalizing_tasks``, ``pressure_state``, ``pressure_reason``,
    ``heartbeat_age`` in seconds, ``heartbeat_at``, ``started_at``, ``draining_at``,
    ``load_sampled_at``, ``pod_uid``, ``pod_name``, ``site``, ``revision``, and ``models``: the
    models it serves, null for every model). ``unserved_models`` is ``{MODEL: n}``: models with
    n queued live tasks that no live registered instance serves, so no one claims their jobs.
``tasks list [--status S] [--model M] [--limit N]``
    ``{"tasks": [TASK]}``, newest first. TASK is ``{"id", "model", "group_key", "status",
    "phase", "progress", "run_mode", "identity": {...}, "payload", "result", "error",
    "attempts", "river_job_id", "execution_owner", "lease_expires_at", "submitted_at",
    "upstream_ref", "cancel_requested_at", "next_run_at", "created_at", "updated_at",
    "started_at", "finished_at"}``.
``tasks show ID``
    ``{"task": TASK, "events": [{"type", "status", "phase", "progress", "message", "payload",
    "simulated", "instance_id", "at"}]}``, events oldest first.
``tasks cancel ID``
    ``{"task": TASK, "outcome": "cancelled" | "cancel_requested" | "already_cancelled"}``. A
    queued task is cancelled at once; a running one is told to stop and ends ``cancelled``
    (``cancel_requested``). A task that already finished otherwise is an error (exit 1).
``tasks retry ID``
    ``{"task": TASK, "job_id": n}``. A failed, cancelled or manual_review task goes back to
    ``queued`` as a fresh run with a new job (SQL ``task_retry``); failed and manual_review tasks
    also lose ``submitted_at`` and ``upstream_ref``, so the upstream call is made again. Any other
    status is an error (exit 1).
``tasks resolve ID (--succeeded [--result JSON] | --failed | --resubmit --may-run-twice)
--reason TEXT [--actor NAME]``
    ``{"task": TASK}``. Decides a manual_review task (``Engine.resolve``): succeeded with the
    result found upstream, failed (error code ``resolved_failed``, the reason as message), or
    resubmitted (queued with a new job; the upstream call is made again, so it may run twice:
    ``--may-run-twice`` confirms). Recorded as a ``task.resolved`` / ``task.resubmitted`` event
    with the actor (default ``user@host``) and the reason. A task not in manual_review is an
    error (exit 1), and nothing changes.
``jobs list [--state S] [--queue Q] [--limit N]``
    ``{"jobs": [{"id", "state", "kind", "queue", "priority", "attempt", "max_attempts", "args",
    "tags", "metadata", "errors", "scheduled_at", "created_at", "attempted_at",
    "finalized_at"}]}``, newest first.
``queue pause NAME`` / ``queue resume NAME``
    ``{"queue": {"name", "paused", "paused_at"}}``: fetching from the queue stops (resumes) in
    every process; running jobs go on.
``models list`` / ``models set NAME [--limit N | --unlimited] [--rate N/S | --no-rate]
[--enable | --disable] [--provider P]``
    ``{"models": [MODEL]}`` / ``{"model": MODEL}``; MODEL is ``{"name", "enabled",
    "concurrency_limit" (null: unlimited), "rate_limit" (requests per interval; null: none),
    "rate_interval" (seconds; null without a rate limit), "provider", "settings", "created_at",
    "updated_at"}``. ``--rate 10/1`` allows 10 requests per second (a token bucket of 10, refilled
    at that rate), ``--rate 30/60`` 30 a minute; ``--no-rate`` removes it. ``set`` changes only
    the options given; a new model starts enabled, unlimited, without a rate limit, on provider
    ``simulated``. Tables show the rate as ``10/1s``.
``groups list`` / ``groups set KEY [--limit N | --unlimited] [--rate N/S | --no-rate]
[--enable | --disable]``
    ``{"groups": [GROUP]}`` / ``{"group": GROUP}``; GROUP is ``{"key", "enabled",
    "concurrency_limit", "rate_limit", "rate_interval", "created_at", "updated_at"}``.

Errors are engine errors, reported by :func:`engine.cli.main.main` as ``engine: error: ...`` with
exit status 1 (``no task <id>`` for an unknown task id); a malformed option is a usage error
(exit 2).
"""

from __future__ import annotations

import argparse
import enum
import getpass
import json
import socket
import unicodedata
import uuid
from collections.abc import Awaitable, Callable, Iterable, Sequence
from datetime import UTC, datetime
from typing import Any, Final

import attrs
import trio

from engine.capacity.registry import InstanceInfo, list_instances, load_capacity, unserved_models
from engine.cli.main import EXIT_OK
from engine.config import EngineConfig
from engine.db.bridge import Record
from engine.db.sqlfiles import QUERIES
from engine.errors import EngineError, TaskError, TaskNotFound
from engine.queue.job import Job
from engine.queue.states import JobState
from engine.schedules.status import ScheduleState, list_schedules
from engine.service.engine import Engine
from engine.service.root import open as open_engine
from engine.tasks.models import Task, TaskEvent, TaskStatus
from engine.tasks.submit import give_job

__all__ = [
    "CommandFn",
    "EngineCommand",
    "add_inspect_commands",
    "default_actor",
    "dumps",
    "event_json",
    "format_table",
    "positive_int",
    "retry_task",
    "run_with_engine",
    "task_id_arg",
    "task_json",
]

#: What a leaf parser stores as ``cli_run`` (``set_defaults``): run the command, return the exit
#: status. :func:`engine.cli.main.main` calls it with the parsed arguments and the configuration.
CommandFn = Callable[[argparse.Namespace, EngineConfig], int]

#: The body of an inspection command: given an open client-only engine, print, return the status.
EngineCommand = Callable[[Engine, argparse.Namespace], Awaitable[int]]

_TASK_GET: Final = QUERIES["task_get"]
_TASK_RETRY: Final = QUERIES["task_retry"]
_QUEUE_LIST: Final = QUERIES["queue_list"]
_LEADER_GET: Final = QUERIES["leader_get"]
_MODEL_GET: Final = QUERIES["model_get"]
_MODEL_LIST: Final = QUERIES["model_list"]
_GROUP_LIST: Final = QUERIES["group_list"]
_QUEUED_LIVE_BY_MODEL: Final = QUERIES["task_count_queued_live_by_model"]

_RETRYABLE: Final = frozenset({TaskStatus.FAILED, TaskStatus.CANCELLED, TaskStatus.MANUAL_REVIEW})
_DEFAULT_LIMIT: Final = 50
_NONE: Final = "-"


# ---------------------------------------------------------------------------------------------
# Shared helpers (also used by engine.cli.submit)


def run_with_engine(config: EngineConfig, body: Callable[[Engine], Awaitable[int]]) -> int:
    """Open a client-only engine (no execution), run ``body`` with it, return its status.

    Errors escape to :func:`engine.cli.main.main`, which reports them; Ctrl-C ends the command
    with ``KeyboardInterrupt`` (exit 130) after the engine closed.
    """

    async def main() -> int:
        async with open_engine(config, control=False) as eng:
            return await body(eng)

    return trio.run(main)


def _with_engine(command: EngineCommand) -> CommandFn:
    def run(args: argparse.Namespace, config: EngineConfig) -> int:
        return run_with_engine(config, lambda eng: command(eng, args))

    return run


#: The largest count the catalogue and the registry store (PostgreSQL's integer).
INT32_MAX: Final = 2_147_483_647


def positive_int(text: str) -> int:
    """argparse type: an integer from 1 to 2,147,483,647."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if not 1 <= value <= INT32_MAX:
        raise argparse.ArgumentTypeError(
            f"expected a positive integer up to {INT32_MAX:,}, got {value}"
        )
    return value


def task_id_arg(text: str) -> uuid.UUID:
    """argparse type: a task id (a UUID)."""
    try:
        return uuid.UUID(text.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a task id (a UUID): {text!r}") from None


def _json_default(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, uuid.UUID):
        return str(value)
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, bytes):
        return value.hex()
    if isinstance(value, (set, frozenset, tuple)):
        return list(value)
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


def dumps(document: Any) -> str:
    """One JSON document on one line; datetimes, UUIDs, enums and bytes as strings."""
    return json.dumps(document, default=_json_default, ensure_ascii=False)


def _iso(value: datetime | None) -> str | None:
    return None if value is None else value.isoformat()


def task_json(task: Task) -> dict[str, Any]:
    """The ``--json`` form of a task (see the module docstring)."""
    return {
        "id": str(task.id),
        "model": task.model,
        "group_key": task.group_key,
        "status": task.status.value,
        "phase": None if task.phase is None else task.phase.value,
        "progress": task.progress,
        "run_mode": task.run_mode.value,
        "identity": task.identity.as_dict(),
        "payload": task.payload,
        "result": task.result,
        "error": task.error,
        "attempts": task.attempts,
        "river_job_id": task.river_job_id,
        "execution_owner": task.execution_owner,
        "lease_expires_at": _iso(task.lease_expires_at),
        "submitted_at": _iso(task.submitted_at),
        "upstream_ref": task.upstream_ref,
        "cancel_requested_at": _iso(task.cancel_requested_at),
        "next_run_at": _iso(task.next_run_at),
        "created_at": _iso(task.created_at),
        "updated_at": _iso(task.updated_at),
        "started_at": _iso(task.started_at),
        "finished_at": _iso(task.finished_at),
    }


def event_json(event: TaskEvent) -> dict[str, Any]:
    """The ``--json`` form of a task event."""
    return {
        "type": event.type,
        "status": event.status,
        "phase": event.phase,
        "progress": event.progress,
        "message": event.message,
        "payload": event.payload,
        "simulated": event.simulated,
        "instance_id": event.instance_id,
        "at": _iso(event.at),
    }


def _job_json(job: Job) -> dict[str, Any]:
    return {
        "id": job.id,
        "state": job.state.value,
        "kind": job.kind,
        "queue": job.queue,
        "priority": job.priority,
        "attempt": job.attempt,
        "max_attempts": job.max_attempts,
        "args": job.args,
        "tags": list(job.tags),
        "metadata": job.metadata,
        "errors": list(job.errors),
        "scheduled_at": _iso(job.scheduled_at),
        "created_at": _iso(job.created_at),
        "attempted_at": _iso(job.attempted_at),
        "finalized_at": _iso(job.finalized_at),
    }


def _limit_json(limit: int | None) -> int | None:
    """A concurrency limit as users read it: None (unlimited) for NULL or <= 0."""
    return limit if limit is not None and limit > 0 else None


def _rate_json(row: Record) -> dict[str, Any]:
    """``rate_limit`` and ``rate_interval`` as users read them: both null without a rate limit
    (NULL or <= 0, as admission reads it)."""
    limit = _limit_json(row["rate_limit"])
    return {
        "rate_limit": limit,
        "rate_interval": None if limit is None else float(row["rate_interval"]),
    }


def _model_json(row: Record) -> dict[str, Any]:
    return {
        "name": row["name"],
        "enabled": row["enabled"],
        "concurrency_limit": _limit_json(row["concurrency_limit"]),
        **_rate_json(row),
        "provider": row["provider"],
        "settings": _settings(row["settings"]),
        "created_at": _iso(row["created_at"]),
        "updated_at": _iso(row["updated_at"]),
    }


def _group_json(row: Record) -> dict[str, Any]:
    return {
        "key": row["key"],
        "enabled": row["enabled"],
        "concurrency_limit": _limit_json(row["concurrency_limit"]),
        **_rate_json(row),
        "created_at": _iso(row["created_at"]),
        "updated_at": _iso(row["updated_at"]),
    }


def printable(text: str) -> str:
    """``text`` safe to print to an operator's terminal: control and format characters
    (escape sequences, a carriage return, a right-to-left override) written as escapes, so
    that what a submitter put in a task can neither drive the terminal nor disguise itself."""
    if text.isprintable():
        return text
    return "".join(
        ch.encode("unicode_escape").decode("ascii")
        if unicodedata.category(ch) in ("Cc", "Cf") or ch in "\u2028\u2029"
        else ch
        for ch in text
    )


def _cell(value: Any) -> str:
    if value is None:
        return _NONE
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, datetime):
        return _when(value)
    if isinstance(value, float):
        return f"{value:.2f}"
    return printable(str(value))


def format_table(headers: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    """A plain text table: a header line, then one line per row, columns two spaces apart."""
    cells = [[_cell(v) for v in row] for row in rows]
    widths = [len(h) for h in headers]
    for row in cells:
        widths = [max(w, len(c)) for w, c in zip(widths, row, strict=True)]
    lines = [list(headers), *cells]
    return "\n".join(
        "  ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)).rstrip() for line in lines
    )


def _when(value: datetime) -> str:
    """A timestamp for humans: local time, to the second."""
    return value.astimezone().strftime("%Y-%m-%d %H:%M:%S")


def _age(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.1f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def _limit_text(limit: int | None) -> str:
    limit = _limit_json(limit)
    return "unlimited" if limit is None else str(limit)


def _rate_text(row: Record) -> str:
    """A rate limit for humans: ``10/1s`` (10 requests per second), or ``none``."""
    rate = _rate_json(row)
    if rate["rate_limit"] is None:
        return "none"
    return f"{rate['rate_limit']}/{rate['rate_interval']:g}s"


def _compact(value: Any) -> str:
    return json.dumps(value, default=_json_default, ensure_ascii=False, separators=(",", ":"))


# ---------------------------------------------------------------------------------------------
# status


async def _cmd_status(eng: Engine, args: argparse.Namespace) -> int:
    capacity = await load_capacity(eng.db.coordination, eng.config.worker.hard_limit)
    instances = await list_instances(eng.db.coordination)
    job_counts = await eng.queue.counts()
    queue_rows = await eng.db.queue.fetch(_QUEUE_LIST)
    task_counts = await eng.counts()
    leader = await eng.db.queue.fetchrow(_LEADER_GET)
    unserved = await _unserved(eng)
    schedules = await list_schedules(eng.db.tasks)

    paused: dict[str, datetime | None] = {r["name"]: r["paused_at"] for r in queue_rows}
    queues: dict[str, dict[str, Any]] = {}
    for name in sorted({*paused, *job_counts}):
        counts = job_counts.get(name, {})
        queues[name] = {
            "paused": paused.get(name) is not None,
            "paused_at": _iso(paused.get(name)),
            "jobs": {s.value: counts.get(s.value, 0) for s in JobState},
        }
    tasks = {s.value: task_counts.get(s.value, 0) for s in TaskStatus}
    leader_doc = (
        None
        if leader is None
        else {
            "leader_id": leader["leader_id"],
            "elected_at": _iso(leader["elected_at"]),
            "expires_at": _iso(leader["expires_at"]),
        }
    )
    if args.json:
        print(
            dumps(
                {
                    "capacity": attrs.asdict(capacity),
                    "leader": leader_doc,
                    "instances": [_instance_json(i) for i in instances],
                    "queues": queues,
                    "tasks": tasks,
                    "unserved_models": unserved,
                    "schedules": [_schedule_json(x) for x in schedules],
                }
            )
        )
        return EXIT_OK

    capped = ", capped" if capacity.capped else ""
    hard = capacity.hard_limit if capacity.hard_limit > 0 else "none"
    print(f"capacity: {capacity.capacity} (desired {capacity.desired}, hard limit {hard}{capped})")
    print(
        f"catalogue: {capacity.enabled_models} enabled model(s), "
        f"{capacity.unlimited_models} unlimited; {capacity.enabled_groups} enabled group(s), "
        f"{capacity.unlimited_groups} unlimited"
    )
    if leader is None:
        print("leader: none")
    else:
        left = (leader["expires_at"] - datetime.now(UTC)).total_seconds()
        term = f"term ends in {_age(left)}" if left >= 0 else f"term expired {_age(-left)} ago"
        print(f"leader: {leader['leader_id']} ({term})")
    print()
    if instances:
        print(f"instances ({len(instances)}):")
        print(format_table(_INSTANCE_HEADERS, [_instance_row(i) for i in instances]))
    else:
        print("instances: none registered")
    print()
    if queues:
        print("queues:")
        states = [s.value for s in JobState]
        print(
            format_table(
                ["QUEUE", "PAUSED", *(s.upper() for s in states)],
                [
                    [name, q["paused"], *(q["jobs"][s] for s in states)]
                    for name, q in queues.items()
                ],
            )
        )
    else:
        print("queues: none")
    print()
    print("tasks: " + ", ".join(f"{status} {n}" for status, n in tasks.items()))
    for name, n in unserved.items():
        noun = "task" if n == 1 else "tasks"
        print(f"model {printable(name)}: {n} queued {noun}, no live instance serves it")
    if schedules:
        print()
        print(f"schedules ({len(schedules)}):")
        print(format_table(_SCHEDULE_HEADERS, [_schedule_row(x) for x in schedules]))
    return EXIT_OK


_SCHEDULE_HEADERS = ["NAME", "TIMING", "SUBMITS", "LAST PERIOD", "NEXT", "SUBMITTED", "ERROR"]


def _schedule_row(state: ScheduleState) -> list[Any]:
    submitted = str(state.fired_count)
    if state.passed_over_count:
        submitted += f" ({state.passed_over_count} passed over)"
    return [
        state.name,
        state.timing,
        state.target,
        state.last_period,
        state.next_period,
        submitted,
        state.last_error,
    ]


def _schedule_json(state: ScheduleState) -> dict[str, Any]:
    return attrs.asdict(state)


async def _cmd_schedules_list(eng: Engine, args: argparse.Namespace) -> int:
    schedules = await list_schedules(eng.db.tasks)
    if args.json:
        print(dumps({"schedules": [_schedule_json(x) for x in schedules]}))
        return EXIT_OK
    if not schedules:
        print("no schedules (a leader declares them when it starts: docs/schedules.md)")
        return EXIT_OK
    print(format_table(_SCHEDULE_HEADERS, [_schedule_row(x) for x in schedules]))
    return EXIT_OK


async def _unserved(eng: Engine) -> dict[str, int]:
    """``{model: queued live tasks}`` for the models with queued live tasks that no live
    registered instance serves: nothing claims those tasks' jobs until one does."""
    queued = {r["model"]: int(r["n"]) for r in await eng.db.tasks.fetch(_QUEUED_LIVE_BY_MODEL)}
    if not queued:
        return {}
    worker = eng.config.worker
    stale_after = worker.refresh_interval * worker.heartbeat_stale_factor
    names = await unserved_models(eng.db.coordination, queued, stale_after)
    return {name: queued[name] for name in names}


def _instance_json(info: InstanceInfo) -> dict[str, Any]:
    doc = attrs.asdict(info)
    doc["models"] = None if info.models is None else list(info.models)
    return doc


def _models_cell(models: tuple[str, ...] | None) -> str:
    if models is None:
        return "all"
    return ",".join(models) if models else "simulation only"


_INSTANCE_HEADERS: Final = (
    "INSTANCE", "STATUS", "ALLOCATED", "DESIRED", "SAFE", "ACTIVE", "PREPARING", "WAITING",
    "FINALIZING", "PRESSURE", "HEARTBEAT", "MODELS",
)  # fmt: skip


def _instance_row(i: InstanceInfo) -> list[Any]:
    pressure = i.pressure_state + (f" ({i.pressure_reason})" if i.pressure_reason else "")
    return [
        i.instance_id, i.status, i.allocated, i.desired_capacity, i.safe_capacity,
        i.active_tasks, i.preparing_tasks, i.waiting_upstream_tasks, i.finalizing_tasks,
        pressure, f"{_age(i.heartbeat_age)} ago", _models_cell(i.models),
    ]  # fmt: skip


# ---------------------------------------------------------------------------------------------
# tasks


async def _cmd_tasks_list(eng: Engine, args: argparse.Namespace) -> int:
    tasks = await eng.list_tasks(
        status=None if args.status is None else TaskStatus(args.status),
        model=args.model,
        limit=args.limit,
    )
    if args.json:
        print(dumps({"tasks": [task_json(t) for t in tasks]}))
        return EXIT_OK
    if not tasks:
        print("no tasks")
        return EXIT_OK
    print(
        format_table(
            ["ID", "STATUS", "MODEL", "MODE", "ATTEMPTS", "CREATED", "FINISHED"],
            [
                [t.id, t.status, t.model, t.run_mode, t.attempts, t.created_at, t.finished_at]
                for t in tasks
            ],
        )
    )
    print(
        f"{len(tasks)} task(s), newest first"
        + (" (--limit reached)" if len(tasks) == args.limit else "")
    )
    return EXIT_OK


async def _get_task(eng: Engine, task_id: uuid.UUID) -> Task:
    task = await eng.get(task_id)
    if task is None:
        raise TaskNotFound(f"no task {task_id}")
    return task


def _print_task(task: Task) -> None:
    identity = {k: v for k, v in task.identity.as_dict().items() if v is not None}
    fields: list[tuple[str, Any]] = [
        ("id", task.id),
        ("status", task.status),
        ("phase", task.phase),
        ("progress", f"{task.progress:.0%}"),
        ("model", task.model),
        ("group", task.group_key),
        ("run mode", task.run_mode),
        ("identity", ", ".join(f"{k}={v}" for k, v in identity.items())),
        ("attempts", task.attempts),
        ("job", task.river_job_id),
        ("owner", task.execution_owner),
        ("lease expires", task.lease_expires_at),
        ("submitted upstream", task.submitted_at),
        ("upstream ref", task.upstream_ref),
        ("cancel requested", task.cancel_requested_at),
        ("next run", task.next_run_at),
        ("created", task.created_at),
        ("started", task.started_at),
        ("finished", task.finished_at),
        ("payload", _compact(task.payload)),
        ("result", None if task.result is None else _compact(task.result)),
        ("error", None if task.error is None else _compact(task.error)),
    ]
    width = max(len(name) for name, _ in fields)
    for name, value in fields:
        print(f"{name + ':':<{width + 1}} {_cell(value)}")


async def _cmd_tasks_show(eng: Engine, args: argparse.Namespace) -> int:
    task = await _get_task(eng, args.id)
    events = await eng.events(args.id)
    if args.json:
        print(dumps({"task": task_json(task), "events": [event_json(e) for e in events]}))
        return EXIT_OK
    _print_task(task)
    print()
    if not events:
        print("events: none")
        return EXIT_OK
    print(f"events ({len(events)}):")
    print(
        format_table(
            ["AT", "TYPE", "STATUS", "PHASE", "PROGRESS", "INSTANCE", "MESSAGE"],
            [
                [
                    None if e.at is None else e.at.astimezone().strftime("%H:%M:%S.%f")[:-3],
                    e.type,
                    e.status,
                    e.phase,
                    None if e.progress is None else f"{e.progress:.0%}",
                    e.instance_id,
                    e.message,
                ]
                for e in events
            ],
        )
    )
    return EXIT_OK


async def _cmd_tasks_cancel(eng: Engine, args: argparse.Namespace) -> int:
    before = await _get_task(eng, args.id)
    if before.is_final:
        if before.status is not TaskStatus.CANCELLED:
            raise TaskError(
                f"task {args.id} already finished ({before.status.value}); nothing to cancel"
            )
        outcome, task = "already_cancelled", before
    else:
        task = await eng.cancel(args.id)
        if task.status is TaskStatus.CANCELLED:
            outcome = "cancelled"
        elif task.status is TaskStatus.RUNNING:
            outcome = "cancel_requested"
        else:  # it finished on its own meanwhile
            raise TaskError(
                f"task {args.id} already finished ({task.status.value}); nothing to cancel"
            )
    if args.json:
        print(dumps({"task": task_json(task), "outcome": outcome}))
    elif outcome == "cancel_requested":
        print(f"task {args.id}: cancel requested; its execution stops and it ends cancelled")
    elif outcome == "already_cancelled":
        print(f"task {args.id}: already cancelled")
    else:
        print(f"task {args.id}: cancelled")
    return EXIT_OK


async def retry_task(eng: Engine, task_id: uuid.UUID) -> tuple[Task, int]:
    """Put a failed, cancelled or manual_review task back to queued with a new job.

    One transaction on the tasks database: ``task_retry`` resets the task, its job is inserted
    with the options :func:`~engine.tasks.submit.submit_tasks` uses, and ``task_set_job``
    points the task at it. Returns the task as committed and its job id.

    Raises:
        TaskNotFound: no such task.
        TaskError: the task is not in a retryable status, or its previous job still runs.
    """
    queue = eng.config.queue
    rollback_timeout = eng.config.worker.enqueue_rollback_timeout
    async with eng.db.tasks.transaction(rollback_timeout=rollback_timeout) as conn:
        row = await conn.fetchrow(_TASK_RETRY, task_id, eng.instance_id)
        if row is None:
            current = await conn.fetchrow(_TASK_GET, task_id)
            if current is None:
                raise TaskNotFound(f"no task {task_id}")
            raise TaskError(_not_retryable(task_id, TaskStatus(current["status"])))
        job_id = await give_job(
            conn,
            task_id,
            row["model"],
            row["run_mode"],
            queue=queue,
            notify_channel=eng.queue.channels.insert,
            again="retry",
        )
    return await _get_task(eng, task_id), job_id


def _not_retryable(task_id: uuid.UUID, status: TaskStatus) -> str:
    allowed = "only failed, cancelled and manual_review tasks can be retried"
    if status is TaskStatus.QUEUED:
        return f"task {task_id} is queued: it has not run yet, so there is nothing to retry"
    if status is TaskStatus.RUNNING:
        return f"task {task_id} is running: cancel it first if it must start over ({allowed})"
    return f"task {task_id} is {status.value}; {allowed}"


async def _cmd_tasks_retry(eng: Engine, args: argparse.Namespace) -> int:
    task, job_id = await retry_task(eng, args.id)
    if args.json:
        print(dumps({"task": task_json(task), "job_id": job_id}))
    else:
        print(f"task {task.id}: queued again (job {job_id})")
    return EXIT_OK


def default_actor() -> str:
    """Who runs this command, for the events it records: ``user@host``."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = "unknown"
    return f"{user}@{socket.gethostname()}"


def _json_arg(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"not valid JSON: {exc}") from None


async def _cmd_tasks_resolve(eng: Engine, args: argparse.Namespace) -> int:
    if args.resubmit and not args.may_run_twice:
        raise TaskError(
            "resubmitting a manual_review task makes the upstream call again, so the work may "
            "run upstream twice; check upstream first, then pass --may-run-twice to confirm"
        )
    if args.result is not None and not args.succeeded:
        raise TaskError("--result goes only with --succeeded")
    task = await eng.resolve(
        args.id,
        succeeded=args.succeeded,
        result=args.result,
        failed=args.failed,
        resubmit=args.resubmit,
        reason=args.reason,
        actor=args.actor or default_actor(),
    )
    if args.json:
        print(dumps({"task": task_json(task)}))
    elif args.resubmit:
        print(f"task {task.id}: resubmitted (queued, job {task.river_job_id})")
    else:
        print(f"task {task.id}: marked {task.status.value}")
    return EXIT_OK


# ---------------------------------------------------------------------------------------------
# jobs and queues


async def _cmd_jobs_list(eng: Engine, args: argparse.Namespace) -> int:
    jobs = await eng.queue.list(
        state=None if args.state is None else JobState(args.state),
        queue=args.queue,
        limit=args.limit,
    )
    if args.json:
        print(dumps({"jobs": [_job_json(j) for j in jobs]}))
        return EXIT_OK
    if not jobs:
        print("no jobs")
        return EXIT_OK
    print(
        format_table(
            ["ID", "STATE", "QUEUE", "KIND", "ATTEMPT", "TASK", "SCHEDULED", "FINALIZED"],
            [
                [
                    j.id,
                    j.state,
                    j.queue,
                    j.kind,
                    f"{j.attempt}/{j.max_attempts}",
                    j.args.get("task_id"),
                    j.scheduled_at,
                    j.finalized_at,
                ]
                for j in jobs
            ],
        )
    )
    print(f"{len(jobs)} job(s), newest first")
    return EXIT_OK


async def _print_queue(eng: Engine, name: str, args: argparse.Namespace) -> int:
    # Pause and resume both create the queue's row, so it is there.
    (paused_at,) = [
        r["paused_at"] for r in await eng.db.queue.fetch(_QUEUE_LIST) if r["name"] == name
    ]
    if args.json:
        doc = {"name": name, "paused": paused_at is not None, "paused_at": _iso(paused_at)}
        print(dumps({"queue": doc}))
    elif paused_at is not None:
        print(f"queue {name}: paused since {_when(paused_at)}; running jobs go on")
    else:
        print(f"queue {name}: running (not paused)")
    return EXIT_OK


async def _known_queue(eng: Engine, name: str) -> None:
    """Refuse a queue nothing has used: a typo would create a paused queue nobody works."""
    known = {r["name"] for r in await eng.db.queue.fetch(_QUEUE_LIST)}
    known |= set(await eng.queue.counts())
    if name not in known:
        listed = ", ".join(printable(q) for q in sorted(known)) or "none yet"
        raise EngineError(
            f"no queue named {printable(name)!r}; known queues: {listed} (a queue is known once "
            "a worker or an insert has used it)"
        )


async def _cmd_queue_pause(eng: Engine, args: argparse.Namespace) -> int:
    await _known_queue(eng, args.name)
    await eng.queue.pause(args.name)
    return await _print_queue(eng, args.name, args)


async def _cmd_queue_resume(eng: Engine, args: argparse.Namespace) -> int:
    await _known_queue(eng, args.name)
    await eng.queue.resume(args.name)
    return await _print_queue(eng, args.name, args)


# ---------------------------------------------------------------------------------------------
# models and groups


async def _cmd_models_list(eng: Engine, args: argparse.Namespace) -> int:
    rows = await eng.db.coordination.fetch(_MODEL_LIST)
    if args.json:
        print(dumps({"models": [_model_json(r) for r in rows]}))
        return EXIT_OK
    if not rows:
        print("no models")
        return EXIT_OK
    print(
        format_table(
            ["NAME", "ENABLED", "LIMIT", "RATE", "PROVIDER", "UPDATED"],
            [
                [
                    r["name"],
                    r["enabled"],
                    _limit_text(r["concurrency_limit"]),
                    _rate_text(r),
                    r["provider"],
                    r["updated_at"],
                ]
                for r in rows
            ],
        )
    )
    return EXIT_OK


def _settings(value: Any) -> dict[str, Any]:
    """A model's stored settings as a mapping (anything that is not an object becomes ``{}``)."""
    return dict(value) if isinstance(value, dict) else {}


def _new_limit(args: argparse.Namespace, current: int | None) -> int | None:
    if args.unlimited:
        return None
    if args.limit is not None:
        return int(args.limit)
    return current


def _new_rate(args: argparse.Namespace, current: Record | None) -> tuple[int | None, float]:
    """The ``rate_limit`` and ``rate_interval`` to write: ``--rate``, ``--no-rate``, or what the
    catalogue holds (none for a new entry)."""
    if args.no_rate or (args.rate is None and current is None):
        return None, 1.0
    if args.rate is not None:
        limit, interval = args.rate
        return int(limit), float(interval)
    assert current is not None
    return current["rate_limit"], float(current["rate_interval"])


def _rate_arg(text: str) -> tuple[int, float]:
    """argparse type of ``--rate``: ``N/S``, N requests (an integer > 0) per S seconds (> 0)."""
    count, sep, seconds = text.strip().partition("/")
    try:
        limit = int(count)
        interval = float(seconds)
    except ValueError:
        limit, interval = 0, 0.0
    if not sep or not 0 < limit <= INT32_MAX or not 0 < interval <= 86_400 * 366:
        raise argparse.ArgumentTypeError(
            f"expected N/S (N requests, 1 to {INT32_MAX:,}, per S seconds, more than 0 and at "
            f"most a year; e.g. 10/1), got {text!r}"
        )
    return limit, interval


async def _cmd_models_set(eng: Engine, args: argparse.Namespace) -> int:
    current = await eng.db.coordination.fetchrow(_MODEL_GET, args.name)
    rate_limit, rate_interval = _new_rate(args, current)
    await eng.set_model(
        args.name,
        enabled=args.enabled
        if args.enabled is not None
        else (current is None or current["enabled"]),
        concurrency_limit=_new_limit(
            args, None if current is None else current["concurrency_limit"]
        ),
        provider=args.provider or ("simulated" if current is None else current["provider"]),
        settings=None if current is None else _settings(current["settings"]),
        rate_limit=rate_limit,
        rate_interval=rate_interval,
    )
    row = await eng.db.coordination.fetchrow(_MODEL_GET, args.name)
    assert row is not None
    if args.json:
        print(dumps({"model": _model_json(row)}))
    else:
        verb = "created" if current is None else "updated"
        state = "enabled" if row["enabled"] else "disabled"
        print(
            f"model {row['name']} {verb}: {state}, limit {_limit_text(row['concurrency_limit'])}, "
            f"rate {_rate_text(row)}, provider {row['provider']}"
        )
    return EXIT_OK


async def _cmd_groups_list(eng: Engine, args: argparse.Namespace) -> int:
    rows = await eng.db.coordination.fetch(_GROUP_LIST)
    if args.json:
        print(dumps({"groups": [_group_json(r) for r in rows]}))
        return EXIT_OK
    if not rows:
        print("no groups")
        return EXIT_OK
    print(
        format_table(
            ["KEY", "ENABLED", "LIMIT", "RATE", "UPDATED"],
            [
                [
                    r["key"],
                    r["enabled"],
                    _limit_text(r["concurrency_limit"]),
                    _rate_text(r),
                    r["updated_at"],
                ]
                for r in rows
            ],
        )
    )
    return EXIT_OK


async def _group_row(eng: Engine, key: str) -> Record | None:
    for row in await eng.db.coordination.fetch(_GROUP_LIST):
        if row["key"] == key:
            return row
    return None


async def _cmd_groups_set(eng: Engine, args: argparse.Namespace) -> int:
    current = await _group_row(eng, args.key)
    rate_limit, rate_interval = _new_rate(args, current)
    await eng.set_group(
        args.key,
        enabled=args.enabled
        if args.enabled is not None
        else (current is None or current["enabled"]),
        concurrency_limit=_new_limit(
            args, None if current is None else current["concurrency_limit"]
        ),
        rate_limit=rate_limit,
        rate_interval=rate_interval,
    )
    row = await _group_row(eng, args.key)
    assert row is not None
    if args.json:
        print(dumps({"group": _group_json(row)}))
    else:
        verb = "created" if current is None else "updated"
        state = "enabled" if row["enabled"] else "disabled"
        print(
            f"group {row['key']} {verb}: {state}, limit {_limit_text(row['concurrency_limit'])}, "
            f"rate {_rate_text(row)}"
        )
    return EXIT_OK


# ---------------------------------------------------------------------------------------------
# Parser


def _leaf(
    commands: argparse._SubParsersAction[argparse.ArgumentParser],
    name: str,
    command: EngineCommand,
    help: str,
) -> argparse.ArgumentParser:
    parser = commands.add_parser(name, help=help, description=help)
    parser.add_argument("--json", action="store_true", help="print one JSON document")
    parser.set_defaults(cli_run=_with_engine(command))
    return parser


def _group(
    commands: argparse._SubParsersAction[argparse.ArgumentParser], name: str, help: str
) -> argparse._SubParsersAction[argparse.ArgumentParser]:
    parser = commands.add_parser(name, help=help, description=help)
    return parser.add_subparsers(dest=f"{name}_command", metavar="SUBCOMMAND", required=True)


def _catalogue_options(parser: argparse.ArgumentParser) -> None:
    limit = parser.add_mutually_exclusive_group()
    limit.add_argument(
        "--limit", type=positive_int, metavar="N", help="concurrency limit (running tasks)"
    )
    limit.add_argument("--unlimited", action="store_true", help="remove the concurrency limit")
    rate = parser.add_mutually_exclusive_group()
    rate.add_argument(
        "--rate",
        type=_rate_arg,
        metavar="N/S",
        help="rate limit: at most N requests per S seconds (e.g. 10/1)",
    )
    rate.add_argument("--no-rate", action="store_true", help="remove the rate limit")
    enabled = parser.add_mutually_exclusive_group()
    enabled.add_argument("--enable", dest="enabled", action="store_const", const=True)
    enabled.add_argument("--disable", dest="enabled", action="store_const", const=False)


def add_inspect_commands(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``status``, ``tasks``, ``jobs``, ``queue``, ``models``, ``schedules`` and ``groups``
    to the CLI.

    Each leaf command stores its runner as ``cli_run`` (a :data:`CommandFn`).
    """
    _leaf(commands, "status", _cmd_status, "capacity, instances, queues, task counts, the leader")

    tasks = _group(commands, "tasks", "list, show, cancel, retry and resolve tasks")
    tasks_list = _leaf(tasks, "list", _cmd_tasks_list, "list tasks, newest first")
    tasks_list.add_argument("--status", choices=[s.value for s in TaskStatus])
    tasks_list.add_argument("--model", metavar="M")
    tasks_list.add_argument("--limit", type=positive_int, default=_DEFAULT_LIMIT, metavar="N")
    for name, command, text in [
        ("show", _cmd_tasks_show, "show a task and its events"),
        ("cancel", _cmd_tasks_cancel, "cancel a queued or running task"),
        ("retry", _cmd_tasks_retry, "queue a failed, cancelled or manual_review task again"),
    ]:
        _leaf(tasks, name, command, text).add_argument("id", type=task_id_arg, metavar="ID")
    resolve = _leaf(
        tasks,
        "resolve",
        _cmd_tasks_resolve,
        "decide a manual_review task: mark it succeeded or failed, or resubmit it",
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
        "--result", type=_json_arg, metavar="JSON", help="the result, with --succeeded"
    )
    resolve.add_argument("--reason", required=True, help="why (recorded in the task's events)")
    resolve.add_argument("--actor", help="who decides (default: user@host)")
    resolve.add_argument(
        "--may-run-twice",
        action="store_true",
        help="confirm that a resubmitted task may run upstream twice",
    )

    jobs = _group(commands, "jobs", "inspect queue jobs")
    jobs_list = _leaf(jobs, "list", _cmd_jobs_list, "list jobs, newest first")
    jobs_list.add_argument("--state", choices=[s.value for s in JobState])
    jobs_list.add_argument("--queue", metavar="Q")
    jobs_list.add_argument("--limit", type=positive_int, default=_DEFAULT_LIMIT, metavar="N")

    queue = _group(commands, "queue", "pause or resume a queue in every process")
    _leaf(queue, "pause", _cmd_queue_pause, "stop fetching from a queue").add_argument("name")
    _leaf(queue, "resume", _cmd_queue_resume, "fetch from a queue again").add_argument("name")

    models = _group(commands, "models", "the model catalogue")
    _leaf(models, "list", _cmd_models_list, "list models")
    models_set = _leaf(models, "set", _cmd_models_set, "create or change a model")
    models_set.add_argument("name", metavar="NAME")
    _catalogue_options(models_set)
    models_set.add_argument("--provider", metavar="P", help="provider of live tasks")

    schedules = _group(commands, "schedules", "periodic schedules")
    _leaf(schedules, "list", _cmd_schedules_list, "list schedules, their last and next periods")

    groups = _group(commands, "groups", "the group catalogue")
    _leaf(groups, "list", _cmd_groups_list, "list groups")
    groups_set = _leaf(groups, "set", _cmd_groups_set, "create or change a group")
    groups_set.add_argument("key", metavar="KEY")
    _catalogue_options(groups_set)
