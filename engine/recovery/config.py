"""The ``[recovery]`` section: the periodic recovery of interrupted tasks and orphaned jobs.

The one home of these settings' defaults and documentation.
"""

import attrs

from engine.settings import integer, number, setting

__all__ = ["RecoveryConfig"]


@attrs.frozen
class RecoveryConfig:
    """The periodic recovery of interrupted tasks and orphaned jobs."""

    interval: float = setting(
        15.0,
        "Seconds between recovery rounds; the first runs at start.",
        number(gt=0),
    )
    stale_after: float = setting(
        45.0,
        "Seconds without a heartbeat after which a worker counts as dead and its running jobs "
        "are recovered. Must exceed twice `worker.refresh_interval`.",
        number(gt=0),
    )
    batch_size: int = setting(
        100,
        "Most rows each step of a recovery round handles: interrupted tasks of dead workers, "
        "admissions given back, orphaned jobs.",
        integer(1),
    )
    recoverable_task_limit: int = setting(
        1000,
        "Most queued tasks without a live job given a new job per recovery round.",
        integer(1),
    )
