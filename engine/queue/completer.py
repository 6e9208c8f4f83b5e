"""Batched completion: many outcomes, one UPDATE.

Executors hand over completions with ``send_nowait`` on an unbounded channel (never blocks,
never cancelled). The completer gathers them for at most ``tick`` seconds or ``flush_size``
items, then writes them with one ``job_set_state_if_running_many`` per ``max_batch`` rows,
guarded by ``state = 'running'``. A failed write is retried with backoff, shielded, with a
deadline per attempt, and never dropped: while the backlog stays at ``backpressure_high`` or more,
producers wait in :meth:`Completer.wait_for_room` until it falls below ``backpressure_low``.

Shutdown falls out of the structure: each generation holds a clone of the send channel and closes
it when its jobs are done; when every clone and the original are closed the completer flushes the
rest and returns, so no finished job is left ``running``.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Callable, Sequence

import attrs
import trio

from engine.db.bridge import Connection, Pool, Record
from engine.db.sqlfiles import QUERIES
from engine.errors import DatabaseError
from engine.queue.config import QueueConfig
from engine.queue.executor import Completion
from engine.queue.notifier import notify_queues
from engine.queue.observe import QUIET, QueueObserver
from engine.queue.states import JobState

__all__ = ["Completer", "CompleterConfig", "write_completions"]

#: Wakes the completer for plain completions, which wait in a side list (Completer._plain).
_PLAIN_MARK = Completion(0, "", JobState.COMPLETED)

log = logging.getLogger(__name__)

_SET_STATE = QUERIES["job_set_state_if_running_many"]
_SET_COMPLETED = QUERIES["job_set_completed_if_running_many"]


@attrs.frozen
class CompleterConfig:
    """Batching knobs, made by :meth:`from_section` from the ``[queue]`` section."""

    tick: float
    """``queue.completer_tick``."""
    flush_size: int
    """``queue.completer_flush_size``."""
    max_batch: int
    """``queue.completer_max_batch``."""
    backpressure_high: int
    """``queue.completer_backpressure_high``."""
    backpressure_low: int
    """``queue.completer_backpressure_low``."""
    attempt_timeout: float
    """``queue.hot_operation_timeout``."""
    #: How long the final flush at shutdown keeps retrying a failing database.
    final_flush_timeout: float = 30.0

    @classmethod
    def from_section(cls, section: QueueConfig) -> CompleterConfig:
        """The completer's knobs from the ``[queue]`` section."""
        return cls(
            tick=section.completer_tick,
            flush_size=section.completer_flush_size,
            max_batch=section.completer_max_batch,
            backpressure_high=section.completer_backpressure_high,
            backpressure_low=section.completer_backpressure_low,
            attempt_timeout=section.hot_operation_timeout,
        )


class Completer:
    """The batch completer service; see the module docstring.

    Its ``observer`` is told of every write with the completions written
    (:meth:`~engine.queue.observe.QueueObserver.completions_flushed`): with the write's
    duration for the completer's own batches, and ``None`` for plain completions a producer's
    claim carried (that statement is timed as a claim), so every outcome is reported once.
    """

    def __init__(
        self,
        pool: Pool,
        config: CompleterConfig,
        *,
        notify_channel: str | None = None,
        observer: QueueObserver = QUIET,
    ) -> None:
        self.pool = pool
        self.config = config
        self.notify_channel = notify_channel
        self.observer = observer
        self._send, self._receive = trio.open_memory_channel[Completion](math.inf)
        self.backlog = 0
        self.flushed = 0
        self.flushes = 0
        self._room = trio.Event()
        self._room.set()
        self._full = trio.Event()
        self._plain: list[int] = []

    def sender(self) -> trio.MemorySendChannel[Completion]:
        """A clone of the input channel; close it when you will send no more."""
        return self._send.clone()

    def record_with(
        self, sender: trio.MemorySendChannel[Completion]
    ) -> Callable[[Completion], None]:
        """A non-blocking ``record(completion)`` function over ``sender``."""

        def record(completion: Completion) -> None:
            self.backlog += 1
            if self.backlog >= self.config.backpressure_high and self._room.is_set():
                self._room = trio.Event()
            if completion.state is JobState.COMPLETED and completion.plain:
                # A side list, so a producer's next claim can carry it (take_plain); the
                # channel still gets a marker so the completer wakes and flushes on its tick.
                self._plain.append(completion.job_id)
                if len(self._plain) == 1:
                    sender.send_nowait(_PLAIN_MARK)
            else:
                sender.send_nowait(completion)
            if self.backlog >= self.config.flush_size:
                self._full.set()

        return record

    def take_plain(self, limit: int) -> list[int]:
        """Hand up to ``limit`` plain completions to a producer that writes them with its
        claim; it must call :meth:`plain_written` or :meth:`return_plain` afterwards."""
        taken = self._plain[:limit]
        del self._plain[:limit]
        return taken

    def plain_written(self, ids: list[int]) -> None:
        """A producer wrote ``ids`` (see :meth:`take_plain`)."""
        self._written(len(ids))
        self.observer.completions_flushed(
            [Completion(i, "", JobState.COMPLETED) for i in ids], None
        )

    def return_plain(self, ids: list[int]) -> None:
        """A producer could not write ``ids``; the completer writes them instead."""
        self._plain[:0] = ids

    def _written(self, n: int) -> None:
        self.backlog -= n
        self.flushed += n
        if self.backlog < self.config.backpressure_low:
            self._room.set()

    def has_room(self) -> bool:
        """False while producers must wait (the backlog reached the high-water mark)."""
        return self._room.is_set()

    async def wait_for_room(self) -> None:
        """Wait while the backlog is at the high-water mark (producers call this)."""
        await self._room.wait()

    async def close(self) -> None:
        """Close the original send channel; the completer ends after the last clone closes."""
        await self._send.aclose()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Flush until every send channel is closed, then flush the rest and return.

        Never fails on a database error (it retries); a bug escapes and ends the service.
        """
        task_status.started()
        pending: list[Completion] = []
        try:
            while True:
                try:
                    pending.append(await self._receive.receive())
                except trio.EndOfChannel:
                    break
                # Two wake-ups per batch, not one per completion: sleep out the tick unless
                # the backlog reaches flush_size first (record() sets _full then).
                if self.backlog < self.config.flush_size:
                    self._full = trio.Event()
                    with trio.move_on_after(self.config.tick):
                        await self._full.wait()
                self._drain_ready(pending)
                await self._flush(pending, final=False)
                pending = []
        except BaseException:
            # Cancelled from outside (the service is going down hard): still write what we
            # hold, shielded and bounded, then let the cancellation go on.
            self._drain_ready(pending)
            with trio.CancelScope(shield=True):
                await self._flush(pending, final=True)
            raise
        finally:
            self._receive.close()
        await self._flush(pending, final=True)

    def _drain_ready(self, pending: list[Completion]) -> None:
        """Take what is already queued without waiting, so one statement covers all of it."""
        while len(pending) < self.config.max_batch:
            try:
                pending.append(self._receive.receive_nowait())
            except (trio.WouldBlock, trio.EndOfChannel, trio.ClosedResourceError):
                break

    async def _flush(self, batch: list[Completion], *, final: bool) -> None:
        """Write ``batch`` and the plain completions no producer took, removing each chunk
        once written (so a retry after a cancellation never writes a chunk twice)."""
        batch[:] = [c for c in batch if c is not _PLAIN_MARK]
        batch.extend(
            Completion(i, "", JobState.COMPLETED) for i in self.take_plain(len(self._plain))
        )
        if not batch:
            return
        started = trio.current_time()
        deadline = started + self.config.final_flush_timeout if final else math.inf
        done: list[Completion] = []
        while batch:
            chunk = batch[: self.config.max_batch]
            await self._write_with_retry(chunk, deadline)
            del batch[: len(chunk)]
            done.extend(chunk)
            self._written(len(chunk))
            self.flushes += 1
        self.observer.completions_flushed(done, trio.current_time() - started)

    async def _write_with_retry(self, chunk: list[Completion], deadline: float) -> None:
        backoff = 0.05
        attempt = 0
        while True:
            attempt += 1
            # Shielded: these rows record what already happened; a cancellation must not leave
            # them running. Each attempt has its own deadline so a dead server cannot hang us.
            with trio.move_on_after(self.config.attempt_timeout, shield=True):
                try:
                    await self._write(chunk)
                    return
                except DatabaseError as exc:
                    log.warning(
                        "completion batch failed, retrying",
                        extra={
                            "event": "completion_retry",
                            "attempt": attempt,
                            "jobs": len(chunk),
                            "error": str(exc),
                        },
                    )
            if trio.current_time() + backoff > deadline:
                log.error(
                    "giving up on completions at shutdown; orphan recovery will requeue them",
                    extra={"event": "completion_lost", "jobs": [c.job_id for c in chunk]},
                )
                return
            # Outside a final flush this sleep is cancellable: run() then does the final flush.
            await trio.sleep(backoff)
            backoff = min(backoff * 2, 2.0)

    async def _write(self, chunk: list[Completion]) -> None:
        async with self.pool.acquire() as conn:
            await write_completions(conn, chunk, self.notify_channel)


async def write_completions(
    conn: Connection, chunk: Sequence[Completion], notify_channel: str | None = None
) -> list[Record]:
    """Apply ``chunk`` in one guarded statement; returns the rows that changed.

    Jobs made available now (hard-stop requeue, snooze 0, quick retry) are announced on
    ``notify_channel`` so any process picks them up at once, not at its next poll.
    """
    completed = [c.job_id for c in chunk if c.state is JobState.COMPLETED and c.plain]
    others = [c for c in chunk if not (c.state is JobState.COMPLETED and c.plain)]
    rows: list[Record] = []
    if completed:
        rows.extend(await conn.fetch(_SET_COMPLETED, completed))
    if others:
        rows.extend(
            await conn.fetch(
                _SET_STATE,
                [c.job_id for c in others],
                [c.state.value for c in others],
                [c.delay for c in others],
                [None if c.error is None else json.dumps(c.error) for c in others],
                [c.snooze for c in others],
                [c.restore for c in others],
                [None if c.metadata is None else json.dumps(c.metadata) for c in others],
            )
        )
    if notify_channel is not None and others:
        await notify_queues(
            conn,
            notify_channel,
            (r["queue"] for r in rows if r.get("state") == JobState.AVAILABLE.value),
        )
    return rows
