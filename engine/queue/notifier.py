"""River's notifications, fanned out to the producers and services that care.

The process has one LISTEN connection (:class:`~engine.db.listen.ListenHub`); the queue's
:class:`Notifier` subscribes to River's three channels on it (``<schema>.river_insert``,
``<schema>.river_control``, ``<schema>.river_leadership``: River's names, so a Go River client on
the same database wakes ours and ours wakes it, :class:`~engine.db.channels.RiverChannels`) and
turns them into what the queue needs: a coalescing wake-up per queue for its producers (ten
inserts while a producer is busy become one fetch), control messages (cancel, pause, resume),
and a wake-up when a leader resigns. After a reconnect of the hub every producer and every
elector is woken (a notification may have been missed).

In the service the records layer runs the hub and hands it to the queue client; a queue on its
own (:func:`engine.queue.client.open_queue`) makes a hub of its own, on River's channels, which
its notifier runs.
"""

from __future__ import annotations

import json
import logging
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import Any

import trio

from engine.db.bridge import Connection, Pool
from engine.db.channels import RiverChannels
from engine.db.listen import RESYNC, ListenHub, Wakeup
from engine.db.sqlfiles import QUERIES

__all__ = ["Notifier", "insert_payload", "notify_queues"]

log = logging.getLogger(__name__)

_NOTIFY_MANY = QUERIES["queue_notify_many"]


def insert_payload(queue: str) -> str:
    """The payload of an insert-channel NOTIFY that wakes the producers of ``queue`` (River's
    ``{"queue": ...}``)."""
    return json.dumps({"queue": queue}, separators=(",", ":"))


async def notify_queues(db: Connection | Pool, channel: str, queues: Iterable[str]) -> None:
    """Wake the producers of ``queues`` in every process, in one statement (none if empty)."""
    payloads = [insert_payload(q) for q in dict.fromkeys(queues)]
    if payloads:
        await db.execute(_NOTIFY_MANY, channel, payloads)


class Notifier:
    """River's channels on the process's hub; subscribe per queue, or to control and
    leadership messages.

    ``runs_hub``: :meth:`run` runs ``hub`` too (a queue on its own owns its LISTEN
    connection); otherwise whoever made the hub runs it (the service's records layer).

    Raises:
        ValueError: ``hub`` does not listen on River's channels of ``channels``.
    """

    def __init__(self, hub: ListenHub, channels: RiverChannels, *, runs_hub: bool = False) -> None:
        missing = [c for c in channels.all if c not in hub.channels]
        if missing:
            raise ValueError(f"the hub does not listen on River's channels {missing}")
        self.hub = hub
        self.channels = channels
        self.runs_hub = runs_hub
        self._queue_wakeups: dict[str, set[Wakeup]] = defaultdict(set)
        self._control: set[Callable[[dict[str, Any]], None]] = set()
        self._leadership: set[Wakeup] = set()

    @contextmanager
    def subscribe_queue(self, queue: str) -> Iterator[Wakeup]:
        """A wake-up set on inserts into ``queue``, on its resume, and after any resync."""
        wakeup = Wakeup()
        self._queue_wakeups[queue].add(wakeup)
        try:
            yield wakeup
        finally:
            self._queue_wakeups[queue].discard(wakeup)

    @contextmanager
    def subscribe_control(self, callback: Callable[[dict[str, Any]], None]) -> Iterator[None]:
        """Call ``callback(message)`` for each control message (cancel, pause, resume)."""
        self._control.add(callback)
        try:
            yield
        finally:
            self._control.discard(callback)

    @contextmanager
    def subscribe_leadership(self) -> Iterator[Wakeup]:
        """A wake-up set when a leader resigns."""
        wakeup = Wakeup()
        self._leadership.add(wakeup)
        try:
            yield wakeup
        finally:
            self._leadership.discard(wakeup)

    def _wake_queue(self, queue: str | None) -> None:
        targets = (
            self._queue_wakeups.get(queue, set())
            if queue is not None
            else {w for ws in self._queue_wakeups.values() for w in ws}
        )
        for wakeup in list(targets):
            wakeup.set()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Dispatch River's notifications until cancelled; ``started()`` once subscribed (and,
        with ``runs_hub``, once every LISTEN is in place)."""
        async with trio.open_nursery() as nursery:
            with self.hub.subscribe(*self.channels.all) as notes:
                if self.runs_hub:
                    await nursery.start(self.hub.run)
                task_status.started()
                async for note in notes:
                    self._dispatch(note.channel, note.payload, resync=note == RESYNC)

    def _dispatch(self, channel: str, payload: str, *, resync: bool) -> None:
        if resync:
            self._wake_queue(None)
            for wakeup in list(self._leadership):
                wakeup.set()
            return
        try:
            message = json.loads(payload) if payload else {}
        except ValueError:
            log.warning("ignoring a malformed notification", extra={"payload": payload})
            return
        if not isinstance(message, dict):
            return
        if channel == self.channels.insert:
            self._wake_queue(str(message.get("queue", "")))
        elif channel == self.channels.control:
            if message.get("action") == "resume":
                self._wake_queue(str(message.get("queue", "")))
            for callback in list(self._control):
                callback(message)
        elif channel == self.channels.leadership:
            for wakeup in list(self._leadership):
                wakeup.set()
