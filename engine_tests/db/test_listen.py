"""LISTEN/NOTIFY into trio, including across a lost connection, and the hub that fans one
connection out to subscribers."""

from __future__ import annotations

import pytest
import trio

from engine.db.bridge import Connection
from engine.db.listen import RESYNC, Listener, ListenHub, Notification, Subscription


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


async def test_an_overflowing_listener_resyncs_at_once(db_url: str, conn: Connection) -> None:
    """Five notifications into a buffer of two: the two, then RESYNC, long before the next
    health probe (30 s away)."""
    listener = Listener(db_url, ["ch"], buffer=2, health_interval=30)
    async with trio.open_nursery() as nursery:
        await nursery.start(listener.run)
        with trio.fail_after(5):
            assert await listener.receive.receive() == RESYNC  # connected
        await conn.execute("SELECT pg_notify('ch', n::text) FROM generate_series(1, 5) AS n")
        with trio.fail_after(5):
            # Nobody receives meanwhile: the listener overflows and waits to send its RESYNC.
            while listener.receive.statistics().tasks_waiting_send == 0:
                await trio.sleep(0.01)
            got = [await listener.receive.receive() for _ in range(3)]
        assert got == [Notification("ch", "1"), Notification("ch", "2"), RESYNC]
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


async def test_the_hub_fans_each_channel_out_to_its_subscribers(
    db_url: str, conn: Connection
) -> None:
    hub = ListenHub(db_url, ["ch_a", "ch_b"])
    with (
        hub.subscribe("ch_a", "ch_b") as both,
        hub.subscribe("ch_b") as only_b,
        hub.wakeup("ch_a") as woken,
    ):
        async with trio.open_nursery() as nursery:
            await nursery.start(hub.run)
            await conn.execute("SELECT pg_notify('ch_a', 'one'), pg_notify('ch_b', 'two')")
            with trio.fail_after(5):
                assert await _next_from(both) == Notification("ch_a", "one")
                assert await _next_from(both) == Notification("ch_b", "two")
                assert await _next_from(only_b) == Notification("ch_b", "two")
                await woken.wait()
            # One wake-up for any number of notifications that came meanwhile.
            woken.clear()
            await conn.execute("SELECT pg_notify('ch_a', '1'), pg_notify('ch_a', '2')")
            await conn.execute("SELECT pg_notify('ch_b', 'marker')")
            with trio.fail_after(5):
                assert await _next_from(only_b) == Notification("ch_b", "marker")
                await woken.wait()
            with pytest.raises(trio.WouldBlock):
                woken._receive.receive_nowait()
            nursery.cancel_scope.cancel()


async def test_the_hub_resyncs_every_subscriber_once_after_a_reconnect(
    db_url: str, conn: Connection
) -> None:
    hub = ListenHub(db_url, ["ch_a", "ch_b"], health_interval=0.2)
    with hub.subscribe("ch_a", "ch_b") as both, hub.wakeup("ch_b") as woken:
        async with trio.open_nursery() as nursery:
            await nursery.start(hub.run)
            with trio.fail_after(5):
                assert await both.receive() == RESYNC  # the first connection's
                await woken.wait()
            assert hub.listener.connection is not None
            await conn.execute(
                "SELECT pg_terminate_backend($1)", hub.listener.connection.backend_pid
            )
            with trio.fail_after(10):
                await woken.wait()
                while hub.listener.reconnects == 0:
                    await trio.sleep(0.01)
            await conn.execute("SELECT pg_notify('ch_a', 'after')")
            received = []
            with trio.fail_after(5):
                while not received or received[-1] == RESYNC:
                    received.append(await both.receive())
            # Subscribed to two channels, it got one RESYNC per reconnect, then what came next.
            assert received == [RESYNC] * hub.listener.reconnects + [Notification("ch_a", "after")]
            nursery.cancel_scope.cancel()


async def test_the_hub_fans_out_a_run_of_notifications_in_one_turn() -> None:
    """A statement that finishes many tasks sends a NOTIFY for each: once the hub wakes for
    the first, every one already buffered reaches the subscriber before it runs again."""
    hub = ListenHub(None, ["ch"])
    with hub.subscribe("ch") as notes:
        async with trio.open_nursery() as nursery:
            await nursery.start(hub.run)
            for n in range(50):
                hub.listener._send.send_nowait(Notification("ch", str(n)))
            with trio.fail_after(5):
                first = await notes.receive()
            with trio.CancelScope() as no_waiting:
                no_waiting.cancel()  # a receive that had to wait would raise Cancelled
                rest = [await notes.receive() for _ in range(49)]
            assert [first, *rest] == [Notification("ch", str(n)) for n in range(50)]
            nursery.cancel_scope.cancel()


def test_the_hub_refuses_a_channel_it_does_not_listen_on() -> None:
    hub = ListenHub(None, ["ch_a"])
    with pytest.raises(ValueError, match="ch_b"), hub.subscribe("ch_a", "ch_b"):
        pass
    with pytest.raises(ValueError, match="no channel"), hub.wakeup():
        pass
    # A refused subscription left nothing behind.
    assert hub._subscribers == {"ch_a": {}}


async def test_a_subscriber_that_falls_behind_gets_resync_after_what_it_kept() -> None:
    subscription = Subscription(["ch"], buffer=2)
    for n in range(5):
        subscription.deliver(Notification("ch", str(n)))
    assert [await subscription.receive() for _ in range(3)] == [
        Notification("ch", "0"),
        Notification("ch", "1"),
        RESYNC,
    ]
    subscription.deliver(Notification("ch", "5"))
    assert await subscription.receive() == Notification("ch", "5")


async def test_a_hub_without_a_url_starts_and_delivers_nothing() -> None:
    hub = ListenHub(None, ["ch"])
    async with trio.open_nursery() as nursery:
        await nursery.start(hub.run)
        assert hub.listener.connection is None
        with hub.subscribe("ch") as notes:
            with trio.move_on_after(0.2) as idle:
                await notes.receive()
            assert idle.cancelled_caught
        nursery.cancel_scope.cancel()


async def _next_from(subscription: Subscription) -> Notification:
    while True:
        note = await subscription.receive()
        if note != RESYNC:
            return note
