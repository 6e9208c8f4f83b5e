"""The service's one observer: everything the layers it builds report.

Each layer names what it reports as a protocol of its own, in its own package, so no layer
imports the metrics or anything above it: :class:`~engine.queue.observe.QueueObserver` (claims,
completion batches), :class:`~engine.tasks.observe.TaskObserver` (starts, phases, outcomes) and
:class:`~engine.capacity.observe.CapacityObserver` (share, cluster, resizes, generations).
:class:`Observer` is their union; the service hands one (:class:`engine.metrics.Metrics`) to
each part when it builds it (:mod:`engine.service.root`), so nothing happens before it is
observed.
"""

from __future__ import annotations

from typing import Protocol

from engine.capacity.observe import CapacityObserver
from engine.queue.observe import QueueObserver
from engine.tasks.observe import TaskObserver

__all__ = ["Observer"]


class Observer(QueueObserver, TaskObserver, CapacityObserver, Protocol):
    """Observes the queue, the task runner and the capacity source: what the service's metrics
    implement."""
