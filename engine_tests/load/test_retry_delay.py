"""The worker-load snooze delay hash."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from engine.load.retry_delay import refused_start_delay


@pytest.mark.parametrize(
    ("task_id", "seconds"),
    [
        ("", 0.250),
        ("a", 0.347),
        ("task-1", 0.598),
        ("00000000-0000-0000-0000-000000000000", 0.256),
        ("3f2b8c1e-9d4a-4e6b-8a7c-1d2e3f4a5b6c", 0.475),
    ],
)
def test_reference_vectors(task_id: str, seconds: float) -> None:
    assert refused_start_delay(task_id) == seconds


def test_hashes_utf8_bytes_not_code_points() -> None:
    # "é" is two bytes (0xc3 0xa9): h = 195*33 + 169 = 6604; 6604 % 501 = 91. (By code point,
    # 233, it would be 0.483.)
    assert refused_start_delay("é") == 0.341


def test_uint32_wraparound() -> None:
    # Long enough that h*33 overflows 32 bits many times; recompute with explicit masking.
    task_id = "x" * 100
    h = 0
    for byte in task_id.encode():
        h = (h * 33 + byte) & 0xFFFFFFFF
    assert refused_start_delay(task_id) == (250 + h % 501) / 1000


@given(st.text(alphabet=st.characters(codec="utf-8")))
def test_range_and_determinism(task_id: str) -> None:
    delay = refused_start_delay(task_id)
    assert 0.250 <= delay <= 0.750
    assert delay == refused_start_delay(task_id)


@pytest.mark.parametrize(
    ("task_id", "base", "spread_ms", "seconds"),
    [
        ("a", 0.25, 501, 0.347),  # the defaults, spelled out
        ("a", 1.0, 501, 1.097),  # h("a") = 97
        ("a", 0.25, 50, 0.297),  # 97 % 50 = 47
        ("a", 0.0, 1, 0.0),  # spread 1: always exactly the base
        ("task-1", 30.0, 1, 30.0),
    ],
)
def test_base_and_spread_are_parameters(
    task_id: str, base: float, spread_ms: int, seconds: float
) -> None:
    assert refused_start_delay(task_id, base=base, spread_ms=spread_ms) == seconds


@pytest.mark.parametrize(("base", "spread_ms"), [(-0.1, 501), (0.25, 0)])
def test_bad_parameters_are_refused(base: float, spread_ms: int) -> None:
    with pytest.raises(ValueError):
        refused_start_delay("a", base=base, spread_ms=spread_ms)
