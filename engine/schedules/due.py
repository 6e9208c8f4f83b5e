"""Which periods of a schedule are due: a pure function of its timing, cursor and the time.

The *cursor* is the boundary of the newest period a leader submitted or passed over; it is
stored with the schedule, so a new leader goes on where the last one stopped.
"""

from __future__ import annotations

from datetime import datetime

import attrs

from engine.schedules.timing import Timing

__all__ = ["COUNT_CAP", "Due", "due_periods"]

#: Missed periods beyond the ones submitted are counted up to this many (then "at least").
COUNT_CAP = 10_000


@attrs.frozen
class Due:
    """What one pass does for one schedule."""

    fire: tuple[datetime, ...]
    """Boundaries to submit now, oldest first."""
    cursor: datetime
    """The cursor once they are submitted."""
    passed_over: int = 0
    """Missed periods not submitted (``catch_up``/``max_catch_up``; capped at COUNT_CAP)."""


def due_periods(
    timing: Timing, cursor: datetime | None, now: datetime, *, limit: int, run_on_start: bool
) -> Due:
    """The periods to submit at ``now``.

    ``cursor`` None means the schedule never ran in this database: its cursor starts at the
    period under way, which is submitted only with ``run_on_start``. Otherwise every boundary
    after the cursor and at or before ``now`` is due; the newest ``limit`` are submitted and
    the rest passed over.
    """
    latest = timing.latest(now)
    if cursor is None:
        return Due((latest,) if run_on_start else (), latest)
    if latest <= cursor:
        return Due((), cursor)
    found: list[datetime] = []
    boundary = latest
    while boundary > cursor and len(found) < limit:
        found.append(boundary)
        boundary = timing.before(boundary)
    passed = 0
    while boundary > cursor and passed < COUNT_CAP:
        passed += 1
        boundary = timing.before(boundary)
    return Due(tuple(reversed(found)), latest, passed)
