"""Task rows: reads, fenced writes batched across concurrent executions, buffered events.

Every write to a running task names its execution token, and the SQL only touches the row while
that token holds the lease: a stale executor's writes change nothing and come back ``False``.
Concurrent executions' writes of one kind go out as one statement (:class:`Batcher`), so a
hundred tasks cost one round trip per step, not a hundred.
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

import attrs
import trio

from engine.db.batcher import Batcher
from engine.db.bridge import Pool
from engine.db.jsontext import compact, compact_strict
from engine.db.sqlfiles import QUERIES
from engine.domain.tasks import Task, TaskEvent, TaskPhase, TaskStatus
from engine.errors import DatabaseError
from engine.providers.base import PollResult
from engine.tasks.jsoncheck import json_problem

__all__ = ["EventWriter", "ProgressReport", "StoredCallback", "TaskStore", "storable_outcome"]

log = logging.getLogger(__name__)

_GET = QUERIES["task_get"]
_GET_MANY = QUERIES["task_get_many"]
_CLAIM = QUERIES["task_lease_claim_many"]
_RENEW = QUERIES["task_lease_renew_many"]
_SUBMITTING = QUERIES["task_mark_submitting_many"]
_UNSUBMITTING = QUERIES["task_unmark_submitting_many"]
_UPSTREAM = QUERIES["task_record_upstream_many"]
_PHASE = QUERIES["task_set_phase_many"]
_FINISH = QUERIES["task_finish_many"]
_REQUEUE = QUERIES["task_requeue_many"]
_EVENTS = QUERIES["task_event_insert_many"]
_PROGRESS = QUERIES["task_report_progress_many"]
_CALLBACKS = QUERIES["task_callback_latest_many"]
#: Seconds one batch of events may take to write (shielded: a stop does not cut it).
_WRITE_TIMEOUT = 10.0
#: Most leases one renewal statement extends, and most tasks one requeue statement puts back:
#: the statements are linear in the batch under either plan (sql/queries/engine_task.sql says
#: how; on PostgreSQL 15, a generic-plan renewal of 250 leases takes ~5 ms, of 1,000 ~22 ms, of
#: 5,000 ~100 ms), so a chunk keeps each statement short (and its row locks brief) while
#: 50,000 leases are still only 50 statements a round.
LEASE_CHUNK = 1000


def _dumps(value: Any) -> str | None:
    if value is None:
        return None
    # Most events carry no payload.
    return "{}" if type(value) is dict and not value else compact(value)


def storable_outcome(
    status: TaskStatus, result: Any, error: dict[str, Any] | None
) -> tuple[TaskStatus, str | None, str | None]:
    """An outcome as it is written: (status, result as jsonb text, error as jsonb text).

    A result PostgreSQL would refuse (not JSON, NaN, a NUL, a lone surrogate) makes the task
    fail with ``result_not_storable``, for this task alone: it must not fail the batch it
    would be written with. An error that cannot be stored is stored as its ``repr``.
    """
    result_text, problem = _storable(result)
    if problem is not None:
        status, result_text = TaskStatus.FAILED, None
        error = {"code": "result_not_storable", "message": f"the provider's result {problem}"}
    error_text, problem = _storable(error)
    if problem is not None:
        error_text = json.dumps({"code": (error or {}).get("code"), "message": repr(error)})
    return status, result_text, error_text


def _storable(value: Any) -> tuple[str | None, str | None]:
    """(``value`` as jsonb text, None), or (None, why PostgreSQL's jsonb would refuse it)."""
    if value is None:
        return None, None
    try:
        text = compact_strict(value)
    except (TypeError, ValueError) as exc:
        problem = json_problem(value)  # a NUL or a surrogate is the clearer answer
        return None, problem or f"is not JSON ({exc})"
    # The text escapes every character beyond ASCII, so a NUL or a lone surrogate shows as an
    # escape; only text with one (or with a surrogate pair, or a backslash before "u") is
    # looked at closely, the rest is known good at C speed.
    if "\\u0000" in text or "\\ud" in text:
        problem = json_problem(value)
        if problem is not None:
            return None, problem
    return text, None


@attrs.frozen
class StoredCallback:
    """A callback recorded for a task (``POST /hooks/<task id>``), as the run reads it back."""

    result: PollResult
    upstream_id: str | None
    received_at: datetime


@attrs.frozen
class ProgressReport:
    """A provider's progress report of a running task, waiting to be written (fenced)."""

    task_id: uuid.UUID
    token: uuid.UUID
    phase: str
    progress: float
    fraction: float
    message: str | None
    simulated: bool
    instance_id: str | None
    at: datetime


class TaskStore:
    """Task reads and fenced writes for one process (``owner`` is its instance id)."""

    def __init__(self, pool: Pool, owner: str, *, lease_ttl: float = 60.0) -> None:
        self.pool = pool
        self.owner = owner
        self.lease_ttl = lease_ttl
        self._get = Batcher(self._get_many)
        self._claim = Batcher(self._claim_many)
        self._submitting = Batcher(self._submitting_many)
        self._unsubmitting = Batcher(self._unsubmitting_many)
        self._upstream = Batcher(self._upstream_many)
        self._finish = Batcher(self._finish_many)
        # A stop requeues every running task at once: 50,000 in chunks of LEASE_CHUNK.
        self._requeue = Batcher(self._requeue_many, max_batch=LEASE_CHUNK)
        self._callbacks = Batcher(self._callbacks_many)

    # ---- reads -----------------------------------------------------------------------------

    async def get(self, task_id: uuid.UUID) -> Task | None:
        """The task, or None; concurrent calls share one query."""
        return await self._get.submit(task_id)

    async def get_now(self, task_id: uuid.UUID) -> Task | None:
        """The task, read on its own (not batched)."""
        row = await self.pool.fetchrow(_GET, task_id)
        return None if row is None else Task.from_record(row)

    async def _get_many(self, ids: list[uuid.UUID]) -> list[Task | None]:
        rows = await self.pool.fetch(_GET_MANY, list(set(ids)))
        found = {r["id"]: Task.from_record(r) for r in rows}
        return [found.get(i) for i in ids]

    async def latest_callback(self, task_id: uuid.UUID) -> StoredCallback | None:
        """The task's most telling callback since it was submitted (a finished one first, then
        the newest), or None; concurrent calls share one query."""
        return await self._callbacks.submit(task_id)

    async def _callbacks_many(self, ids: list[uuid.UUID]) -> list[StoredCallback | None]:
        rows = await self.pool.fetch(_CALLBACKS, list(set(ids)))
        found = {
            r["task_id"]: StoredCallback(
                PollResult(
                    done=bool(r["done"]),
                    result=None if r["result"] is None else json.loads(r["result"]),
                    error=r["error"],
                    progress=r["progress"],
                ),
                r["upstream_id"],
                r["received_at"],
            )
            for r in rows
        }
        return [found.get(i) for i in ids]

    # ---- the lease -------------------------------------------------------------------------

    async def claim(self, task_id: uuid.UUID, token: uuid.UUID) -> Task | None:
        """Take the execution lease with ``token``; the task now running, or None if it was
        not free (held by a live token, final, not due, or being cancelled)."""
        return await self._claim.submit((task_id, token))

    async def _claim_many(self, items: list[tuple[uuid.UUID, uuid.UUID]]) -> list[Task | None]:
        # Two executions of one task in one batch: only the first may try.
        first: dict[uuid.UUID, uuid.UUID] = {}
        for task_id, token in items:
            first.setdefault(task_id, token)
        rows = await self.pool.fetch(
            _CLAIM, list(first), list(first.values()), self.owner, self.lease_ttl
        )
        found = {(r["id"], r["execution_token"]): r for r in rows}
        return [
            None
            if (row := found.get(item)) is None
            else Task.from_record(row, task_id=item[0], token=item[1])
            for item in items
        ]

    async def renew(self, leases: Sequence[tuple[uuid.UUID, uuid.UUID]]) -> dict[uuid.UUID, bool]:
        """Extend ``leases`` (id, token); returns {id: cancel requested} for those still held.
        One statement per ``LEASE_CHUNK`` leases."""
        held: dict[uuid.UUID, bool] = {}
        for start in range(0, len(leases), LEASE_CHUNK):
            chunk = leases[start : start + LEASE_CHUNK]
            rows = await self.pool.fetch(
                _RENEW, [i for i, _ in chunk], [t for _, t in chunk], self.lease_ttl
            )
            held.update((r["id"], bool(r["cancel_requested"])) for r in rows)
        return held

    # ---- fenced writes ---------------------------------------------------------------------

    async def mark_submitting(
        self, task_id: uuid.UUID, token: uuid.UUID, *, idempotently: bool = False
    ) -> bool:
        """Record that the upstream call is about to be made (``idempotently``: with an
        idempotency key, so a lost answer may be asked again); False if the lease is gone."""
        return await self._submitting.submit((task_id, token, idempotently))

    async def _submitting_many(self, items: list[tuple[uuid.UUID, uuid.UUID, bool]]) -> list[bool]:
        rows = await self.pool.fetch(
            _SUBMITTING, [i[0] for i in items], [i[1] for i in items], [i[2] for i in items]
        )
        held = {r["id"] for r in rows}
        return [i[0] in held for i in items]

    async def unmark_submitting(self, task_id: uuid.UUID, token: uuid.UUID) -> bool:
        """Clear ``submitted_at``: the call never reached the upstream (``NotSubmitted``); False
        if the lease is gone."""
        return await self._unsubmitting.submit((task_id, token))

    async def _unsubmitting_many(self, items: list[tuple[uuid.UUID, uuid.UUID]]) -> list[bool]:
        rows = await self.pool.fetch(_UNSUBMITTING, [i for i, _ in items], [t for _, t in items])
        held = {r["id"] for r in rows}
        return [i in held for i, _ in items]

    async def record_upstream(self, task_id: uuid.UUID, token: uuid.UUID, ref: str) -> bool:
        """Record the upstream reference; False if the lease is gone."""
        return await self._upstream.submit((task_id, token, ref))

    async def _upstream_many(self, items: list[tuple[uuid.UUID, uuid.UUID, str]]) -> list[bool]:
        rows = await self.pool.fetch(
            _UPSTREAM, [i[0] for i in items], [i[1] for i in items], [i[2] for i in items]
        )
        held = {r["id"] for r in rows}
        return [i[0] in held for i in items]

    async def finish(
        self,
        task_id: uuid.UUID,
        token: uuid.UUID,
        status: TaskStatus,
        *,
        result: Any = None,
        error: dict[str, Any] | None = None,
    ) -> bool:
        """Record the outcome and release the lease; False if another execution owns the task.

        Runs shielded: the outcome already happened and must be recorded.
        """
        status, result_text, error_text = storable_outcome(status, result, error)
        return await self._finish.submit(
            (task_id, token, status.value, result_text, error_text), shielded=True
        )

    async def _finish_many(
        self, items: list[tuple[uuid.UUID, uuid.UUID, str, Any, Any]]
    ) -> list[bool]:
        rows = await self.pool.fetch(
            _FINISH,
            [i[0] for i in items],
            [i[1] for i in items],
            [i[2] for i in items],
            [i[3] for i in items],
            [i[4] for i in items],
        )
        held = {r["id"] for r in rows}
        return [i[0] in held for i in items]

    async def requeue(
        self,
        task_id: uuid.UUID,
        token: uuid.UUID,
        *,
        delay: float = 0.0,
        only_before_submission: bool = False,
    ) -> TaskStatus | None:
        """Put a running task back to queued (or manual_review if its submission is
        ambiguous) and release the lease; None if the lease is gone (or, with
        ``only_before_submission``, the upstream call was already made). Shielded."""
        return await self._requeue.submit(
            (task_id, token, delay, only_before_submission), shielded=True
        )

    async def _requeue_many(
        self, items: list[tuple[uuid.UUID, uuid.UUID, float, bool]]
    ) -> list[TaskStatus | None]:
        rows = await self.pool.fetch(_REQUEUE, *map(list, zip(*items, strict=True)))
        status = {r["id"]: TaskStatus(r["status"]) for r in rows}
        return [status.get(i[0]) for i in items]


class EventWriter:
    """Buffers task events (and informational phase changes) and writes them in batches,
    every ``interval`` or ``batch`` items.

    Events are history, not state: a failed write is retried, and whatever is left at shutdown
    is written shielded with a deadline, then logged if the database is gone. Phase changes are
    fenced by the execution token, so one written after the task finished changes nothing.
    """

    def __init__(
        self,
        pool: Pool,
        *,
        interval: float = 0.05,
        batch: int = 1000,
        progress_interval: float = 1.0,
    ) -> None:
        self.pool = pool
        self.interval = interval
        self.batch = batch
        #: Seconds between two progress reports written for one task: reports in between
        #: are coalesced (the latest wins) and written when the interval has passed.
        self.progress_interval = progress_interval
        self._buffer: list[TaskEvent] = []
        self._phases: dict[uuid.UUID, tuple[uuid.UUID, str, float]] = {}
        self._progress: dict[uuid.UUID, ProgressReport] = {}
        self._progress_written: dict[uuid.UUID, float] = {}
        #: Progress reports written (each one statement's row, fenced), for tests and metrics.
        self.progress_written = 0
        self._wake = trio.Event()
        self.written = 0

    def emit(self, event: TaskEvent) -> None:
        """Queue ``event`` (stamped now if it has no time); never blocks."""
        if event.at is None:
            event = attrs.evolve(event, at=datetime.now(UTC))
        self._buffer.append(event)
        if len(self._buffer) >= self.batch:
            self._wake.set()

    def set_phase(
        self, task_id: uuid.UUID, token: uuid.UUID, phase: TaskPhase, progress: float
    ) -> None:
        """Queue a phase change of a running task (the latest per task wins)."""
        self._phases[task_id] = (token, phase.value, progress)

    def forget_phase(self, task_id: uuid.UUID) -> None:
        """Drop a phase change (and a progress report) not written yet: the task finished, so
        it would change nothing (the write is fenced) and would only cost a statement and row
        locks."""
        self._phases.pop(task_id, None)
        self._progress.pop(task_id, None)
        self._progress_written.pop(task_id, None)

    def report_progress(self, report: ProgressReport) -> None:
        """Queue a progress report (the latest per task wins); never blocks. It is written
        with the next flush once ``progress_interval`` has passed since the task's last one."""
        self._progress[report.task_id] = report

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Flush until cancelled, then flush what is left."""
        task_status.started()
        try:
            while True:
                with trio.move_on_after(self.interval):
                    await self._wake.wait()
                self._wake = trio.Event()
                await self.flush()
        finally:
            with trio.move_on_after(10.0, shield=True):
                await self.flush(retry=False)

    async def flush(self, *, retry: bool = True) -> None:
        """Write every buffered phase change and event, and the progress reports that are due
        (all of them when ``retry`` is off: the last flush)."""
        if self._phases:
            phases, self._phases = self._phases, {}
            try:
                await self.pool.execute(
                    _PHASE,
                    list(phases),
                    [v[0] for v in phases.values()],
                    [v[1] for v in phases.values()],
                    [v[2] for v in phases.values()],
                )
            except DatabaseError as exc:
                log.warning(
                    "phase changes not written",
                    extra={"event": "phases_skipped", "error": str(exc)},
                )
        if self._progress:
            await self._flush_progress(everything=not retry)
        while self._buffer:
            chunk, self._buffer = self._buffer[: self.batch], self._buffer[self.batch :]
            try:
                # Shielded and bounded: a stop that lands mid-write (the records layer stops
                # right after the runs it records) must not drop the chunk it carries.
                with trio.fail_after(_WRITE_TIMEOUT, shield=True):
                    await self._write(chunk)
                self.written += len(chunk)
            except (DatabaseError, trio.TooSlowError) as exc:
                self._buffer[:0] = chunk
                log.warning(
                    "task events not written yet",
                    extra={"event": "events_retry", "error": str(exc) or "write timed out"},
                )
                if not retry:
                    log.error(
                        "task events lost at shutdown",
                        extra={"event": "events_lost", "count": len(self._buffer)},
                    )
                    self._buffer.clear()
                return

    async def _flush_progress(self, *, everything: bool) -> None:
        now = trio.current_time()
        # Forget write times that no longer hold anything back, so the map stays small.
        for task_id in [
            i for i, at in self._progress_written.items() if now - at >= self.progress_interval
        ]:
            del self._progress_written[task_id]
        due = [
            r
            for r in self._progress.values()
            if everything or r.task_id not in self._progress_written
        ]
        if not due:
            return
        for report in due:
            del self._progress[report.task_id]
            self._progress_written[report.task_id] = now
        try:
            with trio.fail_after(_WRITE_TIMEOUT, shield=True):
                rows = await self.pool.fetch(
                    _PROGRESS,
                    [r.task_id for r in due],
                    [r.token for r in due],
                    [r.phase for r in due],
                    [r.progress for r in due],
                    [r.message for r in due],
                    [_dumps({"fraction": r.fraction}) for r in due],
                    [r.simulated for r in due],
                    [r.instance_id for r in due],
                    [r.at for r in due],
                )
            self.progress_written += len(rows)
        except (DatabaseError, trio.TooSlowError) as exc:
            # Informational, like phase changes: the next report supersedes a lost one.
            log.warning(
                "progress reports not written",
                extra={"event": "progress_skipped", "error": str(exc) or "write timed out"},
            )

    async def _write(self, chunk: list[TaskEvent]) -> None:
        # One pass over the events, turned into the statement's ten columns by zip.
        rows = [
            (
                e.task_id,
                e.type,
                e.status,
                e.phase,
                e.progress,
                e.message,
                _dumps(e.payload),
                e.simulated,
                e.instance_id,
                e.at,
            )
            for e in chunk
        ]
        await self.pool.execute(_EVENTS, *zip(*rows, strict=True))
