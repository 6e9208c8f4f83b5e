"""Clocks for the load controller: a protocol so tests can drive time by hand."""

from __future__ import annotations

import time
from typing import Protocol

import attrs
import trio

__all__ = ["Clock", "MonotonicClock", "TrioClock"]


class Clock(Protocol):
    """Something that tells the time in seconds on a monotonic timebase."""

    def now(self) -> float:
        """Return the current time in seconds; only differences between readings matter."""
        ...


@attrs.frozen(slots=True)
class MonotonicClock:
    """The process's monotonic clock (``time.monotonic``); the production default."""

    def now(self) -> float:
        """Return ``time.monotonic()``."""
        return time.monotonic()


@attrs.frozen(slots=True)
class TrioClock:
    """trio's clock (``trio.current_time``): follows ``MockClock``/``autojump_clock`` in tests.

    Only usable from inside ``trio.run``.
    """

    def now(self) -> float:
        """Return ``trio.current_time()``."""
        return trio.current_time()
