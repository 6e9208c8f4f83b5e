"""When a schedule's periods begin: a cron expression in a time zone, or a fixed interval.

A period is named by the instant it begins (its *boundary*). Boundaries depend on nothing but the
timing itself (an interval counts from the Unix epoch, not from when a process started), so
every instance, and every leader after a hand-over, agrees on them.
"""

from __future__ import annotations

import math
import re
from datetime import UTC, datetime, timedelta
from typing import Protocol
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import attrs
from croniter import CroniterBadCronError, CroniterBadDateError, CroniterError, croniter

__all__ = [
    "MIN_INTERVAL",
    "CronTiming",
    "IntervalTiming",
    "Timing",
    "format_duration",
    "parse_duration",
    "parse_timing",
]

#: The shortest interval (River's periodic jobs: never less than one second).
MIN_INTERVAL = 1.0

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
_DURATION = re.compile(r"(\d+(?:\.\d+)?)([smhd])")


class Timing(Protocol):
    """The boundaries of a schedule's periods (aware datetimes, compared in UTC)."""

    def latest(self, at: datetime) -> datetime:
        """The newest boundary at or before ``at``."""
        ...

    def before(self, boundary: datetime) -> datetime:
        """The boundary just before ``boundary`` (strictly earlier)."""
        ...

    def after(self, at: datetime) -> datetime:
        """The first boundary strictly after ``at``."""
        ...

    def describe(self) -> str:
        """How it reads in ``status``: ``cron 0 3 * * * (Europe/Berlin)``, ``every 15m``."""
        ...


@attrs.frozen
class IntervalTiming:
    """Boundaries every ``seconds``, counted from the Unix epoch (so ``every = "1h"`` begins
    on the hour, ``"1d"`` at midnight UTC)."""

    seconds: float

    def _at(self, n: int) -> datetime:
        return _EPOCH + timedelta(seconds=n * self.seconds)

    def _index(self, at: datetime) -> int:
        """The number of the newest boundary at or before ``at``."""
        n = math.floor((at - _EPOCH).total_seconds() / self.seconds)
        # Float rounding may put n one off near a boundary; step to the exact one.
        while self._at(n) > at:
            n -= 1
        while self._at(n + 1) <= at:
            n += 1
        return n

    def latest(self, at: datetime) -> datetime:
        """The newest boundary at or before ``at``."""
        return self._at(self._index(at))

    def before(self, boundary: datetime) -> datetime:
        """The boundary just before ``boundary``."""
        return self.latest(boundary - timedelta(microseconds=1))

    def after(self, at: datetime) -> datetime:
        """The first boundary strictly after ``at``."""
        return self._at(self._index(at) + 1)

    def describe(self) -> str:
        """``every 15m``."""
        return f"every {format_duration(self.seconds)}"


@attrs.frozen
class CronTiming:
    """Boundaries where a five-field cron expression (six with seconds) matches, in ``zone``
    (daylight-saving changes as croniter handles them: a skipped hour does not fire)."""

    expression: str
    zone: str = "UTC"

    def _iter(self, at: datetime) -> croniter:
        return croniter(self.expression, at.astimezone(ZoneInfo(self.zone)))

    def latest(self, at: datetime) -> datetime:
        """The newest boundary at or before ``at``."""
        # croniter's get_prev is strictly before its start: start just after ``at``.
        start = at + timedelta(microseconds=1)
        return self._iter(start).get_prev(datetime).astimezone(UTC)

    def before(self, boundary: datetime) -> datetime:
        """The boundary just before ``boundary``."""
        return self._iter(boundary).get_prev(datetime).astimezone(UTC)

    def after(self, at: datetime) -> datetime:
        """The first boundary strictly after ``at``."""
        return self._iter(at).get_next(datetime).astimezone(UTC)

    def describe(self) -> str:
        """``cron 0 3 * * * (Europe/Berlin)``."""
        return f"cron {self.expression}" + ("" if self.zone == "UTC" else f" ({self.zone})")


def format_duration(seconds: float) -> str:
    """``900`` → ``15m``; ``5400`` → ``1h30m``; fractions stay in seconds."""
    if seconds != int(seconds):
        return f"{seconds:g}s"
    left, parts = int(seconds), []
    for unit in "dhms":
        n, left = divmod(left, _UNIT_SECONDS[unit])
        if n:
            parts.append(f"{n}{unit}")
    return "".join(parts) or "0s"


def parse_duration(value: object) -> float:
    """Seconds from a number or a text such as ``"90s"``, ``"15m"``, ``"1h30m"``, ``"1d"``.

    Raises:
        ValueError: not a duration; the message says what is accepted.
    """
    if isinstance(value, bool):
        raise ValueError(f"{value!r} is not a duration")
    if isinstance(value, int | float):
        seconds = float(value)
    elif isinstance(value, str) and value.strip():
        text = value.strip().replace(" ", "").lower()
        try:
            seconds = float(text)
        except ValueError:
            matched = _DURATION.findall(text)
            if not matched or "".join(n + u for n, u in matched) != text:
                raise ValueError(
                    f"{value!r} is not a duration: write seconds (900) or amounts of "
                    's, m, h and d ("15m", "1h30m", "1d")'
                ) from None
            seconds = sum(float(n) * _UNIT_SECONDS[u] for n, u in matched)
    else:
        raise ValueError(f"{value!r} is not a duration")
    if not math.isfinite(seconds) or seconds < MIN_INTERVAL:
        raise ValueError(f"{value!r} is shorter than the shortest interval, {MIN_INTERVAL:g} s")
    return seconds


def parse_timing(cron: str | None, every: object, zone: str | None) -> Timing:
    """The timing of ``cron`` (with ``zone``, default UTC) or ``every``: exactly one of them.

    Raises:
        ValueError: neither or both given, a bad expression, duration or time zone; the
            message names which and why.
    """
    if (cron is None) == (every is None):
        raise ValueError("give exactly one of cron (a cron expression) and every (an interval)")
    if every is not None:
        if zone is not None:
            raise ValueError("timezone applies to cron schedules only (intervals count in UTC)")
        return IntervalTiming(parse_duration(every))
    assert cron is not None
    zone = zone or "UTC"
    try:
        ZoneInfo(zone)
    except (ZoneInfoNotFoundError, ValueError):
        raise ValueError(
            f"timezone {zone!r} is not a known IANA time zone (e.g. Europe/Berlin)"
        ) from None
    expression = " ".join(cron.split())
    fields = len(expression.split())
    if fields not in (5, 6):
        raise ValueError(
            f"cron {cron!r} has {fields} field(s): write five (minute hour day month weekday) "
            "or six (with seconds last)"
        )
    try:
        timing = CronTiming(expression, zone)
        timing.after(datetime.now(UTC))
    except (CroniterBadCronError, CroniterBadDateError, CroniterError, ValueError, KeyError) as exc:
        raise ValueError(f"cron {cron!r} is not a valid cron expression: {exc}") from None
    return timing
