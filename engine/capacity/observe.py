"""What the capacity refresher reports: the seam its observer (the service's metrics) plugs
into.

:class:`engine.capacity.refresher.CapacityRefresher` is handed one :class:`CapacityObserver`
when it is built; the capacity layer knows nothing above it (:data:`QUIET` when nothing
observes it).
"""

from __future__ import annotations

from typing import Final, Protocol

__all__ = ["QUIET", "CapacityObserver", "NullCapacityObserver"]


class CapacityObserver(Protocol):
    """The refresher's events, reported synchronously: an implementation must be cheap and
    must not raise."""

    def capacity_changed(self, allocated: int, desired: int, hard_limit: int, capped: bool) -> None:
        """A refresh set this instance's share (``allocated``), with the catalogue's desired
        capacity, the hard limit and whether that limit cut the desire."""
        ...

    def cluster_changed(self, active_instances: int, cluster_allocated: int) -> None:
        """A refresh saw ``active_instances`` live instances sharing ``cluster_allocated``."""
        ...

    def resized(self, outcome: str) -> None:
        """A refresh changed, or failed to change, the generation: ``refresh_failed``,
        ``start_failed`` or ``success`` (an unchanged share reports nothing)."""
        ...

    def generations_changed(self, n: int) -> None:
        """``n`` generations are alive now (the current one plus draining ones)."""
        ...


class NullCapacityObserver:
    """Observes nothing: the observer of a refresher built without one."""

    def capacity_changed(self, allocated: int, desired: int, hard_limit: int, capped: bool) -> None:
        """Ignore the share."""

    def cluster_changed(self, active_instances: int, cluster_allocated: int) -> None:
        """Ignore the cluster."""

    def resized(self, outcome: str) -> None:
        """Ignore the outcome."""

    def generations_changed(self, n: int) -> None:
        """Ignore the count."""


QUIET: Final[CapacityObserver] = NullCapacityObserver()
"""The shared :class:`NullCapacityObserver`."""
