"""A process-wide bound on running jobs, shared by every generation.

While an old generation drains and a new one runs, each has its own ``max_workers``; this
bound (the instance's allocated capacity, the "claim limit") keeps their sum in check. Like
``trio.CapacityLimiter.total_tokens``: raising it takes effect at once, lowering it never
interrupts a running job, it only stops new claims until enough finish.
"""

from __future__ import annotations

import math

import attrs

from engine.db.listen import Wakeup

__all__ = ["SlotPool", "SlotStatistics"]


@attrs.frozen
class SlotStatistics:
    """A snapshot of a :class:`SlotPool`."""

    total: float
    in_use: int


class SlotPool:
    """Counts running jobs against a resizable total; claims take slots, finishes give back."""

    def __init__(self, total: float = math.inf) -> None:
        self._total = total
        self._in_use = 0
        self._waiters: set[Wakeup] = set()

    @property
    def total(self) -> float:
        """The most jobs the process may run at once (``math.inf`` = no bound)."""
        return self._total

    @total.setter
    def total(self, value: float) -> None:
        if value < 0:
            raise ValueError("total must be >= 0")
        grew = value > self._total
        self._total = value
        if grew:
            self._wake()

    @property
    def in_use(self) -> int:
        """Slots held by running jobs."""
        return self._in_use

    def available(self) -> int:
        """How many more jobs may start now."""
        free = self._total - self._in_use
        return max(0, int(min(free, 2**31)))

    def take(self, n: int) -> None:
        """Hold ``n`` slots (the caller checked :meth:`available`; going over is a bug)."""
        if n > self.available():
            raise RuntimeError(f"taking {n} slots with only {self.available()} free")
        self._in_use += n

    def give_back(self, n: int = 1) -> None:
        """Return ``n`` slots and wake producers waiting for room."""
        if n > self._in_use:
            raise RuntimeError("giving back more slots than were taken")
        self._in_use -= n
        self._wake()

    def notify_when_free(self, wakeup: Wakeup) -> None:
        """Set ``wakeup`` once, the next time a slot frees up (or the total grows)."""
        self._waiters.add(wakeup)

    def statistics(self) -> SlotStatistics:
        """Total and in-use counts."""
        return SlotStatistics(self._total, self._in_use)

    def _wake(self) -> None:
        if self._waiters:
            waiters, self._waiters = self._waiters, set()
            for wakeup in waiters:
                wakeup.set()
