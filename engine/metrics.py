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
from datetime import UTC, datetime
from typing import Final, Protocol

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    PlatformCollector,
    ProcessCollector,
    exposition,
    generate_latest,
)

from engine._version import __version__
from engine.load.controller import LoadSnapshot, PressureState

__all__ = [
    "CONTENT_TYPE",
    "JOB_STATES",
    "MAX_MODEL_LABELS",
    "OTHER_MODEL",
    "PRESSURE_STATES",
    "RESIZE_OUTCOMES",
    "Metrics",
    "StatedItem",
    "TimedTask",
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
MAX_MODEL_LABELS: Final = 200
"""Most distinct ``model`` label values one registry creates; later models share
:data:`OTHER_MODEL`, so a flood of model names cannot grow the series without bound."""

OTHER_MODEL: Final = "other"
"""The ``model`` label value of models beyond :data:`MAX_MODEL_LABELS`."""

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
# Queue wait and end-to-end: a task may wait for a limited model's slot or an upstream for hours.
_TASK_LATENCY_BUCKETS: Final = (*_PHASE_BUCKETS[:-1], 7200.0, 21600.0, 86400.0, math.inf)


class StatedItem(Protocol):
    """Anything with a ``state`` (a completion: ``engine.queue.executor.Completion``)."""

    @property
    def state(self) -> str:
        """The job state written, e.g. ``completed``."""
        ...


class TimedTask(Protocol):
    """The task fields the latency metrics read (an ``engine.tasks.models.Task``)."""

    @property
    def model(self) -> str:
        """The task's model, from the catalogue."""
        ...

    @property
    def attempts(self) -> int:
        """Executions started so far, this one included."""
        ...

    @property
    def created_at(self) -> datetime:
        """When the task was submitted to the engine."""
        ...

    @property
    def started_at(self) -> datetime | None:
        """When an execution first started it."""
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
            ["phase", "model"],
            buckets=_PHASE_BUCKETS,
            registry=r,
        )
        self.tasks = Counter(
            "engine_tasks",
            "Task runs finished, by resulting status and model.",
            ["status", "model"],
            registry=r,
        )
        self.task_queue_wait_seconds = Histogram(
            "engine_task_queue_wait_seconds",
            "Time from a task's submission to its first start, by model.",
            ["model"],
            buckets=_TASK_LATENCY_BUCKETS,
            registry=r,
        )
        self.task_end_to_end_seconds = Histogram(
            "engine_task_end_to_end_seconds",
            "Time from a task's submission to its final status, by model and status.",
            ["model", "status"],
            buckets=_TASK_LATENCY_BUCKETS,
            registry=r,
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
        self.build_info = Gauge(
            "engine_build_info",
            "Always 1; the engine's version as a label.",
            ["version"],
            registry=r,
        )
        self.build_info.labels(version=__version__).set(1)
        # process_* (CPU, memory, file descriptors; Linux only) and python_info.
        ProcessCollector(registry=r)
        PlatformCollector(registry=r)
        self._models: set[str] = set()

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

    def observe_completions(self, batch: Sequence[StatedItem], seconds: float | None) -> None:
        """Record one completion write; fits :class:`engine.queue.completer.Completer`'s
        ``on_flushed``.

        Every item is counted in ``engine_job_completions_total``, including the plain
        completions a producer's claim carried (``seconds`` is ``None`` then: that statement is
        timed as a claim, so the batch histogram is not skewed by it). An empty batch counts
        nothing and times nothing.
        """
        if not batch:
            return
        if seconds is not None:
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

    def model_label(self, model: str) -> str:
        """``model`` as a label value: itself for the first :data:`MAX_MODEL_LABELS` models
        seen, :data:`OTHER_MODEL` after that."""
        if model in self._models:
            return model
        if len(self._models) >= MAX_MODEL_LABELS:
            return OTHER_MODEL
        self._models.add(model)
        return model

    def observe_task_phase(self, phase: str, seconds: float, model: str) -> None:
        """Record the time a task of ``model`` spent in ``phase`` (e.g. ``preparing``);
        fits :class:`engine.tasks.runner.TaskRunner`'s ``on_phase``."""
        self.task_phase_seconds.labels(phase=phase, model=self.model_label(model)).observe(seconds)

    def count_task(self, status: str, model: str, n: int = 1) -> None:
        """Count ``n`` task runs of ``model`` that ended in ``status`` (e.g. ``failed``)."""
        self.tasks.labels(status=status, model=self.model_label(model)).inc(n)

    def observe_task_started(self, task: TimedTask) -> None:
        """Record the queue wait of a task's first start (later attempts are not a wait for
        the queue); fits :class:`engine.tasks.runner.TaskRunner`'s ``on_started``."""
        if task.attempts > 1:
            return
        started = task.started_at or datetime.now(UTC)
        wait = (started - task.created_at).total_seconds()
        self.task_queue_wait_seconds.labels(model=self.model_label(task.model)).observe(
            max(wait, 0.0)
        )

    def observe_task_finished(self, status: str, task: TimedTask | None) -> None:
        """Count one outcome and, with its task, its end-to-end time (submitted until now);
        fits :class:`engine.tasks.runner.TaskRunner`'s ``on_finished``.

        ``task`` is None for a run that failed before its claim returned the task: counted
        under the model ``unknown``, with no latency.
        """
        status = str(getattr(status, "value", status))
        if task is None:
            self.count_task(status, "unknown")
            return
        self.count_task(status, task.model)
        # Wall clock against the database's created_at: clamp a small clock skew at zero.
        elapsed = (datetime.now(UTC) - task.created_at).total_seconds()
        self.task_end_to_end_seconds.labels(
            model=self.model_label(task.model), status=status
        ).observe(max(elapsed, 0.0))

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
