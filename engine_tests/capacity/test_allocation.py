"""Water-filling split of the global capacity across instances."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from engine.capacity.allocation import InstanceRow, allocate

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def row(
    instance_id: str,
    started: int = 0,
    limit: int = 0,
    safe: int | None = None,
    pressure: str = "normal",
) -> InstanceRow:
    return InstanceRow(
        instance_id=instance_id,
        started_at=T0 + timedelta(seconds=started),
        capacity_limit=limit,
        safe_capacity=safe,
        pressure_state=pressure,
    )


def instances(n: int) -> list[InstanceRow]:
    return [row(f"i{k}", started=k) for k in range(n)]


@pytest.mark.parametrize(
    ("g", "n", "expected"),
    [
        (10, 1, [10]),
        (10, 2, [5, 5]),
        (10, 3, [4, 3, 3]),
        (10, 4, [3, 3, 2, 2]),
        (10, 5, [2, 2, 2, 2, 2]),
        (3, 5, [1, 1, 1, 0, 0]),
        (0, 3, [0, 0, 0]),
    ],
)
def test_even_split_extra_units_go_to_the_oldest(g: int, n: int, expected: list[int]) -> None:
    result = allocate(g, instances(n))
    assert list(result.values()) == expected
    assert list(result) == [f"i{k}" for k in range(n)]


def test_empty() -> None:
    assert allocate(10, []) == {}
    assert allocate(0, []) == {}


@pytest.mark.parametrize(
    ("g", "limits", "expected"),
    [
        # Capped instance's excess goes to the others; the split stays even (not 4/2/1).
        (7, [0, 0, 1], [3, 3, 1]),
        (10, [0, 1, 0, 0], [3, 1, 3, 3]),
        (10, [2, 2, 2], [2, 2, 2]),  # sum of caps < G: everyone at cap, 4 units unplaced
        (10, [2, 0, 2], [2, 6, 2]),
        (9, [3, 3, 0, 0], [3, 2, 2, 2]),
        (20, [1, 2, 3, 4, 0], [1, 2, 3, 4, 10]),
        (12, [5, 0, 0, 0, 0], [3, 3, 2, 2, 2]),
        (5, [-3, 0], [3, 2]),  # a negative limit means none
    ],
)
def test_caps_and_redistribution(g: int, limits: list[int], expected: list[int]) -> None:
    rows = [row(f"i{k}", started=k, limit=lim) for k, lim in enumerate(limits)]
    assert list(allocate(g, rows).values()) == expected


def test_order_is_started_at_then_instance_id_whatever_the_input_order() -> None:
    rows = [
        row("b", started=0),
        row("c", started=-5),
        row("a", started=0),
        row("d", started=9),
    ]
    expected = {"c": 2, "a": 2, "b": 1, "d": 1}
    for seed in range(10):
        shuffled = rows[:]
        random.Random(seed).shuffle(shuffled)
        result = allocate(6, shuffled)
        assert result == expected
        assert list(result) == ["c", "a", "b", "d"]


def test_pressure_caps_only_when_asked_and_not_normal() -> None:
    rows = [
        row("a", started=0, safe=1, pressure="elevated"),
        row("b", started=1, safe=1, pressure="normal"),
        row("c", started=2, safe=2, pressure="critical", limit=5),
        row("d", started=3, safe=None, pressure="critical"),
    ]
    assert allocate(12, rows) == {"a": 3, "b": 3, "c": 3, "d": 3}
    assert allocate(12, rows, use_pressure=True) == {"a": 1, "b": 5, "c": 2, "d": 4}


def test_pressure_cap_combines_with_capacity_limit() -> None:
    rows = [row("a", limit=2, safe=7, pressure="elevated"), row("b", started=1)]
    assert allocate(10, rows, use_pressure=True) == {"a": 2, "b": 8}


def test_rejects_negative_capacity_and_duplicate_ids() -> None:
    with pytest.raises(ValueError, match="global_capacity"):
        allocate(-1, instances(2))
    with pytest.raises(ValueError, match="unique"):
        allocate(4, [row("a"), row("a", started=1)])


_rows = st.lists(
    st.tuples(
        st.integers(min_value=-100, max_value=100),  # started offset
        st.integers(min_value=-2, max_value=30),  # capacity_limit (<= 0: none)
        st.one_of(st.none(), st.integers(min_value=-1, max_value=30)),  # safe_capacity
        st.sampled_from(["normal", "elevated", "critical"]),
    ),
    max_size=8,
)


@given(g=st.integers(min_value=0, max_value=500), spec=_rows, use_pressure=st.booleans())
def test_water_filling_properties(
    g: int, spec: list[tuple[int, int, int | None, str]], use_pressure: bool
) -> None:
    rows = [
        row(f"i{k}", started=s, limit=lim, safe=safe, pressure=p)
        for k, (s, lim, safe, p) in enumerate(spec)
    ]

    def cap(r: InstanceRow) -> float:
        c: float = r.capacity_limit if r.capacity_limit > 0 else float("inf")
        if use_pressure and r.pressure_state != "normal" and r.safe_capacity is not None:
            c = min(c, max(0, r.safe_capacity))
        return c

    result = allocate(g, rows, use_pressure=use_pressure)
    assert set(result) == {r.instance_id for r in rows}
    caps = {r.instance_id: cap(r) for r in rows}
    # The sum is min(G, sum of caps): never more than G, never leaves placeable units.
    assert sum(result.values()) == (min(g, sum(caps.values())) if rows else 0)
    assert all(0 <= result[i] <= caps[i] for i in result)
    below_cap = [result[i] for i in result if result[i] < caps[i]]
    if below_cap:
        assert max(below_cap) - min(below_cap) <= 1
    # Deterministic whatever the input order.
    assert allocate(g, list(reversed(rows)), use_pressure=use_pressure) == result
