"""LISTEN/NOTIFY into trio, including across a lost connection."""

from __future__ import annotations

import trio

from engine.db.bridge import Connection
from engine.db.listen import RESYNC, Listener, Notification


async def _next_real(listener: Listener) -> Notification:
    while True:
        note = await listener.receive.receive()
        if note != RESYNC:
            return note


async def test_notifications_arrive_in_trio(db_url: str, conn: Connection) -> None:
    listener = Listener(db_url, ["ch_a", "ch_b"])
    async with trio.open_nursery() as nursery:
        await nursery.start(listener.run)
        await conn.execute("SELECT pg_notify('ch_a', 'one'), pg_notify('ch_b', 'two')")
        with trio.fail_after(5):
            assert await _next_real(listener) == Notification("ch_a", "one")
            assert await _next_real(listener) == Notification("ch_b", "two")
        nursery.cancel_scope.cancel()


async def test_listener_relistens_after_its_backend_is_killed(
    db_url: str, conn: Connection
) -> None:
    listener = Listener(db_url, ["ch"], health_interval=0.2)
    async with trio.open_nursery() as nursery:
        await nursery.start(listener.run)
        assert listener.connection is not None
        old_pid = listener.connection.backend_pid
        await conn.execute("SELECT pg_terminate_backend($1)", old_pid)
        # Keep notifying until the re-listened connection delivers: the first sends may be lost
        # while it is away, which is exactly why RESYNC exists.
        with trio.fail_after(10):
            while listener.reconnects == 0:
                await trio.sleep(0.01)
            await conn.execute("SELECT pg_notify('ch', 'after')")
            assert await _next_real(listener) == Notification("ch", "after")
        assert listener.connection is not None
        assert listener.connection.backend_pid != old_pid
        nursery.cancel_scope.cancel()


async def test_listener_relistens_after_the_server_restarts(aio_loop: None) -> None:
    import tempfile
    from pathlib import Path

    from engine import embedded
    from engine.db.bridge import connect

    def start() -> tuple[embedded.EmbeddedServer, Path]:
        data_dir = Path(tempfile.mkdtemp(prefix="engine-restart-"))
        data_dir.chmod(0o755)
        return embedded.acquire(data_dir, unsafe_fast=True), data_dir

    server, data_dir = await trio.to_thread.run_sync(start)
    url = server.dsn("postgres")
    listener = Listener(url, ["ch"], health_interval=0.2)
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(listener.run)
            await trio.to_thread.run_sync(server.release)  # the server stops...
            server = await trio.to_thread.run_sync(
                lambda: embedded.acquire(data_dir)
            )  # ...and starts
            with trio.fail_after(20):
                while listener.reconnects == 0:
                    await trio.sleep(0.02)
                conn = await connect(url)
                try:
                    await conn.execute("SELECT pg_notify('ch', 'back')")
                finally:
                    await conn.close()
                assert await _next_real(listener) == Notification("ch", "back")
            nursery.cancel_scope.cancel()
    finally:
        await trio.to_thread.run_sync(server.release)
