"""The global capacity formula, one case per row."""

from __future__ import annotations

import pytest

from engine.capacity.snapshot import (
    UNBOUNDED_FALLBACK,
    CapacitySnapshot,
    GroupLimit,
    ModelLimit,
    compute_capacity,
)


def m(limit: int | None, enabled: bool = True, name: str = "m") -> ModelLimit:
    return ModelLimit(name=name, enabled=enabled, concurrency_limit=limit)


def g(limit: int | None, enabled: bool = True, key: str = "g") -> GroupLimit:
    return GroupLimit(key=key, enabled=enabled, concurrency_limit=limit)


def snap(
    capacity: int,
    desired: int,
    hard_limit: int,
    models: tuple[int, int, int],
    groups: tuple[int, int, int],
    capped: bool,
) -> CapacitySnapshot:
    """Expected snapshot; models/groups = (enabled, unlimited, desired)."""
    return CapacitySnapshot(
        capacity=capacity,
        desired=desired,
        hard_limit=hard_limit,
        enabled_models=models[0],
        unlimited_models=models[1],
        model_desired=models[2],
        enabled_groups=groups[0],
        unlimited_groups=groups[1],
        group_desired=groups[2],
        capped=capped,
    )


CASES = [
    pytest.param([], [], 50, snap(0, 0, 50, (0, 0, 0), (0, 0, 0), False), id="no-models"),
    pytest.param(
        [m(5, enabled=False)],
        [],
        50,
        snap(0, 0, 50, (0, 0, 0), (0, 0, 0), False),
        id="only-disabled-models",
    ),
    pytest.param(
        [], [g(3)], 50, snap(0, 0, 50, (0, 0, 0), (1, 0, 3), False), id="groups-but-no-models"
    ),
    pytest.param(
        [m(5), m(7), m(100, enabled=False)],
        [],
        50,
        snap(12, 12, 50, (2, 0, 12), (0, 0, 0), False),
        id="all-models-limited-no-groups",
    ),
    pytest.param(
        [m(5), m(None)],
        [],
        50,
        snap(50, 50, 50, (2, 1, 5), (0, 0, 0), False),
        id="one-unlimited-model-no-groups-uses-hard-limit",
    ),
    pytest.param(
        [m(5), m(0), m(-1)],
        [],
        50,
        snap(50, 50, 50, (3, 2, 5), (0, 0, 0), False),
        id="zero-and-negative-limits-are-unlimited",
    ),
    pytest.param(
        [m(None)],
        [g(4), g(6), g(1, enabled=False)],
        50,
        snap(10, 10, 50, (1, 1, 0), (2, 0, 10), False),
        id="groups-limited-bound-unlimited-models",
    ),
    pytest.param(
        [m(30)],
        [g(4), g(6)],
        50,
        snap(10, 10, 50, (1, 0, 30), (2, 0, 10), False),
        id="min-of-bounds-groups-smaller",
    ),
    pytest.param(
        [m(8)],
        [g(4), g(6)],
        50,
        snap(8, 8, 50, (1, 0, 8), (2, 0, 10), False),
        id="min-of-bounds-models-smaller",
    ),
    pytest.param(
        [m(8)],
        [g(4), g(None)],
        50,
        snap(8, 8, 50, (1, 0, 8), (2, 1, 4), False),
        id="one-unlimited-group-removes-group-bound",
    ),
    pytest.param(
        [m(None)],
        [g(None)],
        40,
        snap(40, 40, 40, (1, 1, 0), (1, 1, 0), False),
        id="both-unlimited-with-hard-limit",
    ),
    pytest.param(
        [m(None)],
        [],
        0,
        snap(UNBOUNDED_FALLBACK, UNBOUNDED_FALLBACK, 0, (1, 1, 0), (0, 0, 0), False),
        id="both-unlimited-without-hard-limit",
    ),
    pytest.param(
        [m(None)],
        [g(0)],
        -1,
        snap(UNBOUNDED_FALLBACK, UNBOUNDED_FALLBACK, -1, (1, 1, 0), (1, 1, 0), False),
        id="both-unlimited-negative-hard-limit",
    ),
    pytest.param(
        [m(60), m(40)],
        [],
        50,
        snap(50, 100, 50, (2, 0, 100), (0, 0, 0), True),
        id="capped",
    ),
    pytest.param(
        [m(50)],
        [],
        50,
        snap(50, 50, 50, (1, 0, 50), (0, 0, 0), False),
        id="at-hard-limit-not-capped",
    ),
    pytest.param(
        [m(60_000)],
        [],
        0,
        snap(60_000, 60_000, 0, (1, 0, 60_000), (0, 0, 0), False),
        id="no-hard-limit-finite-desired-kept",
    ),
]


@pytest.mark.parametrize(("models", "groups", "hard_limit", "expected"), CASES)
def test_compute_capacity(
    models: list[ModelLimit], groups: list[GroupLimit], hard_limit: int, expected: CapacitySnapshot
) -> None:
    assert compute_capacity(models, groups, hard_limit) == expected


def test_accepts_iterators() -> None:
    result = compute_capacity(iter([m(3), m(4)]), iter([g(5)]), 0)
    assert result.capacity == 5
