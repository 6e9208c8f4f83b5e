"""The global worker capacity, computed from model and group concurrency limits.

The registry (:func:`~engine.capacity.registry.load_capacity`) reads the enabled models and
groups with their ``concurrency_limit`` and this module turns them into one
:class:`CapacitySnapshot`. Pure: no database access.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import attrs

__all__ = [
    "UNBOUNDED_FALLBACK",
    "CapacitySnapshot",
    "GroupLimit",
    "ModelLimit",
    "compute_capacity",
]

UNBOUNDED_FALLBACK = 10_000
"""Desired capacity when nothing bounds it: no limited model or group and no hard limit.

When both bounds are infinite the hard limit is the capacity, but a hard limit of 0 means "no
cap" and leaves no finite number. Raising would stop the worker over a legal (if unwise)
configuration, and 0 would silently run nothing, so we use the largest ``max_workers`` a queue
generation accepts (10 000, as River's): the most one generation could ever run anyway.
"""


def _is_limited(concurrency_limit: int | None) -> bool:
    """True for a real limit; NULL or <= 0 means unlimited."""
    return concurrency_limit is not None and concurrency_limit > 0


@attrs.frozen(slots=True)
class ModelLimit:
    """One model row: ``concurrency_limit`` NULL or <= 0 means unlimited."""

    name: str
    enabled: bool
    concurrency_limit: int | None


@attrs.frozen(slots=True)
class GroupLimit:
    """One group (user/tenant/channel group) row; NULL or <= 0 limit means unlimited."""

    key: str
    enabled: bool
    concurrency_limit: int | None


@attrs.frozen(slots=True)
class CapacitySnapshot:
    """The result of :func:`compute_capacity`: the capacity and the figures it came from.

    Attributes:
        capacity: the global capacity after the hard limit; what registration splits.
        desired: the capacity the limits ask for, before the hard limit.
        hard_limit: the hard limit as given (<= 0 means none).
        enabled_models: number of enabled models.
        unlimited_models: enabled models without a positive limit.
        model_desired: sum of the limits of the limited enabled models.
        enabled_groups: number of enabled groups.
        unlimited_groups: enabled groups without a positive limit.
        group_desired: sum of the limits of the limited enabled groups.
        capped: True when the hard limit cut ``desired`` down.
    """

    capacity: int
    desired: int
    hard_limit: int
    enabled_models: int
    unlimited_models: int
    model_desired: int
    enabled_groups: int
    unlimited_groups: int
    group_desired: int
    capped: bool


def compute_capacity(
    models: Iterable[ModelLimit],
    groups: Iterable[GroupLimit],
    hard_limit: int,
) -> CapacitySnapshot:
    """Compute the global capacity from the model and group limits and the hard limit.

    - ``model_bound`` is infinite if any enabled model is unlimited, else the sum of model limits.
    - ``group_bound`` is infinite if any enabled group is unlimited *or there is no enabled
      group*, else the sum of group limits.
    - ``desired = min(model_bound, group_bound)``: a task needs both a model slot and a group
      slot, so the smaller bound is the safe reading. If both are infinite, ``desired``
      is the hard limit, or :data:`UNBOUNDED_FALLBACK` when there is none.
    - ``desired = 0`` when no model is enabled: nothing could run.
    - ``capped = hard_limit > 0 and desired > hard_limit``;
      ``capacity = min(desired, hard_limit)`` if ``hard_limit > 0`` else ``desired``.

    Disabled rows are ignored. Callers pass one row per model/group.
    """
    enabled_models = [m for m in models if m.enabled]
    enabled_groups = [g for g in groups if g.enabled]

    limited_model_limits = [
        m.concurrency_limit
        for m in enabled_models
        if m.concurrency_limit is not None and _is_limited(m.concurrency_limit)
    ]
    limited_group_limits = [
        g.concurrency_limit
        for g in enabled_groups
        if g.concurrency_limit is not None and _is_limited(g.concurrency_limit)
    ]
    unlimited_models = len(enabled_models) - len(limited_model_limits)
    unlimited_groups = len(enabled_groups) - len(limited_group_limits)
    model_desired = sum(limited_model_limits)
    group_desired = sum(limited_group_limits)

    model_bound = math.inf if unlimited_models > 0 else model_desired
    # No enabled group means groups do not constrain anything (rather than allowing 0 tasks).
    group_bound = math.inf if unlimited_groups > 0 or not enabled_groups else group_desired

    has_hard_limit = hard_limit > 0
    desired: int
    if not enabled_models:
        desired = 0
    elif math.isinf(model_bound) and math.isinf(group_bound):
        desired = hard_limit if has_hard_limit else UNBOUNDED_FALLBACK
    else:
        # At least one bound is finite, so the min is a real int.
        desired = int(min(model_bound, group_bound))

    capped = has_hard_limit and desired > hard_limit
    capacity = min(desired, hard_limit) if has_hard_limit else desired
    return CapacitySnapshot(
        capacity=capacity,
        desired=desired,
        hard_limit=hard_limit,
        enabled_models=len(enabled_models),
        unlimited_models=unlimited_models,
        model_desired=model_desired,
        enabled_groups=len(enabled_groups),
        unlimited_groups=unlimited_groups,
        group_desired=group_desired,
        capped=capped,
    )
