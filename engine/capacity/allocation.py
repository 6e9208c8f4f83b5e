"""Splitting the global capacity across the active worker instances.

Pure: the store loads the active registry rows, calls :func:`allocate` inside its serialized
registration transaction and persists the result.

The split counts every live instance alike, whatever models it serves (``models`` in the
registry): every instance runs simulation tasks and jobs that name no model, whose scopes are the
same model scopes, so what an instance serves does not bound what it may run. An instance that
serves a model few others serve therefore gets no larger share for it; the scope limits, enforced
at admission, still keep every model within its concurrency limit.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

import attrs

__all__ = ["InstanceRow", "allocate"]

_NORMAL_PRESSURE = "normal"


@attrs.frozen(slots=True)
class InstanceRow:
    """One active worker-instance registry row, as far as allocation needs it.

    Attributes:
        instance_id: the registry key; ties in ``started_at`` are broken on it.
        started_at: when the instance registered first; older instances come first.
        capacity_limit: the per-instance hard limit; 0 (or less) means none.
        safe_capacity: the load controller's safe capacity, if reported.
        pressure_state: ``"normal"``, ``"elevated"`` or ``"critical"``.
    """

    instance_id: str
    started_at: datetime
    capacity_limit: int
    safe_capacity: int | None
    pressure_state: str


def _cap(row: InstanceRow, use_pressure: bool) -> int | None:
    """The most ``row`` may receive, or ``None`` for no cap."""
    cap = row.capacity_limit if row.capacity_limit > 0 else None
    if use_pressure and row.pressure_state != _NORMAL_PRESSURE and row.safe_capacity is not None:
        # An instance under pressure should not be handed more than it says it can run.
        pressure_cap = max(0, row.safe_capacity)
        cap = pressure_cap if cap is None else min(cap, pressure_cap)
    return cap


def allocate(
    global_capacity: int,
    instances: Sequence[InstanceRow],
    use_pressure: bool = False,
) -> dict[str, int]:
    """Split ``global_capacity`` over ``instances`` by water-filling.

    Instances are ordered by ``(started_at, instance_id)`` so every instance computes the same
    split. Each gets ``G // n`` and the first ``G % n`` one more; each is then capped at its
    ``capacity_limit`` (if > 0) and, with ``use_pressure``, at its ``safe_capacity`` when its
    ``pressure_state`` is not ``"normal"``; the excess is dealt round-robin, in the same order,
    to the instances still under their cap, until nothing moves.

    Design choice: the round-robin *continues* where the first deal stopped
    instead of restarting at the first instance. Restarting would hand the excess to instances
    that already got the ``+1`` and break the even split (G=7 over caps [-, -, 1] would give
    4/2/1). Continuing is exactly "deal G units one at a time in order, skipping full
    instances", so the result is computed in closed form: find the highest level ``L`` with
    ``sum(min(cap_i, L)) <= G``, give everyone ``min(cap_i, L)`` and hand the remainder, one
    each, to the first instances whose cap is above ``L``.

    Guarantees: the sum is ``min(G, sum of caps)`` (never more than ``G``); no instance exceeds
    its cap; instances below their cap differ by at most 1.

    Returns:
        ``{instance_id: allocation}`` in allocation order; ``{}`` for no instances.

    Raises:
        ValueError: for a negative capacity or a repeated ``instance_id``.
    """
    if global_capacity < 0:
        raise ValueError(f"global_capacity must be >= 0, got {global_capacity}")
    ordered = sorted(instances, key=lambda row: (row.started_at, row.instance_id))
    ids = [row.instance_id for row in ordered]
    if len(set(ids)) != len(ids):
        raise ValueError("instance_id values must be unique")
    if not ordered:
        return {}

    caps = [_cap(row, use_pressure) for row in ordered]

    def filled(level: int) -> int:
        """Units handed out if every instance is raised to ``level`` (or its cap)."""
        return sum(level if cap is None else min(cap, level) for cap in caps)

    # Binary search the highest level L in [0, G] with filled(L) <= G. filled(0) = 0 <= G, and
    # no instance can usefully hold more than G, so G is an upper bound.
    low, high = 0, global_capacity
    while low < high:
        mid = (low + high + 1) // 2
        if filled(mid) <= global_capacity:
            low = mid
        else:
            high = mid - 1
    level = low

    shares = [level if cap is None else min(cap, level) for cap in caps]
    remainder = global_capacity - sum(shares)
    # Fewer than "instances with room above L" units remain (else L + 1 would fit), or every
    # instance is at its cap and the remainder cannot be placed at all.
    for index, cap in enumerate(caps):
        if remainder == 0:
            break
        if cap is None or cap > level:
            shares[index] += 1
            remainder -= 1
    return dict(zip(ids, shares, strict=True))
