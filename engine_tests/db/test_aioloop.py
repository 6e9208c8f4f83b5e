"""The loop :func:`asyncio_loop` opens runs the callbacks queued when it wakes in one run, in
order, as asyncio's own loop does; what they queue waits for its next turn, timers keep their
times, and asyncio and trio code still call each other through it."""

from __future__ import annotations

import asyncio

import trio
import trio_asyncio

from engine.db.bridge import asyncio_loop, call


def _loop() -> asyncio.AbstractEventLoop:
    loop = trio_asyncio.current_loop.get()
    assert loop is not None
    return loop  # type: ignore[no-any-return]


async def test_a_burst_of_callbacks_runs_in_one_turn_in_order() -> None:
    async with asyncio_loop():
        loop = _loop()
        ran: list[int] = []
        for n in range(100):
            loop.call_soon(ran.append, n)
        # Two ticks of ours: the loop's task has had one turn in between (trio's own loop
        # would have run one callback in it).
        await trio.lowlevel.checkpoint()
        await trio.lowlevel.checkpoint()
        assert ran == list(range(100))


async def test_what_a_callback_queues_runs_after_what_was_queued_before() -> None:
    async with asyncio_loop():
        loop = _loop()
        ran: list[str] = []

        def first() -> None:
            ran.append("first")
            loop.call_soon(ran.append, "queued by first")

        loop.call_soon(first)
        loop.call_soon(ran.append, "second")
        with trio.fail_after(5):
            while len(ran) < 3:
                await trio.lowlevel.checkpoint()
        assert ran == ["first", "second", "queued by first"]


async def test_a_callback_that_reschedules_itself_does_not_starve_trio() -> None:
    async with asyncio_loop():
        loop = _loop()
        turns = 0
        stopped = False

        def again() -> None:
            nonlocal turns
            turns += 1
            if not stopped:
                loop.call_soon(again)

        loop.call_soon(again)
        with trio.fail_after(5):
            await trio.sleep(0.05)  # needs trio's own timers to run while the callback spins
        stopped = True
        assert turns > 1


async def test_timers_fire_in_order_and_a_cancelled_one_does_not() -> None:
    async with asyncio_loop():
        loop = _loop()
        fired: list[str] = []
        done = trio.Event()
        started = trio.current_time()
        loop.call_later(0.06, lambda: (fired.append("late"), done.set()))
        loop.call_later(0.02, fired.append, "early")
        loop.call_later(0.01, fired.append, "cancelled").cancel()
        with trio.fail_after(5):
            await done.wait()
        assert fired == ["early", "late"]
        assert trio.current_time() - started >= 0.06


async def test_asyncio_and_trio_still_call_each_other() -> None:
    async with asyncio_loop():

        async def from_asyncio() -> int:
            await asyncio.sleep(0.01)
            # A trio task started from asyncio code, awaited there.
            return int(await trio_asyncio.trio_as_aio(trio_side)())

        async def trio_side() -> int:
            await trio.sleep(0.01)
            return 41

        with trio.fail_after(5):
            assert await call(from_asyncio) + 1 == 42


async def test_cancelled_timers_leave_the_heap_as_in_asyncio() -> None:
    """A timer cancelled long before its time (asyncpg bounds every pool release with one)
    does not stay in the loop, holding its context, until then; the others stay, in order."""
    async with asyncio_loop():
        loop = _loop()
        handles = [loop.call_later(60, lambda: None) for _ in range(1000)]
        fired: list[int] = []
        loop.call_later(0.01, fired.append, 1)
        for handle in handles[:900]:
            handle.cancel()
        with trio.fail_after(5):
            while not fired:
                await trio.sleep(0.005)
        timers = loop._timers  # type: ignore[attr-defined]
        assert {id(t) for t in handles[900:]} <= {id(t) for t in timers}
        assert not any(t.cancelled() for t in timers)
        assert timers[0].when() == min(t.when() for t in timers)  # still a heap
        for handle in handles[900:]:
            handle.cancel()
