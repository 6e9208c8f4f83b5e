"""The leases of the executions in this process: each execution's handle (its token, the
scope a cancel or a lost lease cancels, the wake-up a callback sends), and the keeper that
renews every lease in one statement per interval.

An execution waiting upstream spends nearly all its life asleep between two polls, and one
process holds tens of thousands of them, so the sleep is lean: the task parks itself and one
timer task per trio run (:class:`_Alarms`) wakes every sleeper at its deadline, instead of a
cancel scope (~650 bytes with its cancel status) and an event (~400 bytes) per execution.
"""

from __future__ import annotations

import contextvars
import heapq
import itertools
import logging
import math
import uuid

import trio

from engine.providers.base import Provider
from engine.tasks.store import TaskStore

__all__ = ["Execution", "LeaseKeeper"]

#: The runner's log lines keep the one logger name they have always had.
log = logging.getLogger("engine.tasks.runner")


class _Alarms:
    """Wakes parked executions at their deadlines: one timer task for a whole trio run.

    A sleeper is a heap entry ``(deadline, number, execution)``; it is due when the execution
    still sleeps under that number (a wake or a cancel that ended the sleep first leaves a stale
    entry, dropped when its deadline comes). The timer sleeps until the earliest deadline; an
    earlier one moves its scope's deadline forward.
    """

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, Execution]] = []
        self._numbers = itertools.count()
        self._timer = trio.CancelScope()

    @classmethod
    def current(cls) -> _Alarms:
        """The alarms of this trio run, their timer started on first use."""
        try:
            return _ALARMS.get()
        except LookupError:
            alarms = cls()
            _ALARMS.set(alarms)
            # A system task, with an empty context: it runs no user code and must not keep
            # the first sleeper's task context alive.
            trio.lowlevel.spawn_system_task(
                alarms._run, name="engine.tasks.leases alarms", context=contextvars.Context()
            )
            return alarms

    def add(self, deadline: float, execution: Execution) -> int:
        """Wake ``execution`` at ``deadline`` if it still sleeps under the number returned."""
        number = next(self._numbers)
        heapq.heappush(self._heap, (deadline, number, execution))
        if deadline < self._timer.deadline:
            self._timer.deadline = deadline
        return number

    async def _run(self) -> None:
        heap = self._heap
        while True:
            self._timer = trio.CancelScope(deadline=heap[0][0] if heap else math.inf)
            with self._timer:
                await trio.sleep_forever()
            now = trio.current_time()
            while heap and heap[0][0] <= now:
                _, number, execution = heapq.heappop(heap)
                execution._alarm(number)


_ALARMS: trio.lowlevel.RunVar[_Alarms] = trio.lowlevel.RunVar("engine.tasks.leases.alarms")


class Execution:
    """One running execution: its token and the scope a cancel or a lost lease cancels."""

    __slots__ = (
        "_shield",
        "_sleep",
        "_sleeper",
        "_woken",
        "cancel_requested",
        "lease_lost",
        "provider",
        "scope",
        "task_id",
        "token",
        "upstream_ref",
    )

    def __init__(self, task_id: uuid.UUID, token: uuid.UUID) -> None:
        self.task_id = task_id
        self.token = token
        self.scope = trio.CancelScope()
        self.cancel_requested = False
        self.lease_lost = False
        #: The upstream reference once known, and who to tell if the task is cancelled.
        self.upstream_ref: str | None = None
        self.provider: Provider | None = None
        #: The shield of the upstream call under way, which this execution's cancel reaches.
        self._shield: trio.CancelScope | None = None
        #: True when a callback for the task was recorded (or may have been): look again.
        self._woken = False
        #: The task asleep in :meth:`sleep_until`, and the number of its alarm.
        self._sleeper: trio.lowlevel.Task | None = None
        self._sleep = -1

    @property
    def woken(self) -> bool:
        """True when a wake came that no sleep has consumed yet."""
        return self._woken

    def wake(self) -> None:
        """Cut the current wait between polls short: a callback may be waiting."""
        self._woken = True
        self._resume()

    def _alarm(self, number: int) -> None:
        if number == self._sleep:
            self._resume()

    def _resume(self) -> None:
        sleeper = self._sleeper
        if sleeper is not None:
            self._sleeper = None
            self._sleep = -1
            trio.lowlevel.reschedule(sleeper)

    async def sleep_until(self, deadline: float) -> None:
        """Wait until ``deadline`` (trio time) or until woken, whichever is first; a wake that
        came before the call ends it at once. A checkpoint either way."""
        if self._woken or deadline <= trio.current_time():
            self._woken = False
            await trio.lowlevel.checkpoint()
            return
        if self._sleeper is not None:
            raise RuntimeError("an execution sleeps in one task at a time")
        self._sleeper = trio.lowlevel.current_task()
        self._sleep = _Alarms.current().add(deadline, self) if deadline < math.inf else -1

        def abort(_: object) -> trio.lowlevel.Abort:
            self._sleeper = None
            self._sleep = -1
            return trio.lowlevel.Abort.SUCCEEDED

        await trio.lowlevel.wait_task_rescheduled(abort)
        self._woken = False

    def cancel(self, reason: str) -> None:
        """Cancel the execution, including a shielded upstream call in progress."""
        self.scope.cancel(reason=reason)
        if self._shield is not None:
            self._shield.cancel(reason=reason)

    def shield(self) -> trio.CancelScope:
        """A shielding scope for one upstream call: a stop does not reach inside it, this
        execution's own cancel does (at once if it came before). :meth:`unshield` after it."""
        shield = self._shield = trio.CancelScope(shield=True)
        if self.scope.cancel_called:
            shield.cancel()
        return shield

    def unshield(self) -> None:
        """The call under :meth:`shield` is over."""
        self._shield = None


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
