"""SIGINT and SIGTERM for the commands: how a service stops, and how a watch stops.

Two ways, one for each kind of command:

* :func:`serve_until_signal`: the commands that run the service in this process (``run``,
  ``migrate``, ``demo``, ``dashboard``). The first signal stops the work gracefully (a drain),
  the second cuts the drain short (:attr:`Shutdown.on_second`), the third exits at once with
  :data:`~engine.cli.exits.EXIT_INTERRUPTED`.
* :func:`run_until_signal`: a client command that watches (``status --watch``, ``submit
  --follow``): the first signal ends the watch, the engine closes as usual, and the command
  exits with :data:`~engine.cli.exits.EXIT_INTERRUPTED`.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
from collections.abc import AsyncIterator, Awaitable, Callable

import trio

from engine.cli.exits import EXIT_INTERRUPTED

__all__ = ["Shutdown", "run_until_signal", "serve_until_signal"]

log = logging.getLogger("engine.cli")


class Shutdown:
    """What the signals have asked for so far: the first stops the work (a drain), the second
    cuts the drain short (``on_second``), the third exits at once."""

    def __init__(self, work: trio.CancelScope) -> None:
        self.work = work
        self.received: list[str] = []
        #: Called on the second signal (the service: requeue what still runs at once).
        self.on_second: Callable[[], None] | None = None


async def _watch_signals(signals: AsyncIterator[int], shutdown: Shutdown) -> None:
    async for signum in signals:
        name = signal.Signals(signum).name
        shutdown.received.append(name)
        count = len(shutdown.received)
        if count == 1:
            log.info(
                "shutting down: draining; send the signal again to requeue running tasks now",
                extra={"event": "shutdown_requested", "signal": name},
            )
            shutdown.work.cancel(reason=f"{name} received")
        elif count == 2 and shutdown.on_second is not None:
            print(
                f"engine: {name} again: requeueing running tasks now (once more to exit at once)",
                file=sys.stderr,
                flush=True,
            )
            shutdown.on_second()
        else:
            print(f"engine: {name} again: exiting at once", file=sys.stderr, flush=True)
            os._exit(EXIT_INTERRUPTED)


async def serve_until_signal(body: Callable[[Shutdown], Awaitable[None]]) -> str | None:
    """Run ``body(shutdown)`` until it returns or SIGINT/SIGTERM arrives; return that signal's
    name.

    The first signal cancels ``body`` (a graceful shutdown: its cleanup runs). The watcher sits
    outside the cancelled scope, so later signals during that cleanup still reach it: the
    second calls ``shutdown.on_second`` if ``body`` set it (else it exits), the third ends the
    process at once with :data:`~engine.cli.exits.EXIT_INTERRUPTED`.
    """
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async with trio.open_nursery() as nursery:
            shutdown = Shutdown(trio.CancelScope())
            nursery.start_soon(_watch_signals, signals, shutdown)
            with shutdown.work:
                await body(shutdown)
            nursery.cancel_scope.cancel(reason="command finished")
    return shutdown.received[0] if shutdown.received else None


async def run_until_signal(work: Callable[[], Awaitable[None]]) -> bool:
    """Run ``work`` until it returns or SIGINT/SIGTERM arrives; True if a signal stopped it.

    A watch or a follow ends this way: the engine then closes as usual, and the command exits
    with :data:`~engine.cli.exits.EXIT_INTERRUPTED` (130)."""
    interrupted = False
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async with trio.open_nursery() as nursery:

            async def watch() -> None:
                nonlocal interrupted
                async for _ in signals:
                    interrupted = True
                    nursery.cancel_scope.cancel(reason="interrupted")
                    return

            nursery.start_soon(watch)
            await work()
            nursery.cancel_scope.cancel(reason="work done")
    return interrupted
