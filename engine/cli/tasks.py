"""``python -m engine tasks list|show|cancel|retry|resolve``: inspect and control tasks.

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
    ``queued`` as a fresh run with a new job (``Engine.retry``); failed and
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

``list`` and ``show`` only read; the others write (:mod:`engine.cli.common`). An unknown task id
is an error: ``no task <id>`` (exit 1).
"""

from __future__ import annotations

import argparse
import uuid
from datetime import datetime
from typing import Any, Final

from engine.cli.common import default_actor
from engine.cli.exits import EXIT_OK
from engine.cli.formats import compact, dumps, event_json, task_json
from engine.cli.render import Col, cell, make_console, print_out, status_text, table
from engine.db.sqlfiles import QUERIES
from engine.domain.tasks import Task, TaskStatus
from engine.errors import TaskError, TaskNotFound
from engine.service.engine import Engine

__all__ = [
    "cmd_tasks_cancel",
    "cmd_tasks_list",
    "cmd_tasks_resolve",
    "cmd_tasks_retry",
    "cmd_tasks_show",
]

_TASK_PAGE: Final = QUERIES["task_page"]
#: Characters of a task's error shown in the ``tasks list`` table (the rest: ``tasks show``).
_ERROR_SHOWN: Final = 120


def _error_text(error: Any) -> str | None:
    """A task's error in one line: ``code: message``, cut to a table's measure."""
    if error is None:
        return None
    if isinstance(error, dict) and ("code" in error or "message" in error):
        text = ": ".join(str(error[k]) for k in ("code", "message") if error.get(k) is not None)
    else:
        text = compact(error)
    return text if len(text) <= _ERROR_SHOWN else text[: _ERROR_SHOWN - 1] + "…"


async def cmd_tasks_list(eng: Engine, args: argparse.Namespace) -> int:
    """``tasks list``: a page of tasks, newest first."""
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
        ("payload", compact(task.payload)),
        ("result", None if task.result is None else compact(task.result)),
        ("error", None if task.error is None else compact(task.error)),
    ]
    width = max(len(name) for name, _ in fields)
    for name, value in fields:
        print(f"{name + ':':<{width + 1}} {_plain(value)}")


async def cmd_tasks_show(eng: Engine, args: argparse.Namespace) -> int:
    """``tasks show ID``: a task and its events."""
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


async def cmd_tasks_cancel(eng: Engine, args: argparse.Namespace) -> int:
    """``tasks cancel ID`` (:meth:`~engine.service.engine.Engine.cancel`)."""
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


async def cmd_tasks_retry(eng: Engine, args: argparse.Namespace) -> int:
    """``tasks retry ID`` (:meth:`~engine.service.engine.Engine.retry`)."""
    task = await eng.retry(args.id)
    if args.json:
        print(dumps({"task": task_json(task), "job_id": task.river_job_id}))
    else:
        print(f"task {task.id}: queued again (job {task.river_job_id})")
    return EXIT_OK


async def cmd_tasks_resolve(eng: Engine, args: argparse.Namespace) -> int:
    """``tasks resolve ID ...`` (:meth:`~engine.service.engine.Engine.resolve`)."""
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
