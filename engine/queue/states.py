"""Job states of the queue and the state sets that unique inserts use.

The names and the sets mirror River's ``rivertype.JobState`` and
``internal/dbunique/db_unique.go``, so a row written by the
Python engine means the same thing as one written by a River client (Go).
"""

from __future__ import annotations

import enum

__all__ = [
    "FINALIZED_STATES",
    "GATEWAY_UNIQUE_STATES",
    "LIVE_UNIQUE_STATES_DEFAULT",
    "JobState",
]


class JobState(enum.StrEnum):
    """The state of one job row (River's ``river_job_state`` enum)."""

    AVAILABLE = "available"
    CANCELLED = "cancelled"
    COMPLETED = "completed"
    DISCARDED = "discarded"
    PENDING = "pending"
    RETRYABLE = "retryable"
    RUNNING = "running"
    SCHEDULED = "scheduled"


LIVE_UNIQUE_STATES_DEFAULT: frozenset[JobState] = frozenset(
    {
        JobState.AVAILABLE,
        JobState.COMPLETED,
        JobState.PENDING,
        JobState.RETRYABLE,
        JobState.RUNNING,
        JobState.SCHEDULED,
    }
)
"""River's default ``ByState`` (``defaultUniqueStates``), used when an insert sets none."""

GATEWAY_UNIQUE_STATES: frozenset[JobState] = frozenset(
    {
        JobState.AVAILABLE,
        JobState.PENDING,
        JobState.RETRYABLE,
        JobState.RUNNING,
        JobState.SCHEDULED,
    }
)
"""The gateway's ``ByState``.

It leaves out ``completed`` on purpose: a task whose previous job completed (and is not cleaned
yet) must be able to get a new job, which re-enqueueing relies on.
"""

FINALIZED_STATES: frozenset[JobState] = frozenset(
    {JobState.CANCELLED, JobState.COMPLETED, JobState.DISCARDED}
)
"""States a job never leaves by itself; only the cleaner deletes such rows."""
