"""LISTEN/NOTIFY delivered into trio, surviving reconnects: one connection per process.

:class:`ListenHub` is the process's notifications: ONE dedicated connection that LISTENs on
every channel of the process (:mod:`engine.db.channels`) and fans each notification out to the
subscribers of its channel, as a coalescing :class:`Wakeup` (refresh now, fetch now) or a
:class:`Subscription` of notifications in order (their payloads: task ids, queue names). The
service runs one in its records layer and hands it to every consumer; a consumer built without
one works at its poll interval. :class:`Listener` is the connection underneath.

LISTEN needs a session of its own, which a pooler in transaction mode (PgBouncer's
``pool_mode = transaction``) does not keep, so behind one the listener connects to a direct URL
(``database.listen_url``); without one it gets no URL, listens to nothing and delivers nothing,
and every consumer works at its poll interval (each one also polls where notifications arrive).
asyncpg calls our callback on the asyncio side; it only does a ``send_nowait`` into a trio
channel (measured p50 278 µs ping-pong on a 2-core machine).

After the connection is lost the listener reconnects with backoff, re-issues every LISTEN and
delivers :data:`RESYNC` (the hub: to every subscriber), because notifications sent while it was
away are gone: consumers treat it as "poll now". An overflowing buffer also yields RESYNC
instead of blocking the asyncio loop, and so does a subscriber's own full buffer, to it alone.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Any

import attrs
import trio

from engine.db.bridge import Connection, call, connect
from engine.errors import DatabaseError

__all__ = [
    "LISTEN_APPLICATION_NAME",
    "RESYNC",
    "ListenHub",
    "Listener",
    "Notification",
    "Subscription",
    "Wakeup",
    "wakeup",
]

log = logging.getLogger(__name__)

#: The ``application_name`` of every LISTEN connection (``pg_stat_activity`` tells them apart).
LISTEN_APPLICATION_NAME = "engine-listener"


@attrs.frozen
class Notification:
    """One NOTIFY: its channel and payload text."""

    channel: str
    payload: str


#: Delivered after (re)connecting or after an overflow: notifications may have been missed.
RESYNC = Notification("", "")


class Listener:
    """LISTEN on ``channels`` over a dedicated connection; read from :attr:`receive`.

    Run it with ``await nursery.start(listener.run)``: ``started()`` comes once every LISTEN is
    in place, so a test can NOTIFY right after. It only returns when cancelled. With ``dsn``
    None (behind a transaction pooler without a direct URL) it connects nowhere: ``started()``
    comes at once and nothing is ever delivered.
    """

    def __init__(
        self,
        dsn: str | None,
        channels: Sequence[str],
        *,
        buffer: int = 1024,
        health_interval: float = 5.0,
        max_backoff: float = 2.0,
    ) -> None:
        self.dsn = dsn
        self.channels = tuple(channels)
        self.health_interval = health_interval
        self.max_backoff = max_backoff
        self._send, self.receive = trio.open_memory_channel[Notification](buffer)
        self.reconnects = 0
        self.connection: Connection | None = None
        self._overflowed = False
        self._attention = trio.Event()

    def _on_notify(self, _conn: Any, _pid: int, channel: str, payload: str) -> None:
        try:
            self._send.send_nowait(Notification(channel, payload))
        except trio.WouldBlock:
            self._overflowed = True
            self._attention.set()

    async def _session(self, *, task_status: trio.TaskStatus[None]) -> None:
        assert self.dsn is not None
        lost = trio.Event()
        self._attention = trio.Event()

        def on_lost(_conn: Any) -> None:
            lost.set()
            self._attention.set()

        conn = await connect(self.dsn, application_name=LISTEN_APPLICATION_NAME)
        self.connection = conn
        try:
            conn.raw.add_termination_listener(on_lost)
            for channel in self.channels:
                await call(conn.raw.add_listener, channel, self._on_notify)
            task_status.started()
            while True:
                with trio.move_on_after(self.health_interval):
                    await self._attention.wait()
                if lost.is_set():
                    return
                if self._overflowed:
                    # At once, not at the next probe: a consumer that missed something looks.
                    self._overflowed = False
                    self._attention = trio.Event()
                    await self._send.send(RESYNC)
                    continue
                # A half-open TCP connection never reports its loss by itself; a probe does.
                with trio.move_on_after(self.health_interval) as probe:
                    await conn.fetchval("SELECT 1")
                if probe.cancelled_caught:
                    return
        finally:
            self.connection = None
            await conn.close()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Listen until cancelled, reconnecting after any loss; see the class docstring."""
        self._overflowed = False
        backoff = 0.05
        first = True
        async with self._send:
            if self.dsn is None:
                task_status.started()
                await trio.sleep_forever()
            while True:
                try:
                    async with trio.open_nursery() as nursery:
                        await nursery.start(self._session)
                        if first:
                            first = False
                            task_status.started()
                        else:
                            self.reconnects += 1
                        await self._send.send(RESYNC)
                        backoff = 0.05
                except* DatabaseError as group:
                    log.warning(
                        "listener connection lost",
                        extra={"event": "listener_lost", "error": str(group.exceptions[0])},
                    )
                await trio.sleep(backoff)
                backoff = min(self.max_backoff, backoff * 2)


class Wakeup:
    """A coalescing wake-up: any number of :meth:`set` calls wake one :meth:`wait`, so ten
    notifications while a consumer is busy become one look."""

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


class Subscription:
    """The notifications of some channels, in order, and :data:`RESYNC` where some may be
    missing: after a reconnect, or once this subscription's own buffer had overflowed (what
    came meanwhile is dropped; the RESYNC follows what was buffered). ``async for`` over it,
    or :meth:`receive`."""

    def __init__(self, channels: Iterable[str], buffer: int) -> None:
        self.channels = frozenset(channels)
        self._send, self._receive = trio.open_memory_channel[Notification](buffer)
        self._overflowed = False

    def deliver(self, note: Notification) -> None:
        """Queue ``note`` (the hub calls this); never blocks."""
        if self._overflowed:
            return  # a RESYNC is due anyway, after what is buffered
        try:
            self._send.send_nowait(note)
        except trio.WouldBlock:
            self._overflowed = True

    async def receive(self) -> Notification:
        """The next notification, or RESYNC."""
        try:
            return self._receive.receive_nowait()
        except trio.WouldBlock:
            if self._overflowed:
                self._overflowed = False
                return RESYNC
        return await self._receive.receive()

    def __aiter__(self) -> Subscription:
        return self

    async def __anext__(self) -> Notification:
        return await self.receive()


class ListenHub:
    """The process's one LISTEN connection, on ``channels``, fanned out to subscribers.

    Subscribe before or while it runs (:meth:`subscribe`, :meth:`wakeup`); a subscriber hears
    what arrives while it is subscribed. Run it with ``await nursery.start(hub.run)``:
    ``started()`` once every LISTEN is in place. With ``dsn`` None nothing is ever delivered
    (see the module docstring). Delivering never blocks: a subscriber that does not keep up
    gets RESYNC, the others are not held up.
    """

    def __init__(
        self,
        dsn: str | None,
        channels: Sequence[str],
        *,
        buffer: int = 8192,
        health_interval: float = 5.0,
        max_backoff: float = 2.0,
    ) -> None:
        self.listener = Listener(
            dsn,
            list(dict.fromkeys(channels)),
            buffer=buffer,
            health_interval=health_interval,
            max_backoff=max_backoff,
        )
        self._subscribers: dict[str, dict[Callable[[Notification], None], None]] = {
            channel: {} for channel in self.listener.channels
        }

    @property
    def dsn(self) -> str | None:
        """Where it listens (None: nowhere; consumers poll)."""
        return self.listener.dsn

    @property
    def channels(self) -> tuple[str, ...]:
        """The channels it listens on."""
        return self.listener.channels

    @contextmanager
    def _subscribed(
        self, channels: Sequence[str], deliver: Callable[[Notification], None]
    ) -> Iterator[None]:
        unknown = [c for c in channels if c not in self._subscribers]
        if unknown or not channels:
            raise ValueError(
                f"the hub does not listen on {unknown or 'no channel'}; it listens on "
                f"{list(self.channels)}"
            )
        for channel in channels:
            self._subscribers[channel][deliver] = None
        try:
            yield
        finally:
            for channel in channels:
                self._subscribers[channel].pop(deliver, None)

    @contextmanager
    def subscribe(self, *channels: str, buffer: int = 8192) -> Iterator[Subscription]:
        """The notifications of ``channels`` while in the block (see :class:`Subscription`).

        Raises:
            ValueError: the hub does not listen on one of ``channels``.
        """
        subscription = Subscription(channels, buffer)
        with self._subscribed(channels, subscription.deliver):
            yield subscription

    @contextmanager
    def wakeup(self, *channels: str) -> Iterator[Wakeup]:
        """A wake-up set by every notification of ``channels`` and by every RESYNC.

        Raises:
            ValueError: the hub does not listen on one of ``channels``.
        """
        woken = Wakeup()
        with self._subscribed(channels, lambda _note: woken.set()):
            yield woken

    def _fan_out(self, note: Notification) -> None:
        if note == RESYNC:
            # Each subscriber once, however many channels it listens to.
            targets = dict.fromkeys(d for ds in self._subscribers.values() for d in ds)
        else:
            targets = self._subscribers.get(note.channel, {})
        for deliver in list(targets):
            deliver(note)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Listen and fan out until cancelled; ``started()`` once every LISTEN is in place."""
        receive = self.listener.receive
        async with trio.open_nursery() as nursery:
            await nursery.start(self.listener.run)
            task_status.started()
            while True:
                self._fan_out(await receive.receive())
                # A busy writer's notifications come in runs (one per task a statement
                # finishes): fan out what is already buffered now, not one per scheduler
                # tick, so each subscriber wakes once for the run. Bounded by the buffer.
                for _ in range(receive.statistics().current_buffer_used):
                    self._fan_out(receive.receive_nowait())


def wakeup(hub: ListenHub | None, *channels: str) -> AbstractContextManager[Wakeup]:
    """``hub.wakeup(*channels)``, or without a hub a wake-up nothing sets (the consumer
    works at its poll interval)."""
    return nullcontext(Wakeup()) if hub is None else hub.wakeup(*channels)
