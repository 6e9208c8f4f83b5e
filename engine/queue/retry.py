"""River's default retry backoff and the snooze threshold.

Pure functions; the caller adds the result to its own ``now``.
"""

from __future__ import annotations

import random

__all__ = [
    "MAX_BACKOFF_SECONDS",
    "SNOOZE_AVAILABLE_THRESHOLD",
    "becomes_available_immediately",
    "retry_backoff",
]

MAX_BACKOFF_SECONDS: float = (2**63 - 1) / 1_000_000_000
"""The largest Go ``time.Duration`` in seconds (about 292 years); River caps backoff here.

Go computes ``maxDuration.Seconds()`` as ``9223372036 + 0.854775807``; the float is the same.
"""

SNOOZE_AVAILABLE_THRESHOLD: float = 5.0
"""Seconds. A snooze or retry due within this long goes straight back to ``available``.

River's executor compares the delay with the scheduler's interval (``JobSchedulerIntervalDefault``
= 5 s) using ``<=``: a job parked as ``scheduled``/``retryable`` would only be promoted by the
next scheduler run, up to 5 s late, so short delays skip the scheduler and are made
``available`` at once with ``scheduled_at = now + delay`` (the fetch query still honours
``scheduled_at``). Longer delays become ``scheduled`` (snooze) or ``retryable`` (error).
"""


def becomes_available_immediately(delay_seconds: float) -> bool:
    """True if a job snoozed/retried with this delay should be set ``available`` now.

    Uses ``<=`` exactly as River does, so a 5.0 s snooze is ``available``, not ``scheduled``.
    """
    return delay_seconds <= SNOOZE_AVAILABLE_THRESHOLD


def retry_backoff(error_count: int, rng: random.Random | None = None) -> float:
    """Seconds until the next attempt after a failure, River's ``DefaultRetryPolicy``.

    ``(error_count + 1) ** 4`` seconds with +/-10 % uniform jitter, capped at
    :data:`MAX_BACKOFF_SECONDS`. So about 1 s, 16 s, 81 s, 256 s, 625 s, ...

    Args:
        error_count: errors recorded on the job *before* this failure (``len(job.errors)``).
            River counts errors rather than attempts so that snoozes, which give the attempt
            back but record no error, do not inflate the backoff.
        rng: the random source for the jitter; the ``random`` module's global one if ``None``.
            Pass a seeded ``random.Random`` for reproducible tests.

    Raises:
        ValueError: if ``error_count`` is negative.
    """
    if error_count < 0:
        raise ValueError(f"error_count must be >= 0, got {error_count}")
    base = (error_count + 1) ** 4  # an exact int, so a huge count cannot overflow a float pow
    if base >= MAX_BACKOFF_SECONDS:
        # River stops jittering once the cap is reached (it could overflow time.Duration), so the
        # result is exactly the cap.
        return MAX_BACKOFF_SECONDS
    draw = (rng or random).random()  # [0, 1), like Go's rand.Float64
    seconds = base + base * (draw * 0.2 - 0.1)  # the jitter in [-10 %, +10 %)
    # Jitter may push a value near the cap over it; River caps a second time.
    return min(seconds, MAX_BACKOFF_SECONDS)
