"""Inspection and control commands of ``python -m engine``: status, tasks, jobs, queues, catalogue.

Every command opens the engine's records layer only (``engine.open(config, control=False)``: no
execution), does its reads or writes, and prints a human table (:mod:`engine.cli.render`: fit to
the terminal, statuses coloured, user data never interpreted as markup or control sequences),
or with ``--json`` (before or after the command) one JSON document on one line for scripts.
Timestamps in JSON are ISO 8601 with a UTC offset; ids of tasks are UUID strings; a progress is
a fraction rounded to four decimals (``0.1``).

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

Commands and their ``--json`` documents:

``status [--watch [SECONDS]]``
    ``{"capacity": {"desired", "capacity", "hard_limit", "capped", "enabled_models",
    "unlimited_models", "model_desired", "enabled_groups", "unlimited_groups", "group_desired"},
    "leader": {"leader_id", "elected_at", "expires_at"} | null, "instances": [INSTANCE],
    "queues": {NAME: {"paused": bool, "paused_at", "jobs": {STATE: n for every job state}}},
    "tasks": {STATUS: n for every task status}, "unserved_models": {MODEL: n},
    "schedules": [SCHEDULE]}``. ``capacity``
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
    ``--watch`` reads and shows it again every SECONDS (default 2) until Ctrl-C (exit 130): on a
    terminal redrawn in place, otherwise printed again after a blank line (with ``--json``: one
    document a line).
``tasks list [--status S] [--model M] [--tenant T] [--before ID|TIME] [--limit N]``
    ``{"tasks": [TASK]}``, newest first (by creation time, then id: a stable order). The table
    has an ``ERROR`` column (the error's code and message). ``--before ID`` is the next page:
    the tasks after task ID in that order (the table's last line names the ID to pass when
    ``--limit`` rows came back); ``--before TIME`` lists the tasks created before an ISO 8601
    time. TASK is ``{"id", "model", "group_key", "status",
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
    ``queued`` as a fresh run with a new job (SQL ``task_requeue_final``); failed and
    manual_review tasks also lose ``submitted_at`` and ``upstream_ref``, so the upstream call is
    made again. Any other status is an error (exit 1).
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
[--enable | --disable] [--provider P]`` / ``models delete NAME``
    ``{"models": [MODEL]}`` / ``{"model": MODEL}``; MODEL is ``{"name", "enabled",
    "concurrency_limit" (null: unlimited), "rate_limit" (requests per interval; null: none),
    "rate_interval" (seconds; null without a rate limit), "provider", "settings", "created_at",
    "updated_at"}``. ``--rate 10/1`` allows 10 requests per second (a token bucket of 10, refilled
    at that rate), ``--rate 30/60`` 30 a minute; ``--no-rate`` removes it. ``set`` changes only
    the options given; a new model starts enabled, unlimited, without a rate limit, on provider
    ``simulated``. Tables show the rate as ``10/1s``, which ``--rate`` accepts as it is.
    ``delete`` removes a model (``{"model": MODEL, "deleted": true}``) that no queued or running
    task uses; otherwise it refuses (exit 1) naming how many do: cancel them or let them finish
    first. Finished tasks keep the model's name; new submissions for it are refused.
``groups list`` / ``groups set KEY [--limit N | --unlimited] [--rate N/S | --no-rate]
[--enable | --disable]`` / ``groups delete KEY``
    ``{"groups": [GROUP]}`` / ``{"group": GROUP}``; GROUP is ``{"key", "enabled",
    "concurrency_limit", "rate_limit", "rate_interval", "created_at", "updated_at"}``.
    ``delete`` as for models (a group's tasks are those with that ``group_key``).
``schedules list``
    ``{"schedules": [SCHEDULE]}``: each schedule's timing, target, last and next period, counts
    and last error.

Errors are engine errors, reported by :func:`engine.cli.main.main` as ``engine: error: ...`` with
exit status 1 (``no task <id>`` for an unknown task id); a malformed option is a usage error
(exit 2).
"""

from __future__ import annotations

import argparse
import enum
import getpass
import json
import signal
import socket
import uuid
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any, Final

import attrs
import trio
from rich.console import Group, RenderableType
from rich.text import Text

from engine.capacity.refresher import CATALOG_CHANNEL
from engine.capacity.registry import InstanceInfo, list_instances, load_capacity, unserved_models
from engine.cli.args import CommandFn, format_interval, positive_int, task_id_arg
from engine.cli.main import EXIT_INTERRUPTED, EXIT_OK
from engine.cli.render import (
    Col,
    cell,
    make_console,
    print_out,
    printable,
    status_text,
    table,
    when,
)
from engine.config import EngineConfig
from engine.db.bridge import Record, asyncio_loop
from engine.db.database import DatabaseUrls, open_database
from engine.db.dsn import redact
from engine.db.migrate import pending_migrations
from engine.db.resolve import open_urls
from engine.db.sqlfiles import QUERIES
from engine.errors import EngineError, MigrationError, TaskError, TaskNotFound
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
    "check_schema",
    "default_actor",
    "dumps",
    "event_json",
    "positive_int",
    "printable",
    "retry_task",
    "run_engine_command",
    "run_until_signal",
    "run_with_engine",
    "task_id_arg",
    "task_json",
]

#: The body of an inspection command: given an open client-only engine, print, return the status.
EngineCommand = Callable[[Engine, argparse.Namespace], Awaitable[int]]

_TASK_GET: Final = QUERIES["task_get"]
_TASK_PAGE: Final = QUERIES["task_page"]
_TASK_REQUEUE_FINAL: Final = QUERIES["task_requeue_final"]
_QUEUE_LIST: Final = QUERIES["queue_list"]
_LEADER_GET: Final = QUERIES["leader_get"]
_MODEL_GET: Final = QUERIES["model_get"]
_MODEL_LIST: Final = QUERIES["model_list"]
_MODEL_DELETE: Final = QUERIES["model_delete"]
_GROUP_LIST: Final = QUERIES["group_list"]
_GROUP_DELETE: Final = QUERIES["group_delete"]
_QUEUED_LIVE_BY_MODEL: Final = QUERIES["task_count_queued_live_by_model"]
_UNFINISHED_FOR_MODEL: Final = QUERIES["task_count_unfinished_for_model"]
_UNFINISHED_FOR_GROUP: Final = QUERIES["task_count_unfinished_for_group"]

_RETRYABLE: Final = frozenset({TaskStatus.FAILED, TaskStatus.CANCELLED, TaskStatus.MANUAL_REVIEW})
#: Characters of a task's error shown in the ``tasks list`` table (the rest: ``tasks show``).
_ERROR_SHOWN: Final = 120


# ---------------------------------------------------------------------------------------------
# Opening the engine


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


async def run_until_signal(work: Callable[[], Awaitable[None]]) -> bool:
    """Run ``work`` until it returns or SIGINT/SIGTERM arrives; True if a signal stopped it.

    A watch or a follow ends this way: the engine then closes as usual, and the command exits
    with :data:`~engine.cli.main.EXIT_INTERRUPTED` (130)."""
    interrupted = False
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async with trio.open_nursery() as nursery:

            async def watch() -> None:
                nonlocal interrupted
                async for _ in signals:
                    interrupted = True
                    nursery.cancel_scope.cancel(reason="interrupted")
                    return

            nursery.start_soon(watch)
            await work()
            nursery.cancel_scope.cancel(reason="work done")
    return interrupted


def run_engine_command(args: argparse.Namespace, config: EngineConfig) -> int:
    """Run the inspection command ``args.engine_command`` (set by
    :mod:`engine.cli.commands`) with a client-only engine; ``args.readonly`` says it only
    reads."""
    command = _COMMANDS[args.engine_command]
    return run_with_engine(config, lambda eng: command(eng, args), readonly=bool(args.readonly))


# ---------------------------------------------------------------------------------------------
# JSON forms


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


def _progress(value: float | None) -> float | None:
    """A progress fraction as stored (a ``real``: 0.1 reads as 0.10000000149011612), rounded to
    four decimals for output."""
    return None if value is None else round(float(value), 4)


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
        "progress": _progress(task.progress),
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
        "progress": _progress(event.progress),
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
    """A rate limit for humans: ``10/1s`` (10 requests per second), or ``none``; ``--rate``
    accepts it as printed."""
    rate = _rate_json(row)
    if rate["rate_limit"] is None:
        return "none"
    return f"{rate['rate_limit']}/{format_interval(rate['rate_interval'])}s"


def _compact(value: Any) -> str:
    return json.dumps(value, default=_json_default, ensure_ascii=False, separators=(",", ":"))


# ---------------------------------------------------------------------------------------------
# status


# ---------------------------------------------------------------------------------------------
# status


@attrs.frozen
class _StatusRead:
    """What ``status`` read, once: its JSON document and what the human view needs more."""

    document: dict[str, Any]
    instances: list[InstanceInfo]
    schedules: list[ScheduleState]
    leader_expires_at: datetime | None


async def _read_status(eng: Engine) -> _StatusRead:
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
    leader_doc = (
        None
        if leader is None
        else {
            "leader_id": leader["leader_id"],
            "elected_at": _iso(leader["elected_at"]),
            "expires_at": _iso(leader["expires_at"]),
        }
    )
    document = {
        "capacity": attrs.asdict(capacity),
        "leader": leader_doc,
        "instances": [_instance_json(i) for i in instances],
        "queues": queues,
        "tasks": {s.value: task_counts.get(s.value, 0) for s in TaskStatus},
        "unserved_models": unserved,
        "schedules": [_schedule_json(x) for x in schedules],
    }
    return _StatusRead(
        document=document,
        instances=instances,
        schedules=schedules,
        leader_expires_at=None if leader is None else leader["expires_at"],
    )


def _status_view(read: _StatusRead) -> list[RenderableType]:
    """The human form of ``status``: lines and tables, one renderable each."""
    doc = read.document
    capacity = doc["capacity"]
    out: list[RenderableType] = []
    capped = ", capped" if capacity["capped"] else ""
    hard = capacity["hard_limit"] if capacity["hard_limit"] > 0 else "none"
    out.append(
        f"capacity: {capacity['capacity']} (desired {capacity['desired']}, hard limit {hard}"
        f"{capped})"
    )
    out.append(
        f"catalogue: {capacity['enabled_models']} enabled model(s), "
        f"{capacity['unlimited_models']} unlimited; {capacity['enabled_groups']} enabled "
        f"group(s), {capacity['unlimited_groups']} unlimited"
    )
    leader = doc["leader"]
    if leader is None or read.leader_expires_at is None:
        out.append("leader: none")
    else:
        left = (read.leader_expires_at - datetime.now(UTC)).total_seconds()
        term = f"term ends in {_age(left)}" if left >= 0 else f"term expired {_age(-left)} ago"
        out.append(f"leader: {printable(leader['leader_id'])} ({term})")
    out.append("")
    if read.instances:
        out.append(f"instances ({len(read.instances)}):")
        out.append(table(_INSTANCE_HEADERS, [_instance_row(i) for i in read.instances]))
    else:
        out.append("instances: none registered")
    out.append("")
    queues = doc["queues"]
    if queues:
        out.append("queues:")
        states = [s.value for s in JobState]
        out.append(
            table(
                ["QUEUE", "PAUSED", *(Col(s.upper(), drop=_STATE_DROP.get(s, 0)) for s in states)],
                [
                    [name, q["paused"], *(q["jobs"][s] for s in states)]
                    for name, q in queues.items()
                ],
            )
        )
    else:
        out.append("queues: none")
    out.append("")
    counts = Text("tasks: ")
    for n, (status, count) in enumerate(doc["tasks"].items()):
        if n:
            counts.append(", ")
        counts.append(status_text(status))
        counts.append(f" {count}")
    out.append(counts)
    for name, n in doc["unserved_models"].items():
        noun = "task" if n == 1 else "tasks"
        out.append(f"model {printable(name)}: {n} queued {noun}, no live instance serves it")
    if read.schedules:
        out.append("")
        out.append(f"schedules ({len(read.schedules)}):")
        out.append(table(_SCHEDULE_HEADERS, [_schedule_row(x) for x in read.schedules]))
    return out


async def _watch_status(eng: Engine, args: argparse.Namespace, interval: float) -> int:
    from rich.live import Live

    console = make_console()

    async def json_lines() -> None:
        while True:
            print(dumps((await _read_status(eng)).document), flush=True)
            await trio.sleep(interval)

    async def plain() -> None:
        first = True
        while True:
            view = _status_view(await _read_status(eng))
            print_out(console, *([] if first else [""]), f"at {when(datetime.now(UTC))}", *view)
            first = False
            await trio.sleep(interval)

    async def live() -> None:
        with Live(console=console, auto_refresh=False, vertical_overflow="crop") as screen:
            while True:
                view = _status_view(await _read_status(eng))
                head = f"at {when(datetime.now(UTC))}, every {interval:g} s (Ctrl-C to stop)"
                screen.update(Group(Text(head, style="dim"), *view), refresh=True)
                await trio.sleep(interval)

    work = json_lines if args.json else live if console.is_terminal else plain
    await run_until_signal(work)
    return EXIT_INTERRUPTED


async def _cmd_status(eng: Engine, args: argparse.Namespace) -> int:
    if args.watch is not None:
        return await _watch_status(eng, args, float(args.watch))
    read = await _read_status(eng)
    if args.json:
        print(dumps(read.document))
        return EXIT_OK
    print_out(make_console(), *_status_view(read))
    return EXIT_OK


_SCHEDULE_HEADERS: Final = (
    "NAME", "TIMING", "SUBMITS", "LAST PERIOD", "NEXT", "SUBMITTED", Col("ERROR", cut=True),
)  # fmt: skip


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
    print_out(make_console(), table(_SCHEDULE_HEADERS, [_schedule_row(x) for x in schedules]))
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
    Col("INSTANCE", keep=True), "STATUS", "ALLOCATED", Col("DESIRED", drop=3),
    Col("SAFE", drop=4), "ACTIVE", Col("PREPARING", drop=6), Col("WAITING", drop=5),
    Col("FINALIZING", drop=7), Col("PRESSURE", cut=True), Col("HEARTBEAT", drop=2),
    Col("MODELS", drop=1),
)  # fmt: skip
#: The job-state columns of ``status`` a narrow terminal leaves out first (render.Col).
_STATE_DROP: Final = {"pending": 5, "discarded": 4, "cancelled": 3, "scheduled": 2, "retryable": 1}


def _instance_row(i: InstanceInfo) -> list[Any]:
    pressure = i.pressure_state + (f" ({i.pressure_reason})" if i.pressure_reason else "")
    return [
        i.instance_id, status_text(i.status), i.allocated, i.desired_capacity, i.safe_capacity,
        i.active_tasks, i.preparing_tasks, i.waiting_upstream_tasks, i.finalizing_tasks,
        pressure, f"{_age(i.heartbeat_age)} ago", _models_cell(i.models),
    ]  # fmt: skip


# ---------------------------------------------------------------------------------------------
# tasks


# ---------------------------------------------------------------------------------------------
# tasks


def _error_text(error: Any) -> str | None:
    """A task's error in one line: ``code: message``, cut to a table's measure."""
    if error is None:
        return None
    if isinstance(error, dict) and ("code" in error or "message" in error):
        text = ": ".join(str(error[k]) for k in ("code", "message") if error.get(k) is not None)
    else:
        text = _compact(error)
    return text if len(text) <= _ERROR_SHOWN else text[: _ERROR_SHOWN - 1] + "…"


async def _cmd_tasks_list(eng: Engine, args: argparse.Namespace) -> int:
    created_before: datetime | None = None
    cursor: tuple[datetime | None, uuid.UUID | None] = (None, None)
    if isinstance(args.before, uuid.UUID):
        anchor = await _get_task(eng, args.before)
        cursor = (anchor.created_at, anchor.id)
    elif args.before is not None:
        created_before = args.before
    rows = await eng.db.tasks.fetch(
        _TASK_PAGE,
        args.status,
        args.model,
        args.tenant,
        None,  # group_key
        None,  # created at or after
        created_before,
        *cursor,
        args.limit,
    )
    tasks = [Task.from_record(r) for r in rows]
    if args.json:
        print(dumps({"tasks": [task_json(t) for t in tasks]}))
        return EXIT_OK
    if not tasks:
        print("no tasks")
        return EXIT_OK
    # On a narrow terminal the error is cut first, then MODE, ATTEMPTS, FINISHED, TENANT and
    # CREATED are left out in that order (render.Col).
    headers: list[str | Col] = [
        Col("ID", keep=True), "STATUS", "MODEL", Col("TENANT", drop=2), Col("MODE", drop=5),
        Col("ATTEMPTS", drop=4), Col("CREATED", drop=1), Col("FINISHED", drop=3),
        Col("ERROR", cut=True),
    ]  # fmt: skip
    rows_out = [
        [
            t.id, status_text(t.status), t.model, t.identity.tenant_id, t.run_mode.value,
            t.attempts, t.created_at, t.finished_at, _error_text(t.error),
        ]
        for t in tasks
    ]  # fmt: skip
    footer = f"{len(tasks)} task(s), newest first"
    if len(tasks) == args.limit:
        footer += f"; the next page: tasks list --before {tasks[-1].id}"
    print_out(make_console(), table(headers, rows_out), footer)
    return EXIT_OK


def _plain(value: Any) -> str:
    return cell(value).plain


def _print_task(task: Task) -> None:
    identity = {k: v for k, v in task.identity.as_dict().items() if v is not None}
    fields: list[tuple[str, Any]] = [
        ("id", task.id),
        ("status", task.status.value),
        ("phase", None if task.phase is None else task.phase.value),
        ("progress", f"{task.progress:.0%}"),
        ("model", task.model),
        ("group", task.group_key),
        ("run mode", task.run_mode.value),
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
        print(f"{name + ':':<{width + 1}} {_plain(value)}")


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
    print(f"events ({len(events)}):", flush=True)
    print_out(
        make_console(),
        table(
            [
                "AT",
                "TYPE",
                "STATUS",
                Col("PHASE", drop=2),
                Col("PROGRESS", drop=1),
                Col("INSTANCE", drop=3),
                Col("MESSAGE", cut=True),
            ],
            [
                [
                    None if e.at is None else e.at.astimezone().strftime("%H:%M:%S.%f")[:-3],
                    e.type,
                    None if e.status is None else status_text(e.status),
                    e.phase,
                    None if e.progress is None else f"{e.progress:.0%}",
                    e.instance_id,
                    e.message,
                ]
                for e in events
            ],
        ),
    )
    return EXIT_OK


async def _get_task(eng: Engine, task_id: uuid.UUID) -> Task:
    task = await eng.get(task_id)
    if task is None:
        raise TaskNotFound(f"no task {task_id}")
    return task


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

    One transaction on the tasks database: ``task_requeue_final`` resets the task, its job is
    inserted with the options :func:`~engine.tasks.submit.submit_tasks` uses, and ``task_set_job``
    points the task at it. Returns the task as committed and its job id.

    Raises:
        TaskNotFound: no such task.
        TaskError: the task is not in a retryable status, or its previous job still runs.
    """
    queue = eng.config.queue
    rollback_timeout = eng.config.worker.enqueue_rollback_timeout
    async with eng.db.tasks.transaction(rollback_timeout=rollback_timeout) as conn:
        row = await conn.fetchrow(
            _TASK_REQUEUE_FINAL,
            task_id,
            sorted(status.value for status in _RETRYABLE),
            "task.retried",
            "retried by an operator",
            {},
            eng.instance_id,
        )
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
    print_out(
        make_console(),
        table(
            [
                "ID",
                "STATE",
                "QUEUE",
                Col("KIND", drop=3),
                Col("ATTEMPT", drop=4),
                Col("TASK", keep=True),
                Col("SCHEDULED", drop=2),
                Col("FINALIZED", drop=1),
            ],
            [
                [
                    j.id,
                    status_text(j.state),
                    j.queue,
                    j.kind,
                    f"{j.attempt}/{j.max_attempts}",
                    j.args.get("task_id"),
                    j.scheduled_at,
                    j.finalized_at,
                ]
                for j in jobs
            ],
        ),
        f"{len(jobs)} job(s), newest first",
    )
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
        print(f"queue {printable(name)}: paused since {when(paused_at)}; running jobs go on")
    else:
        print(f"queue {printable(name)}: running (not paused)")
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
    print_out(
        make_console(),
        table(
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
        ),
    )
    return EXIT_OK


def _refuse_delete(kind: str, name: str, unfinished: int, hint: str) -> EngineError:
    noun = "task uses" if unfinished == 1 else "tasks use"
    return EngineError(
        f"{kind} {printable(name)!r} is not deleted: {unfinished} queued or running {noun} it "
        f"(`python -m engine tasks list {hint}`); cancel them or let them finish, then delete "
        "it again"
    )


async def _cmd_models_delete(eng: Engine, args: argparse.Namespace) -> int:
    name: str = args.name
    if await eng.db.coordination.fetchrow(_MODEL_GET, name) is None:
        raise EngineError(f"no model named {printable(name)!r} (see `models list`)")
    unfinished = int(await eng.db.tasks.fetchval(_UNFINISHED_FOR_MODEL, name))
    if unfinished:
        raise _refuse_delete("model", name, unfinished, f"--model {printable(name)}")
    row = await eng.db.coordination.fetchrow(_MODEL_DELETE, name, CATALOG_CHANNEL)
    if row is None:  # someone else deleted it meanwhile
        raise EngineError(f"no model named {printable(name)!r} (see `models list`)")
    if args.json:
        print(dumps({"model": _model_json(row), "deleted": True}))
    else:
        print(f"model {printable(name)} deleted")
    return EXIT_OK


async def _cmd_groups_delete(eng: Engine, args: argparse.Namespace) -> int:
    key: str = args.key
    if await _group_row(eng, key) is None:
        raise EngineError(f"no group named {printable(key)!r} (see `groups list`)")
    unfinished = int(await eng.db.tasks.fetchval(_UNFINISHED_FOR_GROUP, key))
    if unfinished:
        raise _refuse_delete("group", key, unfinished, "--status queued")
    row = await eng.db.coordination.fetchrow(_GROUP_DELETE, key, CATALOG_CHANNEL)
    if row is None:
        raise EngineError(f"no group named {printable(key)!r} (see `groups list`)")
    if args.json:
        print(dumps({"group": _group_json(row), "deleted": True}))
    else:
        print(f"group {printable(key)} deleted")
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
            f"model {printable(row['name'])} {verb}: {state}, "
            f"limit {_limit_text(row['concurrency_limit'])}, rate {_rate_text(row)}, "
            f"provider {printable(row['provider'])}"
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
    print_out(
        make_console(),
        table(
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
        ),
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
            f"group {printable(row['key'])} {verb}: {state}, "
            f"limit {_limit_text(row['concurrency_limit'])}, rate {_rate_text(row)}"
        )
    return EXIT_OK


#: The inspection commands by the key :mod:`engine.cli.commands` stores as ``engine_command``.
_COMMANDS: Final[dict[str, EngineCommand]] = {
    "status": _cmd_status,
    "tasks list": _cmd_tasks_list,
    "tasks show": _cmd_tasks_show,
    "tasks cancel": _cmd_tasks_cancel,
    "tasks retry": _cmd_tasks_retry,
    "tasks resolve": _cmd_tasks_resolve,
    "jobs list": _cmd_jobs_list,
    "queue pause": _cmd_queue_pause,
    "queue resume": _cmd_queue_resume,
    "models list": _cmd_models_list,
    "models set": _cmd_models_set,
    "models delete": _cmd_models_delete,
    "schedules list": _cmd_schedules_list,
    "groups list": _cmd_groups_list,
    "groups set": _cmd_groups_set,
    "groups delete": _cmd_groups_delete,
}
