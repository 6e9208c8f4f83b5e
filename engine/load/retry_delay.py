"""The snooze delay when the load controller refuses a start: 250–750 ms, jittered per task.

A refused job snoozes (no attempt consumed) for ``250 ms + (h(task_id) mod 501) ms``, so
250-750 ms. The hash is deterministic per task, which spreads the retries of a burst of refused
tasks over half a second instead of having them all come back at once. The base and the modulus
are the settings ``load.retry_base`` and ``load.retry_spread_ms``; these are their defaults.
"""

from __future__ import annotations

__all__ = ["DEFAULT_RETRY_BASE", "DEFAULT_RETRY_SPREAD_MS", "refused_start_delay"]

DEFAULT_RETRY_BASE = 0.25
"""The least snooze, in seconds (``load.retry_base``)."""
DEFAULT_RETRY_SPREAD_MS = 501
"""The modulus, in milliseconds (``load.retry_spread_ms``): ``h mod 501`` gives 0..500 ms on top
of the base."""
_UINT32 = 2**32


def refused_start_delay(
    task_id: str,
    *,
    base: float = DEFAULT_RETRY_BASE,
    spread_ms: int = DEFAULT_RETRY_SPREAD_MS,
) -> float:
    """Return the snooze delay in seconds for a job refused by the load controller.

    ``h = 0`` (uint32); for each UTF-8 *byte* ``b`` of ``task_id``: ``h = h * 33 + b`` modulo
    ``2**32`` (a uint32 that wraps around); the delay is ``base + (h % spread_ms) / 1000`` seconds,
    by default ``0.250 + (h % 501) / 1000``.

    Vectors (defaults): ``""`` -> 0.250, ``"a"`` -> 0.347, ``"task-1"`` -> 0.598,
    ``"3f2b8c1e-9d4a-4e6b-8a7c-1d2e3f4a5b6c"`` -> 0.475.

    Raises:
        ValueError: ``base`` is negative or ``spread_ms`` is less than 1.
    """
    if not base >= 0:
        raise ValueError(f"base must be >= 0 seconds, got {base!r}")
    if spread_ms < 1:
        raise ValueError(f"spread_ms must be >= 1, got {spread_ms!r}")
    h = 0
    for byte in task_id.encode("utf-8"):
        h = (h * 33 + byte) % _UINT32
    # Whole milliseconds; divide once so 0.347 prints as 0.347.
    return (base * 1000 + h % spread_ms) / 1000
