"""The garbage collector's settings while a process runs jobs (``queue.gc_tuning``).

A job run allocates many short-lived objects, and reference counting frees almost all of
them; the collector, triggered every 700 net allocations, still walks the young generations
several times a task and the whole heap every few seconds (in ``bench tasks``: ~1,400
collections over 10,000 tasks, 0.9 s of CPU, collecting ~6,000 objects in all). Each walk of
the whole heap also stops every job for as long as it takes: 15-30 ms in a process running the
queue alone (the queue benchmark), more as the heap grows. Freezing what exists once the first
generation starts, and collecting the youngest generation every 10,000 allocations, leaves the
long-lived objects out of every walk and makes the walks rare.

The settings are the process's, and several generations run in one process (a resize runs the
new one beside the old; tests and an app may open several queues or engines): the first
generation to tune them keeps the previous ones, the last to stop puts them back.
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
#: Whether objects were frozen before the first holder froze (by the application, or by the
#: interpreter itself: some builds freeze their start-up objects).
_frozen_before = False


@contextmanager
def tuned_collector(enabled: bool) -> Iterator[None]:
    """Freeze what exists and raise the youngest generation's threshold for the block (nothing
    when not ``enabled``).

    The last block to leave puts the previous threshold back, and unfreezes what it froze,
    unless objects were already frozen when the first began: ``gc`` cannot tell them apart,
    and unfreezing someone else's would undo their choice, so then everything stays frozen.
    """
    global _holders, _previous, _frozen_before
    if not enabled:
        yield
        return
    if _holders == 0:
        _previous = gc.get_threshold()
        _frozen_before = gc.get_freeze_count() > 0
        gc.freeze()
        gc.set_threshold(max(TUNED_THRESHOLD, _previous[0]), *_previous[1:])
    _holders += 1
    try:
        yield
    finally:
        _holders -= 1
        if _holders == 0 and _previous is not None:
            gc.set_threshold(*_previous)
            if not _frozen_before:
                gc.unfreeze()
            _previous = None
