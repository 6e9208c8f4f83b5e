"""Timings: where periods begin, for intervals and cron, and the errors of bad ones."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from engine.schedules.timing import CronTiming, IntervalTiming, parse_duration, parse_timing

NOW = datetime(2026, 12, 1, 12, 7, 3, 250_000, tzinfo=UTC)


def test_an_interval_counts_from_the_epoch_not_from_a_start() -> None:
    timing = parse_timing(None, "15m", None)
    assert timing.latest(NOW) == datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
    assert timing.after(NOW) == datetime(2026, 12, 1, 12, 15, tzinfo=UTC)
    assert timing.before(timing.latest(NOW)) == datetime(2026, 12, 1, 11, 45, tzinfo=UTC)
    assert timing.describe() == "every 15m"


def test_a_boundary_is_its_own_latest_and_not_its_own_after() -> None:
    boundary = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
    for timing in (parse_timing(None, 900, None), parse_timing("*/15 * * * *", None, None)):
        assert timing.latest(boundary) == boundary
        assert timing.after(boundary) == boundary + timedelta(minutes=15)
        assert timing.before(boundary) == boundary - timedelta(minutes=15)


def test_cron_runs_in_its_time_zone() -> None:
    timing = parse_timing("0 3 * * *", None, "Europe/Berlin")
    # 03:00 in Berlin is 02:00 UTC in winter.
    assert timing.after(NOW) == datetime(2026, 12, 2, 2, 0, tzinfo=UTC)
    assert timing.describe() == "cron 0 3 * * * (Europe/Berlin)"


def test_cron_across_a_daylight_saving_change() -> None:
    timing = CronTiming("30 1 * * *", "Europe/Berlin")
    # Berlin leaves summer time on 2026-10-25: 01:30 is 23:30 UTC before, 00:30 UTC after.
    before = timing.after(datetime(2026, 10, 24, 12, 0, tzinfo=UTC))
    after = timing.after(before)
    assert before == datetime(2026, 10, 24, 23, 30, tzinfo=UTC)
    assert after == datetime(2026, 10, 26, 0, 30, tzinfo=UTC)


def test_a_wall_clock_time_that_happens_twice_or_never_is_one_instant_each() -> None:
    timing = CronTiming("30 2 * * *", "Europe/Berlin")
    autumn = [timing.after(datetime(2026, 10, 24, 12, 0, tzinfo=UTC))]
    autumn.append(timing.after(autumn[0]))
    # 02:30 happens in summer time (00:30 UTC) and again in winter time (01:30 UTC).
    assert autumn == [
        datetime(2026, 10, 25, 0, 30, tzinfo=UTC),
        datetime(2026, 10, 25, 1, 30, tzinfo=UTC),
    ]
    # 02:30 does not exist on 2026-03-29: it fires at the end of the gap, 03:00 (01:00 UTC).
    assert timing.after(datetime(2026, 3, 28, 12, 0, tzinfo=UTC)) == datetime(
        2026, 3, 29, 1, 0, tzinfo=UTC
    )


def test_six_field_cron_has_seconds_last() -> None:
    timing = parse_timing("* * * * * */10", None, None)
    assert timing.after(NOW) == datetime(2026, 12, 1, 12, 7, 10, tzinfo=UTC)


@given(
    seconds=st.integers(min_value=1, max_value=86_400 * 3),
    offset=st.floats(min_value=0, max_value=10**9, allow_nan=False),
)
def test_interval_boundaries_bracket_any_instant(seconds: int, offset: float) -> None:
    timing = IntervalTiming(float(seconds))
    at = datetime(1970, 1, 1, tzinfo=UTC) + timedelta(seconds=offset)
    latest = timing.latest(at)
    assert latest <= at < timing.after(at)
    assert timing.after(at) - latest == timedelta(seconds=seconds)
    assert timing.before(latest) == latest - timedelta(seconds=seconds)


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        (900, 900.0),
        ("900", 900.0),
        ("90s", 90.0),
        ("15m", 900.0),
        ("1h30m", 5400.0),
        ("1d", 86400.0),
    ],
)
def test_durations(text: object, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize(
    ("cron", "every", "zone", "message"),
    [
        ("61 * * * *", None, None, r"cron '61 \* \* \* \*' is not a valid cron expression"),
        ("* * *", None, None, r"has 3 field\(s\): write five"),
        (None, "15 minutes", None, r"'15 minutes' is not a duration: write seconds"),
        (None, "0.5s", None, r"shorter than the shortest interval, 1 s"),
        (None, True, None, r"True is not a duration"),
        ("0 3 * * *", None, "Mars/Base", r"timezone 'Mars/Base' is not a known IANA time zone"),
        (None, "1h", "Europe/Berlin", r"timezone applies to cron schedules only"),
        (None, None, None, r"give exactly one of cron"),
        ("* * * * *", "1m", None, r"give exactly one of cron"),
    ],
)
def test_bad_timings_say_what_is_wrong(
    cron: str | None, every: object, zone: str | None, message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        parse_timing(cron, every, zone)
