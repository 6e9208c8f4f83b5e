"""What the queue reports as it works: the seam its observer (the service's metrics) plugs into.

The queue client is handed one :class:`QueueObserver` when it is built
(:func:`engine.queue.client.make_queue_client`) and gives it to its completer and to every
generation and producer it makes, so the first claim and the first completion batch are
reported like every later one. The queue knows nothing above it: whoever builds the client
chooses what observes it (:data:`QUIET` when nothing does).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final, Protocol

from engine.queue.executor import Completion

__all__ = ["QUIET", "NullQueueObserver", "QueueObserver"]


class QueueObserver(Protocol):
    """The queue's events, each reported synchronously from the trio task where it happened:
    an implementation must be cheap and must not raise."""

    def claimed(self, seconds: float) -> None:
        """One claim statement of a producer took ``seconds``."""
        ...

    def completions_flushed(self, batch: Sequence[Completion], seconds: float | None) -> None:
        """``batch`` was written: by the completer in ``seconds``, or, with ``seconds``
        ``None``, carried by a producer's claim (timed as that claim). Every outcome is
        reported exactly once."""
        ...


class NullQueueObserver:
    """Observes nothing: the observer of a queue built without one."""

    def claimed(self, seconds: float) -> None:
        """Ignore the claim."""

    def completions_flushed(self, batch: Sequence[Completion], seconds: float | None) -> None:
        """Ignore the batch."""


QUIET: Final[QueueObserver] = NullQueueObserver()
"""The shared :class:`NullQueueObserver`."""
