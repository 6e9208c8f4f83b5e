"""The ``scope_limits`` scenario: no fault, scope admissions and rate limits under contention
(the method and its figures are in :mod:`engine.bench.chaos`).

``prepare_scopes`` writes the limits and reads them back, ``scope_requests`` spreads the tasks
over the models and groups, ``watch_scopes`` samples the held slots per scope during the load,
and ``evaluate_scopes`` reports the excesses: from the samples, from the task events
(:func:`running_over_limit`) and from the ledger's submission times (the rate limits).
"""

from __future__ import annotations

import logging
import math
import random
from collections.abc import Mapping, Sequence
from datetime import datetime

import attrs
import trio

from engine.bench.chaos.run import (
    BENCH_APPLICATION,
    IDENTITY,
    ChaosRun,
    Monitor,
    utc_now,
)
from engine.bench.chaos.worker import LEDGER_TABLE
from engine.db.bridge import Record, connect
from engine.domain.tasks import RunMode, TaskRequest

__all__ = [
    "AdmittedExecution",
    "Sweep",
    "evaluate_scopes",
    "prepare_scopes",
    "running_over_limit",
    "scope_requests",
    "watch_scopes",
]

log = logging.getLogger("engine.bench.chaos")


@attrs.frozen
class _LimitedScope:
    """A model or group of the ``scope_limits`` catalogue and its share of the tasks."""

    kind: str  # "model" or "group"
    name: str
    share: float
    limit: int | None = None  # running tasks (None: unlimited)
    rate: tuple[int, float] | None = None  # at most rate[0] requests per rate[1] seconds

    @property
    def scope(self) -> str:
        return f"{self.kind}:{self.name}"


#: Shares roughly follow each model's throughput (about limit / 0.85 s a task, or its rate),
#: so that every model stays backlogged for most of the run. The rate limits bind: sl-d could
#: run about 6 tasks a second on its 5 slots, sl-e about 7 on its 6.
_SCOPE_MODELS = (
    _LimitedScope("model", "sl-a", 0.11, limit=2),
    _LimitedScope("model", "sl-b", 0.17, limit=3),
    _LimitedScope("model", "sl-c", 0.22, limit=4),
    _LimitedScope("model", "sl-d", 0.22, limit=5, rate=(8, 2.0)),
    _LimitedScope("model", "sl-e", 0.28, limit=6, rate=(5, 1.0)),
)
#: g-1 and g-2 get about 8 and 4 of the ~20 model slots by their share, so their limits bind
#: too; g-3's rate limit (20/s) is a second bucket on the same admission, not expected to bind.
_SCOPE_GROUPS = (
    _LimitedScope("group", "g-1", 0.4, limit=7),
    _LimitedScope("group", "g-2", 0.2, limit=4),
    _LimitedScope("group", "g-3", 0.4, rate=(20, 1.0)),
)
_SCOPE_SEED = 7
_SAMPLE_INTERVAL = 0.02  # seconds between two samples of the held slots

#: Every scope of the catalogue as admission reads it.
_CATALOGUE_SCOPES = """
SELECT 'model:' || name AS scope, concurrency_limit, rate_limit, rate_interval FROM engine_model
UNION ALL
SELECT 'group:' || key, concurrency_limit, rate_limit, rate_interval FROM engine_group
"""
#: Leases and reserved slots (admitted, not started) per scope, in one snapshot.
_HELD_SLOTS = """
SELECT scope, count(*) FILTER (WHERE lease) AS leases, count(*) AS slots
FROM (SELECT scope, true AS lease FROM engine_scope_lease
      UNION ALL
      SELECT unnest(scopes), false FROM engine_task_admission WHERE status = 'admitted') AS held
GROUP BY scope
"""
#: The history of the run's tasks, per task in order.
_RUN_EVENTS = """
SELECT e.task_id, e.type, e.at, t.model, t.group_key, t.finished_at
FROM engine_task_event e JOIN engine_task t ON t.id = e.task_id
WHERE e.task_id = ANY($1::uuid[])
ORDER BY e.task_id, e.at, e.id
"""
#: Events that end an execution that passed admission (its slot is released with them).
_RUN_ENDS = frozenset(
    {
        "task.succeeded",
        "task.failed",
        "task.cancelled",
        "task.manual_review",
        "task.requeued",
        "task.queued",
    }
)
#: Events right after ``task.started`` of an execution that did not pass admission.
_NOT_ADMITTED = frozenset({"task.waiting", "task.rate_limited"})


@attrs.define
class _ScopeWatch:
    """The limits of the run and what the sampler saw."""

    limits: dict[str, int]  # scope: concurrency limit
    rates: dict[str, tuple[int, float]]  # scope: (requests, per seconds)
    samples: int = 0
    leases_exceeded: int = 0
    slots_exceeded: int = 0
    peak_leases: dict[str, int] = attrs.field(factory=dict)
    peak_slots: dict[str, int] = attrs.field(factory=dict)
    #: Sums over the samples and limited scopes: slots held, and of those reserved for an
    #: admitted task that has not started yet.
    held_slots: int = 0
    reserved_slots: int = 0

    def record(self, rows: Sequence[Record]) -> None:
        """One sample: count each scope holding more than its limit."""
        self.samples += 1
        for row in rows:
            scope, leases, slots = row["scope"], int(row["leases"]), int(row["slots"])
            self.peak_leases[scope] = max(self.peak_leases.get(scope, 0), leases)
            self.peak_slots[scope] = max(self.peak_slots.get(scope, 0), slots)
            limit = self.limits.get(scope)
            if limit is None:
                continue
            self.held_slots += slots
            self.reserved_slots += slots - leases
            if leases > limit:
                self.leases_exceeded += 1
                log.warning(
                    "scope over its limit",
                    extra={"event": "chaos_scope_exceeded", "scope": scope, "leases": leases},
                )
            if slots > limit:
                self.slots_exceeded += 1


def _spread(count: int, shares: Sequence[float], rng: random.Random) -> list[int]:
    """``count`` indexes into ``shares``, each as often as its share (largest remainder),
    shuffled."""
    total = sum(shares)
    exact = [count * share / total for share in shares]
    counts = [int(x) for x in exact]
    by_remainder = sorted(range(len(shares)), key=lambda i: counts[i] - exact[i])
    for i in by_remainder[: count - sum(counts)]:
        counts[i] += 1
    out = [i for i, n in enumerate(counts) for _ in range(n)]
    rng.shuffle(out)
    return out


def scope_requests(count: int) -> list[TaskRequest]:
    """``count`` tasks over the models and groups of :data:`_SCOPE_MODELS` and
    :data:`_SCOPE_GROUPS` by their shares, in a fixed random order."""
    rng = random.Random(_SCOPE_SEED)
    models = _spread(count, [m.share for m in _SCOPE_MODELS], rng)
    groups = _spread(count, [g.share for g in _SCOPE_GROUPS], rng)
    return [
        TaskRequest(
            model=_SCOPE_MODELS[m].name,
            payload={"n": n},
            identity=IDENTITY,
            group_key=_SCOPE_GROUPS[g].name,
            run_mode=RunMode.SIMULATION,
        )
        for n, (m, g) in enumerate(zip(models, groups, strict=True))
    ]


async def prepare_scopes(run: ChaosRun) -> None:
    """Write the limits with ``Engine.set_model`` / ``set_group`` and read them back as
    admission reads them (the figures are judged against what the catalogue holds)."""
    for m in _SCOPE_MODELS:
        await run.client.set_model(
            m.name,
            concurrency_limit=m.limit,
            rate_limit=None if m.rate is None else m.rate[0],
            rate_interval=1.0 if m.rate is None else m.rate[1],
        )
    for g in _SCOPE_GROUPS:
        await run.client.set_group(
            g.name,
            concurrency_limit=g.limit,
            rate_limit=None if g.rate is None else g.rate[0],
            rate_interval=1.0 if g.rate is None else g.rate[1],
        )
    stored = {r["scope"]: r for r in await run.monitor.fetch(_CATALOGUE_SCOPES)}
    watch = _ScopeWatch(limits={}, rates={})
    for wanted in (*_SCOPE_MODELS, *_SCOPE_GROUPS):
        row = stored.get(wanted.scope)
        rate = (
            None
            if row is None or not row["rate_limit"]
            else (row["rate_limit"], row["rate_interval"])
        )
        if row is None or row["concurrency_limit"] != wanted.limit or rate != wanted.rate:
            raise RuntimeError(f"the catalogue does not hold the limits of {wanted}: {row}")
        if wanted.limit is not None:
            watch.limits[wanted.scope] = wanted.limit
        if wanted.rate is not None:
            watch.rates[wanted.scope] = wanted.rate
    run.notes["scope_watch"] = watch


async def watch_scopes(
    run: ChaosRun, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
) -> None:
    """Sample the held slots per scope every :data:`_SAMPLE_INTERVAL` on a connection of its
    own, until cancelled."""
    watch: _ScopeWatch = run.notes["scope_watch"]
    monitor = Monitor(run.url)
    try:
        watch.record(await monitor.fetch(_HELD_SLOTS))
        task_status.started()
        next_at = trio.current_time()
        while True:
            next_at = max(next_at + _SAMPLE_INTERVAL, trio.current_time())
            await trio.sleep_until(next_at)
            watch.record(await monitor.fetch(_HELD_SLOTS))
    finally:
        with trio.CancelScope(shield=True):
            await monitor.close()


@attrs.frozen
class AdmittedExecution:
    """An execution that passed admission: from its ``task.started`` to the event that ended
    it."""

    model: str
    group_key: str | None
    start: datetime
    end: datetime


def _executions(rows: Sequence[Record], measured_until: datetime) -> list[AdmittedExecution]:
    """The admitted executions in ``rows`` (:data:`_RUN_EVENTS`).

    ``task.started`` is written once admission let the run through (a run turned away writes
    ``task.waiting`` or ``task.rate_limited`` instead; older runs wrote ``task.started`` first,
    so an execution whose next event is one of those never held a slot either). Any other
    ends with its final (or requeue) event, written just after the release commits,
    or with the next ``task.started`` of the task, or with the task's ``finished_at`` (else
    ``measured_until``). So each interval covers the time the slot was held, a little more
    at both ends: counting them can over-report an excess at a boundary, never hide one."""
    out: list[AdmittedExecution] = []
    current: Record | None = None  # the task.started row of the open execution

    def close(end: datetime) -> None:
        assert current is not None
        out.append(AdmittedExecution(current["model"], current["group_key"], current["at"], end))

    for row in rows:
        if current is not None and row["task_id"] != current["task_id"]:
            close(current["finished_at"] or measured_until)
            current = None
        kind = row["type"]
        if kind == "task.started":
            if current is not None:
                close(row["at"])
            current = row
        elif current is not None and kind in _NOT_ADMITTED:
            current = None
        elif current is not None and kind in _RUN_ENDS:
            close(row["at"])
            current = None
    if current is not None:
        close(current["finished_at"] or measured_until)
    return out


#: How long an excess seen in the task events may last and still be the events' own
#: over-cover at a hand-over (see :mod:`engine.bench.chaos`): the next task's ``task.started`` is
#: stamped as its admission commits, the previous task's final event after its release commits, and
#: the two run in different trio tasks. The hand-over excesses seen so far lasted under a
#: millisecond; a task that ran without its slot would overlap for most of its ~0.85 s run.
_BOUNDARY_SLACK = 0.05


@attrs.frozen
class Sweep:
    """What :func:`running_over_limit` found."""

    #: Times the running executions stayed above a scope's limit for longer than the slack.
    excesses: int
    #: Shorter excesses: hand-overs the event stamps over-cover.
    boundary_overlaps: int
    #: The most executions a scope ran at once for longer than the slack.
    peaks: dict[str, int]
    #: The longest excess, in seconds (of either kind).
    longest: float


def running_over_limit(executions: Sequence[AdmittedExecution], limits: Mapping[str, int]) -> Sweep:
    """Sweep the executions per limited scope for times the running count stayed above the
    limit (see :class:`Sweep`)."""
    points: dict[str, list[tuple[datetime, int]]] = {}
    for e in executions:
        scopes = [f"model:{e.model}"] + ([] if e.group_key is None else [f"group:{e.group_key}"])
        for scope in scopes:
            if scope in limits:
                points.setdefault(scope, []).extend([(e.start, 1), (e.end, -1)])
    excesses = overlaps = 0
    longest = 0.0
    peaks: dict[str, int] = {}
    for scope, changes in points.items():
        changes.sort()  # at the same instant an end (-1) comes before a start (+1)
        running = 0
        over_since: datetime | None = None
        for index, (at, delta) in enumerate(changes):
            running += delta
            if index + 1 < len(changes):
                held = (changes[index + 1][0] - at).total_seconds()
                if held > _BOUNDARY_SLACK:
                    peaks[scope] = max(peaks.get(scope, 0), running)
            if running > limits[scope] and over_since is None:
                over_since = at
            elif running <= limits[scope] and over_since is not None:
                lasted = (at - over_since).total_seconds()
                longest = max(longest, lasted)
                if lasted > _BOUNDARY_SLACK:
                    excesses += 1
                    log.warning(
                        "running tasks over the scope's limit",
                        extra={"event": "chaos_running_exceeded", "scope": scope, "at": at},
                    )
                else:
                    overlaps += 1
                over_since = None
    return Sweep(excesses, overlaps, peaks, longest)


def _rate_windows(times: Sequence[datetime], capacity: int, interval: float) -> tuple[int, int]:
    """Check submission ``times`` against a token bucket of ``capacity`` tokens refilled at
    ``capacity`` per ``interval`` seconds.

    Such a bucket lets at most ``C + floor(C * w / I)`` requests through in any window of
    length ``w`` (full at its start, refilled during it); for ``w = I`` that is ``2 C``. Every
    window ``[t, t + I]`` starting at a submission is checked (the fullest window starts at
    one). Returns the windows over the bound and the largest count in one window."""
    stamps = sorted(t.timestamp() for t in times)
    allowed = capacity + math.floor(capacity * interval / interval)
    over = largest = 0
    j = 0
    for i, start in enumerate(stamps):
        while j < len(stamps) and stamps[j] <= start + interval:
            j += 1
        largest = max(largest, j - i)
        if j - i > allowed:
            over += 1
    return over, largest


def _long_run_rate(times: Sequence[datetime]) -> float:
    """Submissions per second from the first to the last one."""
    if len(times) < 2:
        return 0.0
    span = (max(times) - min(times)).total_seconds()
    return (len(times) - 1) / span if span > 0 else 0.0


def _figure_key(scope: str) -> str:
    return scope.replace(":", "_").replace("-", "_")


async def evaluate_scopes(run: ChaosRun) -> dict[str, float]:
    """The ``scope_limits`` figures (see :mod:`engine.bench.chaos`)."""
    watch: _ScopeWatch = run.notes["scope_watch"]
    rows = await run.monitor.fetch(_RUN_EVENTS, run.submitted)
    executions = _executions(rows, utc_now())
    sweep = running_over_limit(executions, watch.limits)
    figures: dict[str, float] = {
        "samples": float(watch.samples),
        "limit_exceeded_samples": float(watch.leases_exceeded),
        "slots_exceeded_samples": float(watch.slots_exceeded),
        "limit_exceeded_events": float(sweep.excesses),
        "limit_boundary_overlaps": float(sweep.boundary_overlaps),
        "limit_exceeded_longest_seconds": round(sweep.longest, 3),
        "reserved_share": round(watch.reserved_slots / max(1, watch.held_slots), 3),
        "admissions_waited": float(
            len({r["task_id"] for r in rows if r["type"] == "task.waiting"})
        ),
        "rate_limited_retries": float(sum(r["type"] == "task.rate_limited" for r in rows)),
    }
    for scope, limit in watch.limits.items():
        key = _figure_key(scope)
        figures[f"concurrency_limit_{key}"] = float(limit)
        figures[f"peak_leases_{key}"] = float(watch.peak_leases.get(scope, 0))
        figures[f"peak_running_{key}"] = float(sweep.peaks.get(scope, 0))
    ledger = await connect(run.ledger_url, application_name=BENCH_APPLICATION)
    try:
        submissions = await ledger.fetch(f"SELECT task_id, at FROM {LEDGER_TABLE}")
    finally:
        await ledger.close()
    scopes_of = {
        r["id"]: (f"model:{r['model']}", f"group:{r['group_key']}")
        for r in await run.monitor.fetch(
            "SELECT id, model, group_key FROM engine_task WHERE id = ANY($1::uuid[])",
            run.submitted,
        )
    }
    over_total = 0
    for scope, (capacity, interval) in watch.rates.items():
        times = [r["at"] for r in submissions if scope in scopes_of.get(r["task_id"], ())]
        over, largest = _rate_windows(times, capacity, interval)
        over_total += over
        key = _figure_key(scope)
        figures[f"rate_allowed_per_window_{key}"] = float(2 * capacity)
        figures[f"rate_window_max_{key}"] = float(largest)
        figures[f"rate_limit_per_s_{key}"] = round(capacity / interval, 3)
        figures[f"rate_long_run_per_s_{key}"] = round(_long_run_rate(times), 3)
    figures["rate_exceeded_windows"] = float(over_total)
    return figures
