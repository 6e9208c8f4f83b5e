"""The analysis of the resize scenario (:mod:`engine.bench.resize`), pure functions on what it
recorded: executions rebuilt from the task events, running counts against the sampled
allocations (``over_allocation_samples``), and how long a split took to converge, in the
registry or in the claim limits the processes applied. The figures are defined in
:mod:`engine.bench.resize`.
"""

from __future__ import annotations

import bisect
import math
import uuid
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from typing import Final

import attrs

__all__ = [
    "SAMPLE_PERIOD",
    "Execution",
    "OverAllocation",
    "RegistrySample",
    "applied_at",
    "applied_converge_time",
    "converge_time",
    "even_split",
    "executions_from_events",
    "over_allocation",
]

#: How often the registry is sampled, seconds (and the tolerance of :func:`over_allocation`).
SAMPLE_PERIOD: Final = 0.05


@attrs.frozen
class RegistrySample:
    """The registry at one instant: ``allocated`` per instance (``at``: Unix seconds)."""

    at: float
    allocated: Mapping[str, int]


@attrs.frozen
class Execution:
    """One execution of a task on an instance, from its ``task.started`` to its end."""

    task_id: uuid.UUID
    instance_id: str
    start: float
    end: float


def even_split(total: int, n: int) -> list[int]:
    """The even split of ``total`` over ``n`` instances, largest first (no caps)."""
    if n <= 0:
        return []
    base, extra = divmod(total, n)
    return [base + 1] * extra + [base] * (n - extra)


def executions_from_events(
    events: Iterable[tuple[uuid.UUID, str, str | None, str | None, float]],
    *,
    killed: Mapping[str, float],
    horizon: float,
) -> list[Execution]:
    """Rebuild executions from ``(task_id, type, status, instance_id, at)`` events sorted by
    time.

    An execution starts at ``task.started`` and ends at the task's next event whose status is
    not ``running`` (succeeded, failed, cancelled, manual_review, or back to queued: requeued,
    waiting for admission, rate limited...) or its next ``task.started``; one of a killed
    instance ends at the kill (``killed``) at the latest; anything still open ends at
    ``horizon``.
    """
    open_runs: dict[uuid.UUID, tuple[str, float]] = {}
    done: list[Execution] = []

    def close(task_id: uuid.UUID, at: float) -> None:
        previous = open_runs.pop(task_id, None)
        if previous is not None:
            instance_id, start = previous
            # A killed process ran nothing after its kill, whoever took the task over later.
            end = min(at, killed.get(instance_id, math.inf))
            done.append(Execution(task_id, instance_id, start, max(start, end)))

    for task_id, type_, status, instance_id, at in events:
        if type_ == "task.started":
            close(task_id, at)
            open_runs[task_id] = (instance_id or "", at)
        elif status is not None and status != "running":
            close(task_id, at)
    for task_id in list(open_runs):
        close(task_id, horizon)
    return done


@attrs.frozen
class OverAllocation:
    """What :func:`over_allocation` found."""

    samples: int
    """(sample, instance) pairs over the allocation beyond carried-over executions."""
    raw_samples: int
    """(sample, instance) pairs with running > allocated, carried-over executions included."""
    carryover_max_seconds: float
    """Longest time from a decrease until running <= allocated again."""
    worst: tuple[float, str, int, int] | None
    """The first offending sample: (at, instance, running, allocated)."""


def over_allocation(
    samples: Sequence[RegistrySample],
    executions: Sequence[Execution],
    *,
    tolerance: float = SAMPLE_PERIOD,
    instances: Iterable[str] | None = None,
    alive_until: Mapping[str, float] | None = None,
) -> OverAllocation:
    """Compare event-derived running counts with the sampled allocations; see
    :mod:`engine.bench.resize` (``over_allocation_samples``) for the rule.

    ``alive_until`` stops checking an instance after that time (a killed process runs nothing;
    its stale row still holds an allocation until the others drop it).
    """
    by_instance: dict[str, list[Execution]] = defaultdict(list)
    for execution in executions:
        by_instance[execution.instance_id].append(execution)
    ids = set(instances) if instances is not None else set(by_instance)
    until = dict(alive_until or {})
    count = raw = 0
    carry_max = 0.0
    worst: tuple[float, str, int, int] | None = None
    for instance_id in sorted(ids):
        runs = by_instance.get(instance_id, [])
        previous: int | None = None
        decrease_at: float | None = None
        settled = True
        for sample in samples:
            if sample.at > until.get(instance_id, math.inf):
                break
            allocated = sample.allocated.get(instance_id)
            if allocated is None:
                continue
            if previous is not None and allocated < previous:
                decrease_at, settled = sample.at, False
            previous = allocated
            running = [r for r in runs if r.start <= sample.at < r.end]
            if len(running) > allocated:
                raw += 1
            elif not settled and decrease_at is not None:
                settled = True
                carry_max = max(carry_max, sample.at - decrease_at)
            carried = 0
            if decrease_at is not None:
                carried = sum(1 for r in running if r.start < decrease_at + tolerance)
            if len(running) > max(allocated, carried):
                count += 1
                if worst is None:
                    worst = (sample.at, instance_id, len(running), allocated)
    return OverAllocation(count, raw, round(carry_max, 3), worst)


def converge_time(
    samples: Sequence[RegistrySample],
    *,
    since: float,
    until: float,
    limit: int,
    live: Sequence[str],
    dead: Sequence[str] = (),
) -> float | None:
    """Seconds from ``since`` to the first sample in ``[since, until)`` where the ``live``
    instances hold the even split of ``limit`` (and every ``dead`` one 0 or no row); None if
    no sample in the window does."""
    want = even_split(limit, len(live))
    for sample in samples:
        if sample.at < since:
            continue
        if sample.at >= until:
            break
        got = [sample.allocated.get(i) for i in live]
        if any(g is None for g in got):
            continue
        if sorted((g or 0 for g in got), reverse=True) != want:
            continue
        if any(sample.allocated.get(d, 0) for d in dead):
            continue
        return sample.at - since
    return None


def applied_converge_time(
    changes: Mapping[str, Sequence[tuple[float, float]]],
    *,
    since: float,
    until: float,
    limit: int,
    live: Sequence[str],
) -> float | None:
    """Like :func:`converge_time` over the claim limits the processes applied: ``changes`` maps
    an instance to its ``(at, claim_limit)`` records sorted by time."""
    want = [float(v) for v in even_split(limit, len(live))]
    instants = sorted(
        {since} | {at for i in live for at, _ in changes.get(i, ()) if since <= at < until}
    )
    for instant in instants:
        got: list[float] = []
        for instance_id in live:
            records = changes.get(instance_id, ())
            index = bisect.bisect_right([at for at, _ in records], instant) - 1
            if index < 0:
                break
            got.append(records[index][1])
        else:
            if sorted(got, reverse=True) == want:
                return instant - since
    return None


def applied_at(changes: Mapping[str, Sequence[tuple[float, float]]], at: float) -> dict[str, int]:
    """Each instance's applied claim limit at ``at`` (instances with no record yet left out)."""
    out: dict[str, int] = {}
    for instance_id, records in changes.items():
        index = bisect.bisect_right([t for t, _ in records], at) - 1
        if index >= 0:
            value = records[index][1]
            out[instance_id] = int(value) if math.isfinite(value) else 2**31
    return out
