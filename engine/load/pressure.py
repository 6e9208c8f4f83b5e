"""What load pressure is: a reading of the process's resources, the thresholds that turn a
reading into a level (``normal``, ``elevated``, ``critical``), and which resource dominates.

:class:`~engine.load.controller.LoadController` keeps the level over time (escalating and
recovering after so many samples) and turns it into a safe capacity; this module is the pure
part it builds on, and the part the sampler and the metrics share.
"""

from __future__ import annotations

import enum
import math

import attrs

from engine.load.config import LoadConfig

__all__ = [
    "RANK",
    "REASON_CPU",
    "REASON_DATABASE_CONNECTIONS",
    "REASON_MEMORY",
    "LoadThresholds",
    "PressureState",
    "ResourceSample",
]

REASON_DATABASE_CONNECTIONS = "database_connections"
"""``pressure_reason`` when the database connection pool is the dominant resource."""

REASON_MEMORY = "memory"
"""``pressure_reason`` when memory is the dominant resource."""

REASON_CPU = "cpu"
"""``pressure_reason`` when CPU is the dominant resource."""


class PressureState(enum.StrEnum):
    """The process's resource pressure level."""

    NORMAL = "normal"
    ELEVATED = "elevated"
    CRITICAL = "critical"


#: Each level's order, normal lowest: comparing levels compares these.
RANK: dict[PressureState, int] = {
    PressureState.NORMAL: 0,
    PressureState.ELEVATED: 1,
    PressureState.CRITICAL: 2,
}


def _finite_fraction(
    _instance: object, attribute: attrs.Attribute[float | None], value: float | None
) -> None:
    """attrs validator: ``None`` (unknown) or a finite fraction >= 0 (may exceed 1)."""
    if value is not None and not (math.isfinite(value) and value >= 0):
        raise ValueError(f"{attribute.name} must be a finite number >= 0 or None, got {value!r}")


@attrs.frozen(slots=True)
class ResourceSample:
    """One reading of the process's resources.

    Attributes:
        cpu_fraction: CPU use as a fraction of the quota (may exceed 1); ``None`` if unknown.
        memory_fraction: memory use as a fraction of the cgroup limit; ``None`` if unknown.
        db_connections: database connections in use.
        db_max_connections: the pool's maximum; 0 means unknown, so the pool is not judged.
        sampled_at: when the reading was taken, on the controller's :class:`Clock` timebase.
    """

    cpu_fraction: float | None = attrs.field(validator=_finite_fraction)
    memory_fraction: float | None = attrs.field(validator=_finite_fraction)
    db_connections: int = attrs.field(validator=attrs.validators.ge(0))
    db_max_connections: int = attrs.field(validator=attrs.validators.ge(0))
    sampled_at: float

    @property
    def db_fraction(self) -> float | None:
        """Pool use as a fraction, or ``None`` when the maximum is unknown."""
        if self.db_max_connections <= 0:
            return None
        return self.db_connections / self.db_max_connections


@attrs.frozen(slots=True)
class LoadThresholds:
    """Where pressure starts, and how many samples it takes to change level.

    A resource is ``elevated`` at or above its elevated fraction and ``critical`` at or above
    its critical fraction. ``escalate_samples`` consecutive samples above the current level
    raise it; ``recover_samples`` consecutive samples below lower it (slower on purpose, so a
    brief dip does not reopen the gates). ``max_sample_age`` (seconds, ``None`` = no limit)
    drops readings that arrive too late to describe the present.

    The fractions and sample counts are the ``[load]`` settings: :meth:`from_section` is where
    they are filled in.
    """

    cpu_elevated: float
    cpu_critical: float
    memory_elevated: float
    memory_critical: float
    db_elevated: float
    db_critical: float
    escalate_samples: int = attrs.field(validator=attrs.validators.ge(1))
    recover_samples: int = attrs.field(validator=attrs.validators.ge(1))
    max_sample_age: float | None = 30.0

    @classmethod
    def from_section(cls, section: LoadConfig) -> LoadThresholds:
        """The thresholds of the ``[load]`` section."""
        return cls(
            cpu_elevated=section.cpu_elevated,
            cpu_critical=section.cpu_critical,
            memory_elevated=section.memory_elevated,
            memory_critical=section.memory_critical,
            db_elevated=section.db_connections_elevated,
            db_critical=section.db_connections_critical,
            escalate_samples=section.escalate_samples,
            recover_samples=section.recover_samples,
        )

    def __attrs_post_init__(self) -> None:
        """Reject thresholds that cannot be ordered normal < elevated <= critical."""
        for name in ("cpu", "memory", "db"):
            elevated = getattr(self, f"{name}_elevated")
            critical = getattr(self, f"{name}_critical")
            if not 0 < elevated <= critical:
                raise ValueError(
                    f"need 0 < {name}_elevated <= {name}_critical, got {elevated} and {critical}"
                )
        if self.max_sample_age is not None and not self.max_sample_age > 0:
            raise ValueError(f"max_sample_age must be > 0 or None, got {self.max_sample_age}")

    def classify(self, sample: ResourceSample) -> tuple[PressureState, str]:
        """Return the sample's level and the dominant resource (``""`` when normal).

        The worst resource wins. On a tie the database pool is named before memory before CPU:
        the pool is shared with every other query of the process and is the first to fail hard.
        """
        worst = PressureState.NORMAL
        reason = ""
        # In priority order; a later resource only wins by being strictly worse.
        readings = (
            (REASON_DATABASE_CONNECTIONS, sample.db_fraction, self.db_elevated, self.db_critical),
            (REASON_MEMORY, sample.memory_fraction, self.memory_elevated, self.memory_critical),
            (REASON_CPU, sample.cpu_fraction, self.cpu_elevated, self.cpu_critical),
        )
        for name, fraction, elevated, critical in readings:
            if fraction is None:
                continue
            if fraction >= critical:
                level = PressureState.CRITICAL
            elif fraction >= elevated:
                level = PressureState.ELEVATED
            else:
                continue
            if RANK[level] > RANK[worst]:
                worst, reason = level, name
        return worst, reason
