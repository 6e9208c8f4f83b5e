"""River's default retry backoff and the snooze threshold."""

from __future__ import annotations

import random

import pytest

from engine.queue.retry import (
    MAX_BACKOFF_SECONDS,
    SNOOZE_AVAILABLE_THRESHOLD,
    becomes_available_immediately,
    retry_backoff,
)


class _FixedRandom(random.Random):
    """A Random whose random() always returns one value, to pin the jitter."""

    def __init__(self, value: float) -> None:
        super().__init__(0)
        self.value = value

    def random(self) -> float:
        return self.value


@pytest.mark.parametrize(
    ("error_count", "base"),
    [(0, 1), (1, 16), (2, 81), (3, 256), (4, 625), (5, 1296), (24, 390_625)],
)
def test_backoff_is_fourth_power_within_jitter(error_count: int, base: int) -> None:
    rng = random.Random(error_count)
    for _ in range(200):
        seconds = retry_backoff(error_count, rng)
        assert base * 0.9 <= seconds < base * 1.1


@pytest.mark.parametrize(
    ("draw", "factor"),
    [(0.0, 0.9), (0.5, 1.0), (0.75, 1.05)],
)
def test_jitter_maps_draw_like_go(draw: float, factor: float) -> None:
    # Go: seconds += seconds * (rand.Float64()*0.2 - 0.1)
    assert retry_backoff(2, _FixedRandom(draw)) == pytest.approx(81 * factor)


def test_seeded_rng_is_reproducible() -> None:
    first = [retry_backoff(n, random.Random(42)) for n in range(10)]
    second = [retry_backoff(n, random.Random(42)) for n in range(10)]
    assert first == second


def test_default_rng_works() -> None:
    assert 0.9 <= retry_backoff(0) < 1.1


def test_cap_is_max_go_duration() -> None:
    assert pytest.approx(9_223_372_036.854775807) == MAX_BACKOFF_SECONDS
    # 310**4 exceeds the cap: no jitter, exactly the cap.
    assert retry_backoff(309, _FixedRandom(0.0)) == MAX_BACKOFF_SECONDS
    assert retry_backoff(10**6, _FixedRandom(0.0)) == MAX_BACKOFF_SECONDS
    # 309**4 is just under the cap; +10 % jitter would pass it and is capped again.
    assert retry_backoff(308, _FixedRandom(0.999)) == MAX_BACKOFF_SECONDS
    assert retry_backoff(308, _FixedRandom(0.0)) == pytest.approx(309**4 * 0.9)


def test_negative_error_count_is_rejected() -> None:
    with pytest.raises(ValueError, match="error_count"):
        retry_backoff(-1)


@pytest.mark.parametrize(
    ("delay", "available"),
    [(0.0, True), (0.25, True), (4.999, True), (5.0, True), (5.001, False), (60.0, False)],
)
def test_snooze_threshold_is_inclusive(delay: float, available: bool) -> None:
    assert SNOOZE_AVAILABLE_THRESHOLD == 5.0
    assert becomes_available_immediately(delay) is available
