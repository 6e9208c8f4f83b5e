"""Prometheus metrics, in a registry of the engine's own.

:class:`Metrics` owns its own :class:`prometheus_client.CollectorRegistry`, never the global
one: several engines (or tests) in one process each get their own series and never collide on
registration. Limits (capacity, the load controller's) and usage (executions per phase,
admissions waiting) are separate series, each named for what it measures; ``docs/operations.md``
lists them and the older names they replace.

Events reach them through the service's observer: :class:`Metrics` implements
:class:`engine.service.observe.Observer` (the queue's, the task runner's and the capacity
refresher's protocols), and the service hands it to each of those when it builds them, so the
first claim, completion batch and task are counted like every later one. Its method names say
what happened (``claimed``, ``task_finished``, ``resized``); the gauges nothing reports are
set by the service's own loop (``set_*``).

They are served, with ``/healthz`` and ``/readyz``, by the process's HTTP server
(:mod:`engine.web`), through prometheus_client's own exposition.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, Final, Protocol

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
from engine.load.controller import LoadSnapshot
from engine.load.pressure import PressureState

__all__ = [
    "CONTENT_TYPE",
    "EXECUTION_PHASES",
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
"""Values of the ``outcome`` label of ``engine_capacity_resizes_total``."""

PRESSURE_STATES: Final = tuple(state.value for state in PressureState)
"""Values of the ``state`` label of ``engine_load_pressure_state``."""

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

EXECUTION_PHASES: Final = ("preparing", "waiting_upstream", "finalizing")
"""Values of the ``phase`` label of ``engine_executions_in_phase``."""

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
    """The task fields the latency metrics read (an ``engine.domain.tasks.Task``)."""

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

        # --- capacity: limits, each its own series ---
        self.capacity_allocated = Gauge(
            "engine_capacity_allocated_slots",
            "Tasks this instance may run at once: its share of the cluster's capacity.",
            registry=r,
        )
        self.capacity_desired = Gauge(
            "engine_capacity_desired_slots",
            "The capacity the catalogue asks for (model and group limits), before the hard limit.",
            registry=r,
        )
        self.capacity_hard_limit = Gauge(
            "engine_capacity_hard_limit_slots",
            "worker.hard_limit: the most the cluster runs at once, whatever the catalogue asks.",
            registry=r,
        )
        self.capacity_capped = Gauge(
            "engine_capacity_capped",
            "1 if the hard limit cut the desired capacity, else 0.",
            registry=r,
        )
        self.capacity_cluster_allocated = Gauge(
            "engine_capacity_cluster_allocated_slots",
            "Capacity allocated across all live instances (the sum of their shares).",
            registry=r,
        )
        self.instances_alive = Gauge(
            "engine_instances_alive",
            "Worker instances registered and alive, which split the capacity.",
            registry=r,
        )
        self.capacity_resizes = Counter(
            "engine_capacity_resizes",
            "Capacity refreshes that changed (or failed to change) the worker generation.",
            ["outcome"],
            registry=r,
        )

        # --- load: the controller's limits, then usage, as separate series ---
        self.load_safe_capacity = Gauge(
            "engine_load_safe_capacity_slots",
            "The load controller's active limit: executions it lets start at once here.",
            registry=r,
        )
        self.load_heavy_limit = Gauge(
            "engine_load_heavy_limit_slots",
            "The load controller's limit on executions in heavy phases at once here.",
            registry=r,
        )
        self.load_pressure_state = Gauge(
            "engine_load_pressure_state",
            "1 for the load controller's current pressure state, 0 for the others.",
            ["state"],
            registry=r,
        )
        self.executions_active = Gauge(
            "engine_executions_active",
            "Task executions running in this instance now.",
            registry=r,
        )
        self.executions_in_phase = Gauge(
            "engine_executions_in_phase",
            "Task executions running in this instance now, by phase.",
            ["phase"],
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
            "engine_admissions_waiting",
            "Task admissions waiting for a slot, cluster-wide, by model.",
            ["model"],
            registry=r,
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
        #: The children of the per-task series, by (series, label values; the model as its
        #: label, so the map is bounded like the series): ``labels()`` checks and sorts its
        #: arguments on every call, and a run asks six times. Those series are never removed,
        #: so a child, once made, stays the registry's own.
        self._children: dict[tuple[object, str, str], Any] = {}

        # Fixed label values exist from the start: a series that appears only on its first
        # event breaks rate() and absent() alerts.
        for phase in EXECUTION_PHASES:
            self.executions_in_phase.labels(phase=phase)
        self.set_pressure_state(PressureState.NORMAL)
        for outcome in RESIZE_OUTCOMES:
            self.capacity_resizes.labels(outcome=outcome)
        self._queue_series: set[tuple[str, str]] = set()
        self._waiting_models: set[str] = set()

    # --- capacity and load ---------------------------------------------------------------

    def capacity_changed(self, allocated: int, desired: int, hard_limit: int, capped: bool) -> None:
        """Set this instance's share, the catalogue's desired capacity, the hard limit and
        whether that limit cut the desire (one capacity refresh)."""
        self.capacity_allocated.set(allocated)
        self.capacity_desired.set(desired)
        self.capacity_hard_limit.set(hard_limit)
        self.capacity_capped.set(1 if capped else 0)

    def cluster_changed(self, active_instances: int, cluster_allocated: int) -> None:
        """Set the live instances and the capacity allocated across them."""
        self.instances_alive.set(active_instances)
        self.capacity_cluster_allocated.set(cluster_allocated)

    def set_load(self, snapshot: LoadSnapshot) -> None:
        """Set the load controller's limits, the executions per phase and the pressure state.

        Usable as :class:`engine.load.sampler.LoadSamplerService`'s ``on_snapshot``.
        """
        self.load_safe_capacity.set(snapshot.safe_capacity)
        self.load_heavy_limit.set(snapshot.heavy_limit)
        self.executions_active.set(snapshot.active)
        for phase in EXECUTION_PHASES:
            self.executions_in_phase.labels(phase=phase).set(getattr(snapshot, phase))
        self.set_pressure_state(snapshot.pressure_state)

    def set_pressure_state(self, state: PressureState | str) -> None:
        """Set ``engine_load_pressure_state`` one-hot: 1 for ``state``, 0 for the others.

        Raises:
            ValueError: for a state that is not ``normal``, ``elevated`` or ``critical``.
        """
        current = PressureState(state).value
        for name in PRESSURE_STATES:
            self.load_pressure_state.labels(state=name).set(1 if name == current else 0)

    def resized(self, outcome: str) -> None:
        """Count one capacity refresh's ``outcome``; an unchanged capacity counts nothing.

        Raises:
            ValueError: for an outcome outside :data:`RESIZE_OUTCOMES` (a typo must not create
                a new series).
        """
        if outcome not in RESIZE_OUTCOMES:
            raise ValueError(
                f"unknown resize outcome {outcome!r}; expected one of {RESIZE_OUTCOMES}"
            )
        self.capacity_resizes.labels(outcome=outcome).inc()

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

    def claimed(self, seconds: float) -> None:
        """Record the duration of one claim statement."""
        self.job_claim_seconds.observe(seconds)

    def completions_flushed(self, batch: Sequence[StatedItem], seconds: float | None) -> None:
        """Record one completion write (the completer's, or the plain completions a claim
        carried).

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

    def generations_changed(self, n: int) -> None:
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

    def _child(self, metric: Any, model: str, **label: str) -> Any:
        """``metric.labels(model=<its label>, **label)``, made once per label set (at most one
        label besides the model)."""
        model = self.model_label(model)
        key = (metric, next(iter(label.values()), ""), model)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = metric.labels(model=model, **label)
        return child

    def phase_done(self, phase: str, seconds: float, model: str) -> None:
        """Record the time a task of ``model`` spent in ``phase`` (e.g. ``preparing``)."""
        self._child(self.task_phase_seconds, model, phase=phase).observe(seconds)

    def count_task(self, status: str, model: str, n: int = 1) -> None:
        """Count ``n`` task runs of ``model`` that ended in ``status`` (e.g. ``failed``)."""
        self._child(self.tasks, model, status=status).inc(n)

    def task_started(self, task: TimedTask) -> None:
        """Record the queue wait of a task's first start (later attempts are not a wait for
        the queue)."""
        if task.attempts > 1:
            return
        started = task.started_at or datetime.now(UTC)
        wait = (started - task.created_at).total_seconds()
        self._child(self.task_queue_wait_seconds, task.model).observe(max(wait, 0.0))

    def task_finished(self, status: str, task: TimedTask | None) -> None:
        """Count one outcome and, with its task, its end-to-end time (submitted until now).

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
        self._child(self.task_end_to_end_seconds, task.model, status=status).observe(
            max(elapsed, 0.0)
        )

    def count_recoveries(self, kind: str, n: int) -> None:
        """Count ``n`` rows repaired by recovery of ``kind``; 0 only creates the series."""
        self.recoveries.labels(kind=kind).inc(n)

    def count_recovery_round(self, counts: Mapping[str, int]) -> None:
        """Count a whole recovery round, ``{kind: n}``."""
        for kind, n in counts.items():
            self.count_recoveries(kind, n)

    def set_admissions_waiting(self, counts: Mapping[str, int]) -> None:
        """Set the admissions waiting per model, ``{model: n}``, a full snapshot.

        A model seen before and absent now reads 0 (its waiters were admitted), rather than
        keeping its last value; models beyond :data:`MAX_MODEL_LABELS` add up under
        :data:`OTHER_MODEL`.
        """
        labelled: dict[str, int] = {}
        for model, n in counts.items():
            label = self.model_label(model)
            labelled[label] = labelled.get(label, 0) + n
        for label in self._waiting_models - labelled.keys():
            self.admissions_waiting.labels(model=label).set(0)
        for label, n in labelled.items():
            self.admissions_waiting.labels(model=label).set(n)
        self._waiting_models |= labelled.keys()

    # --- exposition ------------------------------------------------------------------------

    def render(self) -> bytes:
        """The registry in Prometheus text format 0.0.4 (:data:`CONTENT_TYPE`)."""
        return bytes(generate_latest(self.registry))
