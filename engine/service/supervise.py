"""Supervision of the control layer's siblings: a crash restarts the sibling from a fresh state."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

import trio

from engine.errors import leaves
from engine.service.health import Health

__all__ = ["RESTART_BACKOFF_MAX", "supervise"]

log = logging.getLogger(__name__)

#: Seconds between two restarts of a sibling that keeps crashing, at most (from 0.5 s, doubling;
#: back to 0.5 s once a run has lasted this long).
RESTART_BACKOFF_MAX = 30.0


async def supervise(
    name: str,
    make: Callable[[], Callable[..., Awaitable[Any]]],
    health: Health,
    *,
    task_status: trio.TaskStatus[Any] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Run the service ``make()(task_status=...)`` until cancelled.

    ``make`` builds the service afresh for every run, so a restart never inherits the state of
    the run that crashed. A failure before the first start is raised (the service cannot come
    up, and neither can the tree). A crash after it, or a failed restart, is logged with its
    traceback (``event=service_crashed``), ``name`` is marked down in ``health`` (``/readyz``
    then says not ready), and the service is made and started again after a backoff from
    0.5 s doubling to :data:`RESTART_BACKOFF_MAX`; it is marked up once that run has started.
    """
    health.mark(name, False)
    first = True
    backoff = 0.5
    while True:
        began = trio.current_time()
        try:
            async with trio.open_nursery() as nursery:
                try:
                    value = await nursery.start(make())
                except Exception as exc:
                    if first:
                        raise _FirstStartFailed(exc) from exc
                    raise
                health.mark(name, True)
                if first:
                    first = False
                    task_status.started(value)
            return  # the service ended on its own
        except Exception as exc:
            found = [e for e in leaves(exc) if isinstance(e, _FirstStartFailed)]
            if found:
                raise found[0].error from found[0].error.__cause__
            health.mark(name, False)
            if trio.current_time() - began >= RESTART_BACKOFF_MAX:
                backoff = 0.5
            log.error(
                "service crashed; restarting",
                exc_info=exc,
                extra={"event": "service_crashed", "service": name, "backoff": backoff},
            )
        await trio.sleep(backoff)
        backoff = min(backoff * 2, RESTART_BACKOFF_MAX)


class _FirstStartFailed(Exception):
    """Carries a first start's error out of the nursery, to be raised as itself."""

    def __init__(self, error: Exception) -> None:
        super().__init__(str(error))
        self.error = error
