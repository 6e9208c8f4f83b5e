"""Which periods are due: every missed period once, the newest first kept, nothing twice."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from hypothesis import given
from hypothesis import strategies as st

from engine.schedules.due import due_periods
from engine.schedules.timing import IntervalTiming

MINUTE = IntervalTiming(60.0)
T0 = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)


def _m(n: float) -> datetime:
    return T0 + timedelta(minutes=n)


def test_a_new_schedule_waits_for_its_next_boundary() -> None:
    due = due_periods(MINUTE, None, _m(2.5), limit=100, run_on_start=False)
    assert due.fire == ()
    assert due.cursor == _m(2)


def test_run_on_start_submits_the_period_under_way() -> None:
    due = due_periods(MINUTE, None, _m(2.5), limit=100, run_on_start=True)
    assert due.fire == (_m(2),)
    assert due.cursor == _m(2)


def test_nothing_is_due_before_the_next_boundary() -> None:
    due = due_periods(MINUTE, _m(2), _m(2.99), limit=100, run_on_start=True)
    assert due.fire == ()
    assert due.cursor == _m(2)


def test_each_missed_period_is_due_once_oldest_first() -> None:
    due = due_periods(MINUTE, _m(2), _m(5.1), limit=100, run_on_start=False)
    assert due.fire == (_m(3), _m(4), _m(5))
    assert due.cursor == _m(5) and due.passed_over == 0


def test_beyond_the_limit_the_newest_are_kept_and_the_rest_counted() -> None:
    due = due_periods(MINUTE, _m(0), _m(10), limit=3, run_on_start=False)
    assert due.fire == (_m(8), _m(9), _m(10))
    assert due.passed_over == 7


@given(
    cursor=st.integers(min_value=0, max_value=500),
    ahead=st.floats(min_value=0, max_value=300, allow_nan=False),
    limit=st.integers(min_value=1, max_value=50),
)
def test_fired_and_passed_over_are_exactly_the_missed_periods(
    cursor: int, ahead: float, limit: int
) -> None:
    now = _m(cursor + ahead)
    due = due_periods(MINUTE, _m(cursor), now, limit=limit, run_on_start=False)
    missed = [_m(n) for n in range(cursor + 1, cursor + int(ahead) + 2) if _m(n) <= now]
    assert list(due.fire) == missed[-limit:] if missed else due.fire == ()
    assert due.passed_over == max(0, len(missed) - limit)
    assert due.cursor == (missed[-1] if missed else _m(cursor))
    # Asking again at the same time finds nothing more.
    again = due_periods(MINUTE, due.cursor, now, limit=limit, run_on_start=True)
    assert again.fire == () and again.passed_over == 0
