"""``python -m engine submit``: submit tasks from the command line, and optionally watch them.

``submit --model M [--count N] [--payload JSON] [--tenant T] [--user U] [--simulation | --live]
[--follow] [--json]`` submits N tasks (default 1) for model M in one transaction, each with the
same payload (default ``{}``) and identity (tenant ``cli``, user ``cli`` unless given), in run
mode ``simulation`` unless ``--live``. It opens the engine client-only: the tasks run wherever
executing engines (``engine run``) are.

Output: the task ids, one a line, or for more than :data:`MAX_IDS_SHOWN` tasks one summary line
(``submitted 200 tasks (model M, simulation): first <id>, last <id>``).

``--follow`` then watches the tasks until every one is final (succeeded, failed, cancelled or
manual_review). It reads their statuses in one query per refresh (``task_count_by_status_for_ids``,
every :data:`REFRESH_INTERVAL` seconds). On a terminal it redraws a one-line progress bar with
``\\r`` (counts per status and the elapsed time); otherwise it prints a plain line when the
counts changed, at most once per :data:`LINE_INTERVAL` seconds. It ends with a summary line such
as ``200 tasks: 189 succeeded, 11 failed (12.3 s)``, the time counted from the submission.

``--json`` prints one JSON document on stdout (progress and the summary line then go to
stderr)::

    {"ids": [ID, ...], "count": n, "model": M, "run_mode": "simulation" | "live"}

and with ``--follow`` also ``"counts": {STATUS: n}`` (the statuses of the tasks at the end),
``"elapsed"`` (seconds) and ``"interrupted"`` (bool).

Exit status: 0 once submitted, and with ``--follow`` once every task is final, however many
failed; 1 on an error (``engine: error: ...``, e.g. an unknown model: nothing is stored) or when
SIGINT/SIGTERM stops ``--follow`` (the tasks go on; the summary says ``interrupted``); 2 for a
malformed option (``--payload`` that is not JSON). Ctrl-C during the submission itself exits 130.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import uuid
from collections.abc import Sequence
from typing import Any, Final, TextIO

import attrs
import trio

from engine.cli.inspect import dumps, positive_int, run_with_engine
from engine.cli.main import EXIT_ERROR, EXIT_OK
from engine.config import EngineConfig
from engine.db.sqlfiles import QUERIES
from engine.service.engine import Engine
from engine.tasks.models import FINAL_STATUSES, Identity, RunMode, TaskRequest, TaskStatus

__all__ = [
    "LINE_INTERVAL",
    "MAX_IDS_SHOWN",
    "REFRESH_INTERVAL",
    "Progress",
    "ProgressDisplay",
    "add_submit_command",
    "follow_tasks",
    "run_submit",
]

#: More tasks than this are reported with one summary line instead of their ids.
MAX_IDS_SHOWN: Final = 10
#: Seconds between two status reads of ``--follow``.
REFRESH_INTERVAL: Final = 0.25
#: Least seconds between two progress lines when the output is not a terminal.
LINE_INTERVAL: Final = 1.0

_COUNT_FOR_IDS: Final = QUERIES["task_count_by_status_for_ids"]
_BAR_WIDTH: Final = 24
# Display order: where tasks are going, then where they ended.
_ORDER: Final = (
    TaskStatus.QUEUED,
    TaskStatus.RUNNING,
    TaskStatus.SUCCEEDED,
    TaskStatus.FAILED,
    TaskStatus.CANCELLED,
    TaskStatus.MANUAL_REVIEW,
)
_SUMMARY_ORDER: Final = (*_ORDER[2:], *_ORDER[:2])


def _json_arg(text: str) -> Any:
    """argparse type: any JSON value."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"not valid JSON ({exc})") from None


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


@attrs.define
class Progress:
    """What ``--follow`` knows about the submitted tasks.

    Attributes:
        total: the number of tasks followed.
        counts: tasks per status at the last read.
        elapsed: seconds from the submission to the last read.
    """

    total: int
    counts: dict[str, int] = attrs.field(factory=dict)
    elapsed: float = 0.0

    @property
    def final(self) -> int:
        """Tasks in a final status."""
        return sum(n for status, n in self.counts.items() if status in FINAL_STATUSES)

    @property
    def missing(self) -> int:
        """Tasks that vanished (deleted by someone): counted as done, they never finish."""
        return max(0, self.total - sum(self.counts.values()))

    @property
    def done(self) -> bool:
        """True once every task is final (or gone)."""
        return self.final + self.missing >= self.total

    def parts(self, order: Sequence[TaskStatus]) -> list[str]:
        """``"<n> <status>"`` for each status with tasks, in ``order``; then any others."""
        known = [s.value for s in order]
        out = [f"{self.counts[s]} {s}" for s in known if self.counts.get(s)]
        out += [f"{n} {s}" for s, n in sorted(self.counts.items()) if s not in known and n]
        if self.missing:
            out.append(f"{self.missing} missing")
        return out

    def summary(self, *, interrupted: bool = False) -> str:
        """The closing line: ``200 tasks: 189 succeeded, 11 failed (12.3 s)``."""
        when = f"interrupted after {self.elapsed:.1f} s" if interrupted else f"{self.elapsed:.1f} s"
        parts = ", ".join(self.parts(_SUMMARY_ORDER)) or "none found"
        return f"{_plural(self.total, 'task')}: {parts} ({when})"


class ProgressDisplay:
    """Shows :class:`Progress` on ``stream``: a bar redrawn in place on a terminal, else plain
    lines when the counts change, at most one per ``line_interval`` seconds."""

    def __init__(
        self, stream: TextIO, *, tty: bool | None = None, line_interval: float = LINE_INTERVAL
    ) -> None:
        self.stream = stream
        self.tty = stream.isatty() if tty is None else tty
        self.line_interval = line_interval
        self._last_line: tuple[float, str] | None = None
        self._drawn = False

    def _counts_text(self, progress: Progress) -> str:
        return ", ".join(progress.parts(_ORDER)) or "waiting"

    def update(self, progress: Progress) -> None:
        """Show the latest read."""
        if self.tty:
            filled = round(_BAR_WIDTH * progress.final / progress.total) if progress.total else 0
            bar = "#" * filled + "-" * (_BAR_WIDTH - filled)
            self.stream.write(
                f"\r[{bar}] {progress.final}/{progress.total} final  "
                f"{self._counts_text(progress)}  {progress.elapsed:.1f} s\x1b[K"
            )
            self.stream.flush()
            self._drawn = True
            return
        text = f"{progress.final}/{progress.total} final: {self._counts_text(progress)}"
        last = self._last_line
        if last is not None and (
            last[1] == text or progress.elapsed - last[0] < self.line_interval
        ):
            return
        self._last_line = (progress.elapsed, text)
        print(f"{text} ({progress.elapsed:.1f} s)", file=self.stream, flush=True)

    def finish(self, progress: Progress, *, interrupted: bool = False) -> None:
        """Replace the bar (if any) with the summary line."""
        if self._drawn:
            self.stream.write("\r\x1b[K")
        print(progress.summary(interrupted=interrupted), file=self.stream, flush=True)


async def follow_tasks(
    engine: Engine,
    ids: Sequence[uuid.UUID],
    progress: Progress,
    display: ProgressDisplay,
    *,
    started: float,
    interval: float = REFRESH_INTERVAL,
) -> None:
    """Read the tasks' statuses every ``interval`` seconds into ``progress`` and show them,
    until every task is final. ``started`` is the ``trio.current_time()`` of the submission."""
    id_list = list(ids)
    while True:
        rows = await engine.db.tasks.fetch(_COUNT_FOR_IDS, id_list)
        progress.counts = {r["status"]: int(r["n"]) for r in rows}
        progress.elapsed = trio.current_time() - started
        display.update(progress)
        if progress.done:
            return
        await trio.sleep(interval)


async def _follow_until_signal(
    engine: Engine,
    ids: Sequence[uuid.UUID],
    progress: Progress,
    display: ProgressDisplay,
    *,
    started: float,
) -> bool:
    """:func:`follow_tasks`, stopped by SIGINT or SIGTERM; True if a signal stopped it."""
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
            await follow_tasks(engine, ids, progress, display, started=started)
            nursery.cancel_scope.cancel(reason="all tasks final")
    return interrupted


def _print_submitted(ids: Sequence[uuid.UUID], model: str, mode: RunMode) -> None:
    if len(ids) <= MAX_IDS_SHOWN:
        for task_id in ids:
            print(task_id)
    else:
        print(
            f"submitted {len(ids)} tasks (model {model}, {mode.value}): "
            f"first {ids[0]}, last {ids[-1]}"
        )
    sys.stdout.flush()


def run_submit(args: argparse.Namespace, config: EngineConfig) -> int:
    """Run ``submit`` as parsed by :func:`add_submit_command`; return the exit status."""
    mode = RunMode(args.run_mode)
    payload: Any = {} if args.payload is None else args.payload
    identity = Identity(tenant_id=args.tenant, user_id=args.user)

    async def body(engine: Engine) -> int:
        requests = [
            TaskRequest(model=args.model, payload=payload, identity=identity, run_mode=mode)
            for _ in range(args.count)
        ]
        started = trio.current_time()
        ids = await engine.submit(requests)
        document: dict[str, Any] = {
            "ids": [str(i) for i in ids],
            "count": len(ids),
            "model": args.model,
            "run_mode": mode.value,
        }
        if not args.json:
            _print_submitted(ids, args.model, mode)
        if not args.follow:
            if args.json:
                print(dumps(document))
            return EXIT_OK
        display = ProgressDisplay(sys.stderr if args.json else sys.stdout)
        progress = Progress(total=len(ids))
        interrupted = await _follow_until_signal(engine, ids, progress, display, started=started)
        display.finish(progress, interrupted=interrupted)
        if args.json:
            document.update(
                counts=dict(progress.counts),
                elapsed=round(progress.elapsed, 3),
                interrupted=interrupted,
            )
            print(dumps(document))
        if interrupted:
            print("engine: interrupted; the tasks go on (see `engine tasks list`)", file=sys.stderr)
            return EXIT_ERROR
        return EXIT_OK

    return run_with_engine(config, body)


def add_submit_command(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``submit`` to the CLI; it stores :func:`run_submit` as ``cli_run``."""
    help = "submit tasks (--follow: watch them until they finish)"
    parser = commands.add_parser("submit", help=help, description=help)
    parser.add_argument("--model", required=True, metavar="M", help="the model to run")
    parser.add_argument(
        "--count", type=positive_int, default=1, metavar="N", help="tasks to submit (default 1)"
    )
    parser.add_argument(
        "--payload", type=_json_arg, metavar="JSON", help="the payload of each task (default {})"
    )
    parser.add_argument("--tenant", default="cli", metavar="T", help="tenant id (default cli)")
    parser.add_argument("--user", default="cli", metavar="U", help="user id (default cli)")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument(
        "--simulation",
        dest="run_mode",
        action="store_const",
        const=RunMode.SIMULATION.value,
        help="run on the simulated provider (the default)",
    )
    mode.add_argument(
        "--live",
        dest="run_mode",
        action="store_const",
        const=RunMode.LIVE.value,
        help="call the model's provider",
    )
    parser.set_defaults(run_mode=RunMode.SIMULATION.value, cli_run=run_submit)
    parser.add_argument(
        "--follow", action="store_true", help="show progress until every task is final"
    )
    parser.add_argument("--json", action="store_true", help="print one JSON document")
