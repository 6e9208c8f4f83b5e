"""LISTEN/NOTIFY delivered into trio, surviving reconnects.

One dedicated connection per :class:`Listener`. LISTEN needs a session of its own, which a
pooler in transaction mode (PgBouncer's ``pool_mode = transaction``) does not keep, so behind
one the listener connects to a direct URL (``database.listen_url``); without one it gets no
URL, listens to nothing and delivers nothing, and every consumer works at its poll interval
(each one also polls where notifications arrive). asyncpg calls our callback on the asyncio
side; it only does a ``send_nowait`` into a trio channel (measured p50 278 µs ping-pong on a
2-core machine).

After the connection is lost the listener reconnects with backoff, re-issues every LISTEN and
delivers :data:`RESYNC`, because notifications sent while it was away are gone: consumers treat
it as "poll now". An overflowing buffer also yields RESYNC instead of blocking the asyncio loop.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import attrs
import trio

from engine.db.bridge import Connection, call, connect
from engine.errors import DatabaseError

__all__ = ["RESYNC", "Listener", "Notification"]

log = logging.getLogger(__name__)


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

    def _on_notify(self, _conn: Any, _pid: int, channel: str, payload: str) -> None:
        try:
            self._send.send_nowait(Notification(channel, payload))
        except trio.WouldBlock:
            self._overflowed = True

    async def _session(self, *, task_status: trio.TaskStatus[None]) -> None:
        assert self.dsn is not None
        lost = trio.Event()
        conn = await connect(self.dsn, application_name="engine-listener")
        self.connection = conn
        try:
            conn.raw.add_termination_listener(lambda _c: lost.set())
            for channel in self.channels:
                await call(conn.raw.add_listener, channel, self._on_notify)
            task_status.started()
            while True:
                with trio.move_on_after(self.health_interval):
                    await lost.wait()
                if lost.is_set():
                    return
                if self._overflowed:
                    self._overflowed = False
                    await self._send.send(RESYNC)
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
