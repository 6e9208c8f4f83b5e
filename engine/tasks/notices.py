"""Task notifications: finished tasks wake waiters, cancel requests reach their executions.

Three channels of the process's one LISTEN connection (:class:`~engine.db.listen.ListenHub`,
names in :mod:`engine.db.channels`): ``engine_task_finished`` is sent by a trigger on every
write that makes a task final, whoever wrote it; ``engine_task_cancel`` by ``cancel()`` for a
running task; ``engine_task_callback`` by the statement that records a verified upstream
callback (``POST /hooks/<task id>``), waking the task's execution. Each payload is a task id.
After a reconnect every waiter re-reads its task, and every execution waiting for a callback
re-reads its callbacks, because a notification sent while we were away is gone. Without a hub
(behind a transaction pooler with no ``database.listen_url``) nothing arrives: waiters re-read
at their poll interval.
"""

from __future__ import annotations

import uuid
from collections import defaultdict
from collections.abc import Callable

import trio

from engine.db.channels import TASK_CALLBACK, TASK_CANCEL, TASK_FINISHED
from engine.db.listen import RESYNC, ListenHub

__all__ = ["TaskNotices"]


class TaskNotices:
    """Waiters per task, the cancel hook and the callback hook; run it as a service.

    ``on_callback(task_id)`` is called for each recorded callback, and ``on_callback(None)``
    after a reconnect (every execution should look again). ``hub`` None: nothing is ever
    delivered.
    """

    def __init__(
        self,
        hub: ListenHub | None,
        on_cancel: Callable[[uuid.UUID], object],
        on_callback: Callable[[uuid.UUID | None], object] | None = None,
    ) -> None:
        self.hub = hub
        self.on_cancel = on_cancel
        self.on_callback = on_callback
        #: By the task id as text, as the trigger sends it: every finished task is notified,
        #: and most have no waiter here, so the payload is looked up without parsing it.
        self._waiters: dict[str, set[trio.Event]] = defaultdict(set)

    def waiter(self, task_id: uuid.UUID) -> trio.Event:
        """An event set when ``task_id`` may have finished (re-check the row)."""
        event = trio.Event()
        self._waiters[str(task_id)].add(event)
        return event

    def forget(self, task_id: uuid.UUID, event: trio.Event) -> None:
        """Drop a waiter that is no longer waiting."""
        key = str(task_id)
        events = self._waiters.get(key)
        if events is not None:
            events.discard(event)
            if not events:
                del self._waiters[key]

    def _wake(self, key: str) -> None:
        for event in self._waiters.pop(key, ()):
            event.set()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Dispatch notifications until cancelled; ``started()`` once subscribed."""
        if self.hub is None:
            task_status.started()
            await trio.sleep_forever()
        with self.hub.subscribe(TASK_FINISHED, TASK_CANCEL, TASK_CALLBACK) as notes:
            task_status.started()
            async for note in notes:
                if note == RESYNC:
                    for key in list(self._waiters):
                        self._wake(key)
                    if self.on_callback is not None:
                        self.on_callback(None)
                    continue
                if note.channel == TASK_FINISHED:
                    # PostgreSQL's uuid text is canonical (lower case, hyphenated), as str()
                    # of a UUID is; a payload that is no task id matches no waiter.
                    if self._waiters:
                        self._wake(note.payload)
                    continue
                try:
                    task_id = uuid.UUID(note.payload)
                except ValueError:
                    continue
                if note.channel == TASK_CANCEL:
                    self.on_cancel(task_id)
                elif note.channel == TASK_CALLBACK and self.on_callback is not None:
                    self.on_callback(task_id)
