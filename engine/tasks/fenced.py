"""The writes of one run, fenced by its execution token: each is retried while the database
is away (for as long as the lease would hold), and the run's outcome is recorded with its
event. A write that finds the lease taken over changes nothing.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any, TypeVar

import trio

from engine.domain.tasks import Task, TaskEvent, TaskStatus
from engine.errors import DatabaseError, LeaseUnavailable
from engine.tasks.observe import QUIET, TaskObserver
from engine.tasks.store import EventWriter, TaskStore

__all__ = ["WRITE_RETRY_SHARE", "FencedWrites"]

#: The runner's log lines keep the one logger name they have always had.
log = logging.getLogger("engine.tasks.runner")

_T = TypeVar("_T")

#: Share of the lease a fenced write is retried for while the database is away.
WRITE_RETRY_SHARE = 0.5
_WRITE_RETRY_FIRST = 0.05
_WRITE_RETRY_MAX = 2.0


class FencedWrites:
    """A run's writes and events: the base of :class:`engine.tasks.runner.TaskRunner`."""

    def __init__(
        self,
        store: TaskStore,
        events: EventWriter,
        *,
        instance_id: str,
        observer: TaskObserver = QUIET,
    ) -> None:
        self.store = store
        self.events = events
        self.instance_id = instance_id
        #: Told of every start, phase and outcome of this process's runs (the metrics).
        self.observer = observer

    def emit(self, task: Task, type_: str, **fields: Any) -> None:
        """Append an event to ``task``'s history (buffered)."""
        self.events.emit(
            TaskEvent(
                task.id,
                type_,
                simulated=task.simulated,
                instance_id=self.instance_id,
                at=datetime.now(UTC),
                **fields,
            )
        )

    async def _durably(self, what: str, write: Callable[[], Awaitable[_T]]) -> _T:
        """Run a fenced write, trying it again while the database is unavailable.

        Only errors that say the database was away or busy (``retryable``: a lost connection,
        a restart, a lock or statement timeout) are retried, with backoff, for as long as
        the run's lease would still hold (``WRITE_RETRY_SHARE`` of the lease). The token is
        kept meanwhile: once the database is back the write lands, or finds the lease taken
        over (False) and changes nothing.
        """
        deadline = trio.current_time() + self.store.lease_ttl * WRITE_RETRY_SHARE
        delay = _WRITE_RETRY_FIRST
        while True:
            try:
                return await write()
            except DatabaseError as exc:
                if not exc.retryable or trio.current_time() + delay > deadline:
                    raise
                log.warning(
                    "task write failed; retrying while the lease holds",
                    extra={"event": "task_write_retry", "write": what, "error": str(exc)},
                )
            await trio.sleep(delay)
            delay = min(delay * 2, _WRITE_RETRY_MAX)

    async def _finish(
        self,
        task: Task,
        token: uuid.UUID,
        status: TaskStatus,
        *,
        result: Any = None,
        error: dict[str, Any] | None = None,
    ) -> None:
        finished = await self._durably(
            "finish",
            lambda: self.store.finish(task.id, token, status, result=result, error=error),
        )
        if not finished:
            raise LeaseUnavailable()
        self.events.forget_phase(task.id)
        self.observer.task_finished(status, task)
        self.emit(
            task,
            f"task.{status.value}",
            status=status.value,
            progress=1.0 if status is TaskStatus.SUCCEEDED else None,
            message=None if error is None else error.get("message"),
            payload={} if error is None else error,
        )
