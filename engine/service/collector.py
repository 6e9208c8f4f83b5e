"""The garbage collector's settings while a worker's service runs (``worker.gc_tuning``).

A task run allocates many short-lived objects, and reference counting frees almost all of
them; the collector, triggered every 700 net allocations, still walks the young generations
several times a task and the whole heap every few seconds (in ``bench tasks``: ~1,400
collections over 10,000 tasks, 0.9 s of CPU, collecting ~6,000 objects in all). Freezing what
exists once the service has started, and collecting the youngest generation every 10,000
allocations, leaves the long-lived objects out of every walk and makes the walks rare.

The settings are the process's, and several services may run in one process (tests, an app
embedding two engines): the first service to tune them keeps the previous ones, the last to
stop puts them back.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["TUNED_THRESHOLD", "tuned_collector"]

#: Allocations (net of deallocations) between two collections of the youngest generation.
TUNED_THRESHOLD = 10_000

_holders = 0
_previous: tuple[int, int, int] | None = None


@contextmanager
def tuned_collector(enabled: bool) -> Iterator[None]:
    """Freeze what exists and raise the youngest generation's threshold for the block (nothing
    when not ``enabled``)."""
    global _holders, _previous
    if not enabled:
        yield
        return
    if _holders == 0:
        _previous = gc.get_threshold()
        gc.freeze()
        gc.set_threshold(max(TUNED_THRESHOLD, _previous[0]), *_previous[1:])
    _holders += 1
    try:
        yield
    finally:
        _holders -= 1
        if _holders == 0 and _previous is not None:
            gc.set_threshold(*_previous)
            gc.unfreeze()
            _previous = None
