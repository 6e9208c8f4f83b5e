"""The trio-asyncio loop the engine opens runs its ready callbacks in runs, as asyncio does.

trio-asyncio's loop is a trio task that takes one asyncio callback per trio scheduler tick, each
behind a cancel scope. asyncpg schedules callbacks in bursts: a ``call_soon`` for every NOTIFY
it reads (a statement that finishes a hundred tasks sends a hundred), and one for every future
it resolves. One tick per callback made the loop the busiest task of a draining worker (about
two ticks per task, against six for the task's own work), and it handed the notifications to
the process's listener one tick apart, so its subscribers woke once per notification too.

:func:`run_callbacks_in_runs` replaces the loop's step with one that waits as trio-asyncio's
does (for the next callback, or the next timer), then also runs every callback that was already
queued when it woke, in order, before it yields to trio again, like one iteration of asyncio's
own loop (``_run_once`` runs the callbacks that were ready at its start). Callbacks those
callbacks queue wait for the next tick, so a callback that keeps rescheduling itself cannot
starve trio. Everything else (timers, trio tasks started from asyncio, the stop and the drain
at close) is trio-asyncio's own code.

Cancelled timers leave the heap as in asyncio's loop, once they are more than half of at least
100: trio-asyncio keeps each until its time comes. asyncpg's pool bounds every release with a
timer (``RELEASE_TIMEOUT``, 10 s) that the release cancels at once, and each timer holds the
context it was made in, with the task run's context variables: at full speed about 1,500 of
them, each keeping a finished task (and its payload) alive ten seconds for nothing.

It relies on trio-asyncio 0.16's internals (the loop's ``_main_loop_one``, ``_q_recv``,
``_timers`` and ``_nursery``, and its ``AsyncHandle``); pyproject.toml pins trio-asyncio to
0.16.x, and ``engine_tests/db/test_aioloop.py`` holds the behaviour to asyncio's.
"""

from __future__ import annotations

import asyncio
import heapq
import types
from typing import Any

import sniffio
import trio

# Imported only by engine.db.bridge, which has imported trio-asyncio first, quietly.
from trio_asyncio._handles import AsyncHandle

__all__ = ["run_callbacks_in_runs"]


#: asyncio's own thresholds (``base_events``): a heap of at least this many timers...
_MIN_TIMERS_TO_PURGE = 100
#: ...is rebuilt without its cancelled ones once they are more than this fraction of it.
_CANCELLED_FRACTION = 0.5


class _CancelledTimers:
    """Counts the timers of one loop cancelled while in its heap (the loop's
    ``_timer_handle_cancelled`` hook, which ``TimerHandle.cancel`` calls)."""

    __slots__ = ("count",)

    def __init__(self) -> None:
        self.count = 0

    def __call__(self, handle: asyncio.TimerHandle) -> None:
        self.count += 1


def _purge_cancelled(timers: list[asyncio.TimerHandle], cancelled: _CancelledTimers) -> None:
    if len(timers) > _MIN_TIMERS_TO_PURGE and cancelled.count > _CANCELLED_FRACTION * len(timers):
        timers[:] = [timer for timer in timers if not timer.cancelled()]
        heapq.heapify(timers)
        cancelled.count = 0


async def _step(loop: Any, no_wait: bool = False) -> None:
    """One turn of ``loop``: wait for a callback (or a due timer), then run it and every
    callback queued before it was taken."""
    if no_wait:  # the drain at close: trio-asyncio's own step, one callback at a time
        await type(loop)._main_loop_one(loop, no_wait=True)
        return
    timers: list[asyncio.TimerHandle] = loop._timers
    _purge_cancelled(timers, loop._timer_handle_cancelled)
    receive: trio.MemoryReceiveChannel[Any] = loop._q_recv
    if timers:
        if timers[0].when() <= loop.time():
            timer = heapq.heappop(timers)
            if not timer.cancelled():
                _run(timer)
            return
        handle = None
        with trio.move_on_at(timers[0].when()):
            handle = await receive.receive()
        if handle is None:  # the next timer is due
            return
    else:
        # No timer: no cancel scope either (trio-asyncio enters one with an infinite deadline).
        handle = await receive.receive()
    queued = receive.statistics().current_buffer_used
    while True:
        if isinstance(handle, asyncio.TimerHandle):
            heapq.heappush(timers, handle)
        elif isinstance(handle, AsyncHandle):
            # A trio task started from asyncio: started as trio-asyncio starts it.
            handle._context.run(loop._nursery.start_soon, handle._run, name=handle._callback)
            await handle._started.wait()
        elif not handle.cancelled():
            _run(handle)
        if queued <= 0:
            return
        queued -= 1
        handle = receive.receive_nowait()


def _run(handle: asyncio.Handle) -> None:
    # asyncio code may ask sniffio which library runs it, as under trio-asyncio's own step.
    previous, sniffio.thread_local.name = sniffio.thread_local.name, "asyncio"
    try:
        handle._run()
    finally:
        sniffio.thread_local.name = previous


async def run_callbacks_in_runs(loop: Any) -> None:
    """Make ``loop`` (a running trio-asyncio loop) run its queued callbacks in runs (see the
    module docstring); it does from the return on."""
    loop._timer_handle_cancelled = _CancelledTimers()
    loop._main_loop_one = types.MethodType(_step, loop)
    # The loop is already waiting inside trio-asyncio's own step: one callback through it,
    # and its next step is this module's.
    await loop.synchronize()
