"""``python -m engine status`` and ``schedules list``: the state of the engine as a whole.

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
``schedules list``
    ``{"schedules": [SCHEDULE]}``: each schedule's timing, target, last and next period, counts
    and last error.

Both only read (:mod:`engine.cli.common`).
"""

from __future__ import annotations

import argparse
from datetime import UTC, datetime
from typing import Any, Final

import attrs
import trio
from rich.console import Group, RenderableType
from rich.live import Live
from rich.text import Text

from engine.capacity.registry import InstanceInfo, list_instances, load_capacity, unserved_models
from engine.cli.exits import EXIT_INTERRUPTED, EXIT_OK
from engine.cli.formats import age, dumps, instance_json, iso, schedule_json
from engine.cli.render import Col, make_console, print_out, printable, status_text, table, when
from engine.cli.signals import run_until_signal
from engine.db.sqlfiles import QUERIES
from engine.domain.tasks import TaskStatus
from engine.queue.states import JobState
from engine.schedules.status import ScheduleState, list_schedules
from engine.service.engine import Engine

__all__ = ["cmd_schedules_list", "cmd_status"]

_QUEUE_LIST: Final = QUERIES["queue_list"]
_LEADER_GET: Final = QUERIES["leader_get"]
_QUEUED_LIVE_BY_MODEL: Final = QUERIES["task_count_queued_live_by_model"]


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
            "paused_at": iso(paused.get(name)),
            "jobs": {s.value: counts.get(s.value, 0) for s in JobState},
        }
    leader_doc = (
        None
        if leader is None
        else {
            "leader_id": leader["leader_id"],
            "elected_at": iso(leader["elected_at"]),
            "expires_at": iso(leader["expires_at"]),
        }
    )
    document = {
        "capacity": attrs.asdict(capacity),
        "leader": leader_doc,
        "instances": [instance_json(i) for i in instances],
        "queues": queues,
        "tasks": {s.value: task_counts.get(s.value, 0) for s in TaskStatus},
        "unserved_models": unserved,
        "schedules": [schedule_json(x) for x in schedules],
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
        term = f"term ends in {age(left)}" if left >= 0 else f"term expired {age(-left)} ago"
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


async def cmd_status(eng: Engine, args: argparse.Namespace) -> int:
    """``status [--watch [SECONDS]]``; see the module docstring."""
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


async def cmd_schedules_list(eng: Engine, args: argparse.Namespace) -> int:
    """``schedules list``; see the module docstring."""
    schedules = await list_schedules(eng.db.tasks)
    if args.json:
        print(dumps({"schedules": [schedule_json(x) for x in schedules]}))
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
        pressure, f"{age(i.heartbeat_age)} ago", _models_cell(i.models),
    ]  # fmt: skip
