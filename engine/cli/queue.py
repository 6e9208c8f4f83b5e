"""``python -m engine jobs list`` and ``queue pause|resume``: the queue's jobs, and its switch.

``jobs list [--state S] [--queue Q] [--limit N]``
    ``{"jobs": [{"id", "state", "kind", "queue", "priority", "attempt", "max_attempts", "args",
    "tags", "metadata", "errors", "scheduled_at", "created_at", "attempted_at",
    "finalized_at"}]}``, newest first.
``queue pause NAME`` / ``queue resume NAME``
    ``{"queue": {"name", "paused", "paused_at"}}``: fetching from the queue stops (resumes) in
    every process; running jobs go on. A queue nothing has used yet is refused (exit 1): a typo
    would create a paused queue nobody works.

``jobs list`` only reads; ``queue`` writes (:mod:`engine.cli.common`).
"""

from __future__ import annotations

import argparse
from typing import Final

from engine.cli.exits import EXIT_OK
from engine.cli.formats import dumps, iso, job_json
from engine.cli.render import Col, make_console, print_out, printable, status_text, table, when
from engine.db.sqlfiles import QUERIES
from engine.errors import EngineError
from engine.queue.states import JobState
from engine.service.engine import Engine

__all__ = ["cmd_jobs_list", "cmd_queue_pause", "cmd_queue_resume"]

_QUEUE_LIST: Final = QUERIES["queue_list"]


async def cmd_jobs_list(eng: Engine, args: argparse.Namespace) -> int:
    """``jobs list``: queue jobs, newest first."""
    jobs = await eng.queue.list(
        state=None if args.state is None else JobState(args.state),
        queue=args.queue,
        limit=args.limit,
    )
    if args.json:
        print(dumps({"jobs": [job_json(j) for j in jobs]}))
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
        doc = {"name": name, "paused": paused_at is not None, "paused_at": iso(paused_at)}
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


async def cmd_queue_pause(eng: Engine, args: argparse.Namespace) -> int:
    """``queue pause NAME``: stop fetching from a known queue everywhere."""
    await _known_queue(eng, args.name)
    await eng.queue.pause(args.name)
    return await _print_queue(eng, args.name, args)


async def cmd_queue_resume(eng: Engine, args: argparse.Namespace) -> int:
    """``queue resume NAME``: fetch from it again."""
    await _known_queue(eng, args.name)
    await eng.queue.resume(args.name)
    return await _print_queue(eng, args.name, args)
