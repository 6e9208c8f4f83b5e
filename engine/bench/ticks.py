"""Scheduler ticks: how many times trio ran a task, counted while a block runs.

A tick is one step of one trio task (from a wake-up to its next wait). Each costs the scheduler
a few microseconds, and unlike the rates on this project's shared 2-core machines the count is
the same from run to run: ``bench tasks`` prints it per task, so a change that adds or removes
wake-ups shows up whatever the machine's speed that day.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager

import trio

__all__ = ["TickCounter", "counting_ticks"]


class TickCounter(trio.abc.Instrument):
    """Counts task steps, in all and by task name (``by_task``)."""

    def __init__(self) -> None:
        self.total = 0
        self.by_task: Counter[str] = Counter()

    def before_task_step(self, task: trio.lowlevel.Task) -> None:
        """Count one step of ``task``."""
        self.total += 1
        self.by_task[task.name] += 1


@contextmanager
def counting_ticks() -> Iterator[TickCounter]:
    """Count the ticks of every task of this trio run while in the block."""
    counter = TickCounter()
    trio.lowlevel.add_instrument(counter)
    try:
        yield counter
    finally:
        trio.lowlevel.remove_instrument(counter)
