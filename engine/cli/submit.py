"""``python -m engine submit``: submit tasks from the command line, and optionally watch them.

``submit --model M [--count N] [--payload JSON|@FILE|-] [--tenant T] [--user U] [--simulation |
--live] [--follow] [--json]`` submits N tasks (default 1, at most
:data:`~engine.cli.args.MAX_SUBMIT_COUNT`) for model M, each with the same payload (default
``{}``; ``@FILE`` reads the JSON from a file, ``-`` from standard input) and identity (tenant
``cli``, user ``cli`` unless given), in run mode ``simulation`` unless ``--live``. It opens the
engine client-only: the tasks run wherever executing engines (``engine run``) are.

The tasks are built and stored :data:`SUBMIT_BATCH` at a time, each batch in one transaction,
so a million tasks never sit in memory as requests (their ids are kept, 16 bytes each). A
count up to :data:`SUBMIT_BATCH` is therefore one transaction: all stored or none. Past it, if a
batch fails the earlier batches stay stored, and the error says how many tasks were.

Output: the task ids, one a line, or for more than :data:`MAX_IDS_SHOWN` tasks one summary line
(``submitted 200 tasks (model M, simulation): first <id>, last <id>``).

``--follow`` then watches the tasks until every one is final (succeeded, failed, cancelled or
manual_review). It reads their statuses every :data:`REFRESH_INTERVAL` seconds, in queries of
:data:`FOLLOW_CHUNK` ids (``task_count_by_status_for_ids``), and stops reading a chunk once all
its tasks are final. First it checks the instance registry: when no live instance serves the
model (``--live``), or no engine instance is live at all (``--simulation``), it warns once on
stderr (the tasks stay queued until one does) and follows anyway.

On a terminal the progress is one line redrawn in place (rich): a bar as wide as the terminal
allows, final/total, percent, the rate of tasks becoming final (per second), the ETA, the
elapsed time and the counts per status, cut with an ellipsis rather than wrapped, so the line
never scrolls. Otherwise it prints a plain line when the counts changed, at most once per
:data:`LINE_INTERVAL` seconds (``16/200 final: 168 queued, 16 running, 16 succeeded (3.2 s)``).
It ends with a summary line such as ``200 tasks: 189 succeeded, 11 failed (12.3 s)``, the time
counted from the submission.

``--json`` prints one JSON document on stdout (progress and the summary line then go to
stderr)::

    {"count": n, "model": M, "run_mode": "simulation" | "live", "ids": [ID, ...]}

and with ``--follow`` also ``"counts": {STATUS: n}`` (the statuses of the tasks at the end),
``"elapsed"`` (seconds) and ``"interrupted"`` (bool).

Exit status: 0 once submitted, and with ``--follow`` once every task is final, however many
failed; 1 on an error (``engine: error: ...``, e.g. an unknown model: nothing is stored); 2 for
a malformed option (``--payload`` that is not JSON, ``--count`` above the cap); 130 when SIGINT
or SIGTERM stops ``--follow`` (the tasks go on; the summary says ``interrupted``), or Ctrl-C
during the submission.
"""

from __future__ import annotations

import argparse
import sys
import uuid
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, Final, TextIO

import attrs
import trio
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    ProgressColumn,
    TaskProgressColumn,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.progress import Progress as RichProgress
from rich.progress import Task as RichTask
from rich.table import Column
from rich.text import Text

from engine.capacity.registry import unserved_models
from engine.cli.common import run_with_engine
from engine.cli.exits import EXIT_INTERRUPTED, EXIT_OK
from engine.cli.formats import dumps
from engine.cli.render import STATUS_STYLES, make_console, printable
from engine.cli.signals import run_until_signal
from engine.config import EngineConfig
from engine.db.sqlfiles import QUERIES
from engine.domain.tasks import FINAL_STATUSES, Identity, RunMode, TaskRequest, TaskStatus
from engine.service.engine import Engine

__all__ = [
    "FOLLOW_CHUNK",
    "LINE_INTERVAL",
    "MAX_IDS_SHOWN",
    "REFRESH_INTERVAL",
    "SUBMIT_BATCH",
    "Progress",
    "ProgressDisplay",
    "TaskIds",
    "follow_tasks",
    "run_submit",
    "unserved_warning",
]

#: More tasks than this are reported with one summary line instead of their ids.
MAX_IDS_SHOWN: Final = 10
#: Tasks built and stored per transaction.
SUBMIT_BATCH: Final = 1_000
#: Ids per status query of ``--follow``.
FOLLOW_CHUNK: Final = 10_000
#: Seconds between two status reads of ``--follow``.
REFRESH_INTERVAL: Final = 0.25
#: Least seconds between two progress lines when the output is not a terminal.
LINE_INTERVAL: Final = 1.0

_COUNT_FOR_IDS: Final = QUERIES["task_count_by_status_for_ids"]
_LIVE_INSTANCES: Final = QUERIES["worker_instance_list_active"]
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


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


class TaskIds:
    """Task ids in submission order, 16 bytes each (a million take 16 MB, not hundreds)."""

    def __init__(self, ids: Iterable[uuid.UUID] = ()) -> None:
        self._raw = bytearray()
        self.extend(ids)

    def extend(self, ids: Iterable[uuid.UUID]) -> None:
        """Append ``ids``."""
        for task_id in ids:
            self._raw += task_id.bytes

    def __len__(self) -> int:
        return len(self._raw) // 16

    def __iter__(self) -> Iterator[uuid.UUID]:
        for start in range(0, len(self._raw), 16):
            yield uuid.UUID(bytes=bytes(self._raw[start : start + 16]))

    def slice(self, start: int, stop: int) -> list[uuid.UUID]:
        """The ids from ``start`` to ``stop`` (exclusive)."""
        raw = self._raw[start * 16 : stop * 16]
        return [uuid.UUID(bytes=bytes(raw[i : i + 16])) for i in range(0, len(raw), 16)]

    def __getitem__(self, index: int) -> uuid.UUID:
        if index < 0:
            index += len(self)
        if not 0 <= index < len(self):
            raise IndexError(index)
        return uuid.UUID(bytes=bytes(self._raw[index * 16 : index * 16 + 16]))


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
    #: The sum of the running tasks' progress (0..1 each, moved by their providers' reports).
    running_progress: float = 0.0

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

    def parts(self, order: Sequence[TaskStatus], *, live: bool = False) -> list[str]:
        """``"<n> <status>"`` for each status with tasks, in ``order``; then any others.
        ``live`` (the lines shown while following): the running ones carry their average
        progress once they report any, ``3 running at 42%``."""
        return [self._label(status, n, live=live) for status, n in self._parts(order)]

    def _parts(self, order: Sequence[TaskStatus]) -> list[tuple[str, int]]:
        known = [s.value for s in order]
        out = [(s, self.counts[s]) for s in known if self.counts.get(s)]
        out += [(s, n) for s, n in sorted(self.counts.items()) if s not in known and n]
        if self.missing:
            out.append(("missing", self.missing))
        return out

    def _label(self, status: str, n: int, *, live: bool) -> str:
        # While following, running tasks show how far they are on average (their providers'
        # reports): long tasks move between reads.
        if live and status == "running" and n and self.running_progress > 0:
            return f"{n} running at {round(100 * self.running_progress / n)}%"
        return f"{n} {status}"

    def counts_text(self) -> Text:
        """The counts per status, each coloured as its status (on a terminal)."""
        text = Text()
        for n, (status, count) in enumerate(self._parts(_ORDER)):
            if n:
                text.append(", ")
            text.append(self._label(status, count, live=True), style=STATUS_STYLES.get(status, ""))
        return text if text.plain else Text("waiting")

    def summary(self, *, interrupted: bool = False) -> str:
        """The closing line: ``200 tasks: 189 succeeded, 11 failed (12.3 s)``."""
        when = f"interrupted after {self.elapsed:.1f} s" if interrupted else f"{self.elapsed:.1f} s"
        parts = ", ".join(self.parts(_SUMMARY_ORDER)) or "none found"
        return f"{_plural(self.total, 'task')}: {parts} ({when})"


class _RateColumn(ProgressColumn):
    """Tasks becoming final per second, over rich's speed window (the last 30 s)."""

    def render(self, task: RichTask) -> Text:
        speed = task.finished_speed or task.speed
        return Text("-/s" if speed is None else f"{speed:,.1f}/s")


class _CountsColumn(ProgressColumn):
    """The counts per status, coloured as their statuses, cut with an ellipsis."""

    def render(self, task: RichTask) -> Text:
        counts = task.fields.get("counts")
        text = counts.copy() if isinstance(counts, Text) else Text(str(counts or ""))
        text.no_wrap = True
        text.overflow = "ellipsis"
        return text


def _bar(console: Console) -> RichProgress:
    """The one-line progress of a terminal: every column but the bar and the counts keeps its
    width; the bar takes what is left (at least 5 cells) and the counts are cut with an
    ellipsis, so the line never wraps."""
    return RichProgress(
        BarColumn(bar_width=None, table_column=Column(ratio=1, min_width=5)),
        MofNCompleteColumn(table_column=Column(no_wrap=True)),
        TaskProgressColumn(table_column=Column(no_wrap=True)),
        _RateColumn(table_column=Column(no_wrap=True)),
        TextColumn("ETA", table_column=Column(no_wrap=True)),
        TimeRemainingColumn(table_column=Column(no_wrap=True)),
        TimeElapsedColumn(table_column=Column(no_wrap=True)),
        _CountsColumn(table_column=Column(no_wrap=True, overflow="ellipsis", ratio=2)),
        console=console,
        expand=True,
        auto_refresh=False,
        transient=True,
        redirect_stdout=False,
        redirect_stderr=False,
    )


class ProgressDisplay:
    """Shows :class:`Progress` on ``stream``: on a terminal one line redrawn in place (a rich
    progress bar with rate and ETA), else plain lines when the counts change, at most one per
    ``line_interval`` seconds."""

    def __init__(
        self,
        stream: TextIO,
        *,
        tty: bool | None = None,
        line_interval: float = LINE_INTERVAL,
        console: Console | None = None,
    ) -> None:
        self.stream = stream
        self.tty = stream.isatty() if tty is None else tty
        self.line_interval = line_interval
        self._last_line: tuple[float, str] | None = None
        self._console = console
        self._bar: RichProgress | None = None
        self._task: Any = None

    def _start_bar(self, total: int) -> RichProgress:
        console = self._console or make_console(self.stream)
        bar = _bar(console)
        self._task = bar.add_task("follow", total=total, counts=Text("waiting"))
        bar.start()
        self._bar = bar
        return bar

    def update(self, progress: Progress) -> None:
        """Show the latest read."""
        if self.tty:
            bar = self._bar or self._start_bar(progress.total)
            bar.update(self._task, completed=progress.final, counts=progress.counts_text())
            bar.refresh()
            return
        counts = ", ".join(progress.parts(_ORDER, live=True)) or "waiting"
        text = f"{progress.final}/{progress.total} final: {counts}"
        last = self._last_line
        if last is not None and (
            last[1] == text or progress.elapsed - last[0] < self.line_interval
        ):
            return
        self._last_line = (progress.elapsed, text)
        print(f"{text} ({progress.elapsed:.1f} s)", file=self.stream, flush=True)

    def close(self) -> None:
        """Take the bar (if any) off the terminal."""
        if self._bar is not None:
            self._bar.stop()
            self._bar = None

    def finish(self, progress: Progress, *, interrupted: bool = False) -> None:
        """Replace the bar (if any) with the summary line."""
        self.close()
        print(progress.summary(interrupted=interrupted), file=self.stream, flush=True)


async def follow_tasks(
    engine: Engine,
    ids: TaskIds,
    progress: Progress,
    display: ProgressDisplay,
    *,
    started: float,
    interval: float = REFRESH_INTERVAL,
) -> None:
    """Read the tasks' statuses every ``interval`` seconds into ``progress`` and show them,
    until every task is final. ``started`` is the ``trio.current_time()`` of the submission.

    The ids are read :data:`FOLLOW_CHUNK` at a time, and a chunk whose tasks were all final (or
    gone) is not read again: a task retried after that still counts as it ended."""
    settled: dict[str, int] = {}
    open_chunks = [
        (start, min(start + FOLLOW_CHUNK, len(ids))) for start in range(0, len(ids), FOLLOW_CHUNK)
    ]
    while True:
        moving: dict[str, int] = {}
        working = 0.0
        still_open = []
        for start, stop in open_chunks:
            rows = await engine.db.tasks.fetch(_COUNT_FOR_IDS, ids.slice(start, stop))
            counts = {r["status"]: int(r["n"]) for r in rows}
            working += sum(float(r["progress"]) for r in rows if r["status"] == "running")
            final = sum(n for s, n in counts.items() if s in FINAL_STATUSES)
            gone = (stop - start) - sum(counts.values())
            if final + gone >= stop - start:
                target = settled
            else:
                target = moving
                still_open.append((start, stop))
            for status, n in counts.items():
                target[status] = target.get(status, 0) + n
        open_chunks = still_open
        progress.counts = {s: settled.get(s, 0) + moving.get(s, 0) for s in {*settled, *moving}}
        progress.running_progress = working
        progress.elapsed = trio.current_time() - started
        display.update(progress)
        if progress.done:
            return
        await trio.sleep(interval)


async def unserved_warning(engine: Engine, model: str, mode: RunMode) -> str | None:
    """The warning ``--follow`` prints when nothing will run the tasks: no live registered
    instance serves ``model`` (live tasks), or no instance is live at all (simulation tasks,
    which any instance runs); None when one is."""
    worker = engine.config.worker
    stale_after = worker.refresh_interval * worker.heartbeat_stale_factor
    if mode is RunMode.LIVE:
        if not await unserved_models(engine.db.coordination, [model], stale_after):
            return None
        return (
            f"engine: warning: no live engine instance serves model {printable(model)!r}; the "
            "tasks stay queued until one does (`python -m engine run` with a provider for it; "
            "`python -m engine status` lists the instances)"
        )
    if await engine.db.coordination.fetch(_LIVE_INSTANCES, float(stale_after)):
        return None
    return (
        "engine: warning: no live engine instance is registered; the tasks stay queued until "
        "one runs (`python -m engine run`)"
    )


def _print_submitted(ids: TaskIds, model: str, mode: RunMode) -> None:
    if len(ids) <= MAX_IDS_SHOWN:
        for task_id in ids:
            print(task_id)
        sys.stdout.flush()
        return
    line = (
        f"submitted {len(ids)} tasks (model {printable(model)}, {mode.value}): "
        f"first {ids[0]}, last {ids[-1]}"
    )
    if sys.stdout.isatty():  # wrapped between words to the terminal's width
        make_console().print(Text(line), overflow="fold")
    else:
        print(line, flush=True)


def _print_json(document: dict[str, Any], ids: TaskIds) -> None:
    """``document`` with ``"ids"`` last, written in pieces: a million ids never form one
    string."""
    head = dumps(document)
    out = sys.stdout
    out.write(head[:-1] + (', "ids": [' if document else '"ids": ['))
    for start in range(0, len(ids), SUBMIT_BATCH):
        chunk = ", ".join(f'"{i}"' for i in ids.slice(start, start + SUBMIT_BATCH))
        out.write(("" if start == 0 else ", ") + chunk)
    out.write("]}\n")
    out.flush()


async def _store(engine: Engine, args: argparse.Namespace, ids: TaskIds) -> None:
    """Build and store the tasks :data:`SUBMIT_BATCH` at a time, appending their ids."""
    mode = RunMode(args.run_mode)
    payload: Any = {} if args.payload is None else args.payload
    identity = Identity(tenant_id=args.tenant, user_id=args.user)
    remaining = int(args.count)
    try:
        while remaining:
            batch = [
                TaskRequest(model=args.model, payload=payload, identity=identity, run_mode=mode)
                for _ in range(min(SUBMIT_BATCH, remaining))
            ]
            await engine.submit(batch)
            ids.extend(r.id for r in batch)
            remaining -= len(batch)
    except BaseException:
        if len(ids):
            print(
                f"engine: {len(ids):,} of {args.count:,} tasks were stored before the failure "
                f"(first {ids[0]}, last {ids[-1]})",
                file=sys.stderr,
                flush=True,
            )
        raise


def run_submit(args: argparse.Namespace, config: EngineConfig) -> int:
    """Run ``submit`` as parsed by :mod:`engine.cli.commands`; return the exit status."""
    mode = RunMode(args.run_mode)

    async def body(engine: Engine) -> int:
        started = trio.current_time()
        ids = TaskIds()
        await _store(engine, args, ids)
        document: dict[str, Any] = {"count": len(ids), "model": args.model, "run_mode": mode.value}
        if not args.json:
            _print_submitted(ids, args.model, mode)
        if not args.follow:
            if args.json:
                _print_json(document, ids)
            return EXIT_OK
        display = ProgressDisplay(sys.stderr if args.json else sys.stdout)
        progress = Progress(total=len(ids))

        async def follow() -> None:
            warning = await unserved_warning(engine, args.model, mode)
            if warning is not None:
                print(warning, file=sys.stderr, flush=True)
            await follow_tasks(engine, ids, progress, display, started=started)

        try:
            interrupted = await run_until_signal(follow)
        finally:
            display.close()
        display.finish(progress, interrupted=interrupted)
        if args.json:
            document.update(
                counts=dict(progress.counts),
                elapsed=round(progress.elapsed, 3),
                interrupted=interrupted,
            )
            _print_json(document, ids)
        if interrupted:
            print("engine: interrupted; the tasks go on (see `engine tasks list`)", file=sys.stderr)
            return EXIT_INTERRUPTED
        return EXIT_OK

    return run_with_engine(config, body)
