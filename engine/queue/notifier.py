"""One LISTEN connection per process, fanned out to the producers and services that care.

River's channel names are kept (``<schema>.river_insert``, ``<schema>.river_control``,
``<schema>.river_leadership``) so a Go River client on the same database wakes ours and ours
wakes it. Subscribers get a coalescing wake-up (a buffer-1 channel written with ``send_nowait``):
ten notifications while a producer is busy become one fetch.
"""

from __future__ import annotations

import json
import logging
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import Any

import attrs
import trio

from engine.db.bridge import Connection, Pool
from engine.db.listen import RESYNC, Listener
from engine.db.sqlfiles import QUERIES

__all__ = ["Channels", "Notifier", "Wakeup", "insert_payload", "notify_queues"]

log = logging.getLogger(__name__)


@attrs.frozen
class Channels:
    """The NOTIFY channel names in one schema."""

    insert: str
    control: str
    leadership: str

    @classmethod
    def for_schema(cls, schema: str) -> Channels:
        """River's names: ``<schema>.river_insert`` and friends."""
        return cls(
            f"{schema}.river_insert", f"{schema}.river_control", f"{schema}.river_leadership"
        )


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


class Wakeup:
    """A coalescing wake-up: any number of :meth:`set` calls wake one :meth:`wait`."""

    def __init__(self) -> None:
        self._send, self._receive = trio.open_memory_channel[None](1)

    def set(self) -> None:
        """Wake the waiter (now or at its next wait); never blocks."""
        try:
            self._send.send_nowait(None)
        except trio.WouldBlock:
            pass

    async def wait(self) -> None:
        """Wait for the next wake-up."""
        await self._receive.receive()

    def clear(self) -> None:
        """Forget a pending wake-up."""
        try:
            self._receive.receive_nowait()
        except trio.WouldBlock:
            pass


class Notifier:
    """The process's listener; subscribe per queue, or to control and leadership messages."""

    def __init__(self, dsn: str | None, channels: Channels) -> None:
        self.channels = channels
        self.listener = Listener(dsn, [channels.insert, channels.control, channels.leadership])
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
        """Listen and dispatch until cancelled; ``started()`` once every LISTEN is in place."""
        async with trio.open_nursery() as nursery:
            await nursery.start(self.listener.run)
            task_status.started()
            async for note in self.listener.receive:
                if note == RESYNC:
                    self._wake_queue(None)
                    for wakeup in list(self._leadership):
                        wakeup.set()
                    continue
                try:
                    message = json.loads(note.payload) if note.payload else {}
                except ValueError:
                    log.warning(
                        "ignoring a malformed notification", extra={"payload": note.payload}
                    )
                    continue
                if not isinstance(message, dict):
                    continue
                if note.channel == self.channels.insert:
                    self._wake_queue(str(message.get("queue", "")))
                elif note.channel == self.channels.control:
                    if message.get("action") == "resume":
                        self._wake_queue(str(message.get("queue", "")))
                    for callback in list(self._control):
                        callback(message)
                elif note.channel == self.channels.leadership:
                    for wakeup in list(self._leadership):
                        wakeup.set()
