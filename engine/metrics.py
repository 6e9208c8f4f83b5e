"""Prometheus metrics, in a registry of the engine's own.

:class:`Metrics` owns its own :class:`prometheus_client.CollectorRegistry`, never the global
one: several engines (or tests) in one process each get their own series and never collide on
registration. It carries the reference's metrics (``SetAsyncWorkerCapacity``,
``SetDistributedWorkerCapacity``, ``SetWorkerLoad``, ``ObserveAsyncWorkerResize``) and the
engine's own (queue depth, claim and completion latency, task phases, recoveries, admissions,
leadership, generations).

They are served, with ``/healthz`` and ``/readyz``, by the process's HTTP server
(:mod:`engine.web`), through prometheus_client's own exposition.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from typing import Final, Protocol

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    exposition,
    generate_latest,
)

from engine.load.controller import LoadSnapshot, PressureState

__all__ = [
    "CONTENT_TYPE",
    "JOB_STATES",
    "PRESSURE_STATES",
    "RESIZE_OUTCOMES",
    "Metrics",
    "StatedItem",
]

log = logging.getLogger(__name__)

CONTENT_TYPE: Final[str] = getattr(
    exposition, "CONTENT_TYPE_PLAIN_0_0_4", exposition.CONTENT_TYPE_LATEST
)
"""The content type of :meth:`Metrics.render`'s output: Prometheus text format 0.0.4.

``generate_latest`` writes the 0.0.4 text format. Since prometheus_client 0.22
``CONTENT_TYPE_LATEST`` announces ``version=1.0.0`` (a format that differs only in how non-legacy
names are escaped, which needs Accept negotiation); the library's own HTTP server answers an
un-negotiated scrape with the 0.0.4 type, and so do we. On older versions ``CONTENT_TYPE_LATEST``
is the 0.0.4 type.
"""

RESIZE_OUTCOMES: Final = ("refresh_failed", "create_failed", "start_failed", "success")
"""Outcomes of ``ObserveAsyncWorkerResize`` (the Go worker's resize metric)."""

PRESSURE_STATES: Final = tuple(state.value for state in PressureState)
"""Values of the ``state`` label of ``engine_worker_pressure_state``."""

JOB_STATES: Final = (
    "available",
    "cancelled",
    "completed",
    "discarded",
    "pending",
    "retryable",
    "running",
    "scheduled",
)
"""River's job states: every queue reported by :meth:`Metrics.set_queue_depth` gets all
of them, zero-filled, so a state that empties reads 0 instead of vanishing."""

_WORKER_LOAD_KINDS: Final = (
    "active_limit",
    "heavy_limit",
    "active",
    "preparing",
    "waiting_upstream",
    "finalizing",
)

# Latency buckets. Claims and completion batches are single statements (milliseconds); task
# phases include provider calls and transfers (seconds to an hour).
_STATEMENT_BUCKETS: Final = (
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    math.inf,
)
_PHASE_BUCKETS: Final = (
    0.01,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
    120.0,
    300.0,
    600.0,
    1800.0,
    3600.0,
    math.inf,
)


class StatedItem(Protocol):
    """Anything with a ``state`` (a completion: ``engine.queue.executor.Completion``)."""

    @property
    def state(self) -> str:
        """The job state written, e.g. ``completed``."""
        ...


class Metrics:
    """The engine's metrics, in a registry of their own; see the module docstring.

    Every method is synchronous and cheap, so it can be called from any trio task (or thread:
    prometheus_client locks its values).
    """

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        """Create every metric in ``registry`` (a new private one if ``None``)."""
        self.registry = registry if registry is not None else CollectorRegistry()
        r = self.registry

        # --- the Go worker's metrics ---
        self.async_worker_capacity = Gauge(
            "engine_async_worker_capacity",
            "Async worker capacity of this instance: current (allocated), desired (global "
            "desire) and hard_limit.",
            ["kind"],
            registry=r,
        )
        self.async_worker_capacity_capped = Gauge(
            "engine_async_worker_capacity_capped",
            "1 if the desired capacity was capped by the hard limit, else 0.",
            registry=r,
        )
        self.distributed_worker_instances = Gauge(
            "engine_distributed_worker_instances",
            "Worker instances currently registered and alive.",
            registry=r,
        )
        self.distributed_worker_capacity = Gauge(
            "engine_distributed_worker_capacity",
            "Capacity across instances: global (allocated in total) and allocated (this "
            "instance's share).",
            ["kind"],
            registry=r,
        )
        self.worker_load = Gauge(
            "engine_worker_load",
            "Local load controller: active_limit (safe capacity), heavy_limit and leases per "
            "phase.",
            ["kind"],
            registry=r,
        )
        self.worker_pressure_state = Gauge(
            "engine_worker_pressure_state",
            "1 for the load controller's current pressure state, 0 for the others.",
            ["state"],
            registry=r,
        )
        self.async_worker_resize = Counter(
            "engine_async_worker_resize",
            "Capacity refreshes that changed (or failed to change) the worker generation.",
            ["outcome"],
            registry=r,
        )

        # --- the engine's own ---
        self.queue_jobs = Gauge(
            "engine_queue_jobs", "Jobs per queue and state.", ["queue", "state"], registry=r
        )
        self.job_claim_seconds = Histogram(
            "engine_job_claim_seconds",
            "Duration of one claim statement.",
            buckets=_STATEMENT_BUCKETS,
            registry=r,
        )
        self.job_completion_batch_seconds = Histogram(
            "engine_job_completion_batch_seconds",
            "Duration of one completion batch write.",
            buckets=_STATEMENT_BUCKETS,
            registry=r,
        )
        self.job_completions = Counter(
            "engine_job_completions",
            "Job outcomes written by the completer, by state written.",
            ["state"],
            registry=r,
        )
        self.task_phase_seconds = Histogram(
            "engine_task_phase_seconds",
            "Time tasks spend in each phase.",
            ["phase"],
            buckets=_PHASE_BUCKETS,
            registry=r,
        )
        self.tasks = Counter(
            "engine_tasks", "Task runs finished, by resulting status.", ["status"], registry=r
        )
        self.recoveries = Counter(
            "engine_recoveries",
            "Rows repaired by recovery, by kind (e.g. requeued tasks, orphaned jobs).",
            ["kind"],
            registry=r,
        )
        self.admissions_waiting = Gauge(
            "engine_admissions_waiting", "Task admissions waiting for a slot.", registry=r
        )
        self.leader = Gauge(
            "engine_leader", "1 if this process is the queue maintenance leader.", registry=r
        )
        self.generations = Gauge(
            "engine_generations",
            "Worker generations alive in this process (the current one plus draining ones).",
            registry=r,
        )

        # Fixed label values exist from the start: a series that appears only on its first
        # event breaks rate() and absent() alerts.
        for kind in ("current", "desired", "hard_limit"):
            self.async_worker_capacity.labels(kind=kind)
        for kind in ("global", "allocated"):
            self.distributed_worker_capacity.labels(kind=kind)
        for kind in _WORKER_LOAD_KINDS:
            self.worker_load.labels(kind=kind)
        self.set_pressure_state(PressureState.NORMAL)
        for outcome in RESIZE_OUTCOMES:
            self.async_worker_resize.labels(outcome=outcome)
        self._queue_series: set[tuple[str, str]] = set()

    # --- the Go worker's metrics -----------------------------------------------------------

    def set_async_worker_capacity(
        self, current: int, desired: int, hard_limit: int, capped: bool
    ) -> None:
        """``SetAsyncWorkerCapacity(current=allocated, desired, hardLimit, capped)``."""
        self.async_worker_capacity.labels(kind="current").set(current)
        self.async_worker_capacity.labels(kind="desired").set(desired)
        self.async_worker_capacity.labels(kind="hard_limit").set(hard_limit)
        self.async_worker_capacity_capped.set(1 if capped else 0)

    def set_distributed_worker_capacity(
        self, active_instances: int, global_capacity: int, allocated: int
    ) -> None:
        """``SetDistributedWorkerCapacity(activeInstances, globalCapacity, allocated)``."""
        self.distributed_worker_instances.set(active_instances)
        self.distributed_worker_capacity.labels(kind="global").set(global_capacity)
        self.distributed_worker_capacity.labels(kind="allocated").set(allocated)

    def set_worker_load(self, snapshot: LoadSnapshot) -> None:
        """The Go worker's ``SetWorkerLoad``: the safe capacity is reported as ``active_limit``.

        Usable as :class:`engine.load.sampler.LoadSamplerService`'s ``on_snapshot``.
        """
        values = {
            "active_limit": snapshot.safe_capacity,
            "heavy_limit": snapshot.heavy_limit,
            "active": snapshot.active,
            "preparing": snapshot.preparing,
            "waiting_upstream": snapshot.waiting_upstream,
            "finalizing": snapshot.finalizing,
        }
        for kind, value in values.items():
            self.worker_load.labels(kind=kind).set(value)
        self.set_pressure_state(snapshot.pressure_state)

    def set_pressure_state(self, state: PressureState | str) -> None:
        """Set ``engine_worker_pressure_state`` one-hot: 1 for ``state``, 0 for the others.

        Raises:
            ValueError: for a state that is not ``normal``, ``elevated`` or ``critical``.
        """
        current = PressureState(state).value
        for name in PRESSURE_STATES:
            self.worker_pressure_state.labels(state=name).set(1 if name == current else 0)

    def observe_resize(self, outcome: str) -> None:
        """``ObserveAsyncWorkerResize(outcome)``; an unchanged capacity emits nothing.

        Raises:
            ValueError: for an outcome outside :data:`RESIZE_OUTCOMES` (a typo must not create
                a new series).
        """
        if outcome not in RESIZE_OUTCOMES:
            raise ValueError(
                f"unknown resize outcome {outcome!r}; expected one of {RESIZE_OUTCOMES}"
            )
        self.async_worker_resize.labels(outcome=outcome).inc()

    # --- queue -----------------------------------------------------------------------------

    def set_queue_depth(self, counts: Mapping[str, Mapping[str, int]]) -> None:
        """Replace ``engine_queue_jobs`` with ``counts[queue][state]``, a full snapshot.

        Each queue present gets every :data:`JOB_STATES` value (missing ones read 0) plus any
        other state given; series of queues no longer present are removed, so a deleted queue
        does not linger at its last value.
        """
        seen: set[tuple[str, str]] = set()
        for queue, states in counts.items():
            for state in (*JOB_STATES, *(s for s in states if s not in JOB_STATES)):
                self.queue_jobs.labels(queue=queue, state=state).set(states.get(state, 0))
                seen.add((queue, state))
        for queue, state in self._queue_series - seen:
            self.queue_jobs.remove(queue, state)
        self._queue_series = seen

    def observe_claim(self, seconds: float) -> None:
        """Record the duration of one claim statement."""
        self.job_claim_seconds.observe(seconds)

    def observe_completions(self, batch: Sequence[StatedItem], seconds: float) -> None:
        """Record one completion write; fits :class:`engine.queue.completer.Completer`'s
        ``on_flushed``.

        An empty batch is a write carried by a producer's claim (the completer reports it with
        no items and no duration): nothing is counted, so it neither skews the latency
        histogram with zeros nor counts rows twice.
        """
        if not batch:
            return
        self.job_completion_batch_seconds.observe(seconds)
        counts: dict[str, int] = {}
        for item in batch:
            # JobState is a StrEnum; str() of it is the plain value either way.
            state = str(getattr(item.state, "value", item.state))
            counts[state] = counts.get(state, 0) + 1
        for state, n in counts.items():
            self.job_completions.labels(state=state).inc(n)

    def set_generations(self, n: int) -> None:
        """Set the number of worker generations alive (current plus draining)."""
        self.generations.set(n)

    def set_leader(self, leading: bool) -> None:
        """Set ``engine_leader`` to 1 while this process leads, else 0."""
        self.leader.set(1 if leading else 0)

    # --- tasks -----------------------------------------------------------------------------

    def observe_task_phase(self, phase: str, seconds: float) -> None:
        """Record the time a task spent in ``phase`` (e.g. ``preparing``, ``finalizing``)."""
        self.task_phase_seconds.labels(phase=phase).observe(seconds)

    def count_task(self, status: str, n: int = 1) -> None:
        """Count ``n`` task runs that ended in ``status`` (e.g. ``succeeded``, ``failed``)."""
        self.tasks.labels(status=status).inc(n)

    def count_recoveries(self, kind: str, n: int) -> None:
        """Count ``n`` rows repaired by recovery of ``kind``; 0 only creates the series."""
        self.recoveries.labels(kind=kind).inc(n)

    def count_recovery_round(self, counts: Mapping[str, int]) -> None:
        """Count a whole recovery round, ``{kind: n}``."""
        for kind, n in counts.items():
            self.count_recoveries(kind, n)

    def set_admissions_waiting(self, n: int) -> None:
        """Set the number of admissions in state ``waiting``."""
        self.admissions_waiting.set(n)

    # --- exposition ------------------------------------------------------------------------

    def render(self) -> bytes:
        """The registry in Prometheus text format 0.0.4 (:data:`CONTENT_TYPE`)."""
        return bytes(generate_latest(self.registry))
