"""The leases of the executions in this process: each execution's handle (its token, the
scope a cancel or a lost lease cancels, the wake-up a callback sends), and the keeper that
renews every lease in one statement per interval.
"""

from __future__ import annotations

import logging
import uuid
from types import TracebackType

import trio

from engine.providers.base import Provider
from engine.tasks.store import TaskStore

__all__ = ["Execution", "LeaseKeeper"]

#: The runner's log lines keep the one logger name they have always had.
log = logging.getLogger("engine.tasks.runner")


class Execution:
    """One running execution: its token and the scope a cancel or a lost lease cancels."""

    def __init__(self, task_id: uuid.UUID, token: uuid.UUID) -> None:
        self.task_id = task_id
        self.token = token
        self.scope = trio.CancelScope()
        self.cancel_requested = False
        self.lease_lost = False
        #: The upstream reference once known, and who to tell if the task is cancelled.
        self.upstream_ref: str | None = None
        self.provider: Provider | None = None
        self._guards: list[trio.CancelScope] = []
        #: Set when a callback for the task was recorded (or may have been): look again.
        self.woken = trio.Event()

    def wake(self) -> None:
        """Cut the current wait between polls short: a callback may be waiting."""
        self.woken.set()

    async def sleep_until(self, deadline: float) -> None:
        """Wait until ``deadline`` (trio time) or until woken, whichever is first."""
        with trio.move_on_at(deadline):
            await self.woken.wait()
        if self.woken.is_set():
            self.woken = trio.Event()

    def cancel(self, reason: str) -> None:
        """Cancel the execution, including a shielded upstream call in progress."""
        self.scope.cancel(reason=reason)
        for guard in self._guards:
            guard.cancel(reason=reason)

    def cancel_guard(self) -> _Guard:
        """A scope inside a shield that this execution's own cancel still reaches."""
        return _Guard(self)


class _Guard:
    """:meth:`Execution.cancel_guard`'s scope, registered with its execution while entered (a
    class rather than a generator: it is entered once per submission)."""

    __slots__ = ("execution", "scope")

    def __init__(self, execution: Execution) -> None:
        self.execution = execution
        self.scope = trio.CancelScope()

    def __enter__(self) -> None:
        self.scope.__enter__()
        self.execution._guards.append(self.scope)
        if self.execution.scope.cancel_called:
            self.scope.cancel()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool:
        self.execution._guards.remove(self.scope)
        return self.scope.__exit__(exc_type, exc, tb)


class LeaseKeeper:
    """Renews the leases of every execution in this process, one statement per interval.

    A lease that could not be renewed is lost: another execution may own the task now, so the
    stale one is cancelled at once. A renewal that reports a cancel request cancels the
    execution too (the fallback when the NOTIFY was missed).
    """

    def __init__(self, store: TaskStore, interval: float) -> None:
        self.store = store
        self.interval = interval
        self.running: dict[uuid.UUID, Execution] = {}

    def cancel(self, task_id: uuid.UUID) -> bool:
        """Cancel the execution of ``task_id`` in this process, if it runs here."""
        execution = self.running.get(task_id)
        if execution is None:
            return False
        execution.cancel_requested = True
        execution.cancel("task cancelled")
        return True

    def wake(self, task_id: uuid.UUID | None) -> bool:
        """Wake the execution of ``task_id`` in this process (every execution for None) from
        its wait between polls: a callback was recorded for it. False if none runs here."""
        if task_id is None:
            for each in list(self.running.values()):
                each.wake()
            return bool(self.running)
        execution = self.running.get(task_id)
        if execution is None:
            return False
        execution.wake()
        return True

    async def run_once(self) -> None:
        """Renew every lease once."""
        executions = list(self.running.values())
        held = await self.store.renew([(e.task_id, e.token) for e in executions])
        for execution in executions:
            if execution.task_id not in held:
                if self.running.get(execution.task_id) is execution:
                    execution.lease_lost = True
                    execution.cancel("execution lease lost")
            elif held[execution.task_id]:
                self.cancel(execution.task_id)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Renew every ``interval`` until cancelled; a failed round is logged."""
        task_status.started()
        while True:
            await trio.sleep(self.interval)
            try:
                await self.run_once()
            except Exception as exc:
                log.warning(
                    "lease renewal failed", extra={"event": "lease_renew_failed", "error": str(exc)}
                )
