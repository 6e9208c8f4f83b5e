"""The ``[load]`` section: the local load controller's mode, sampling and thresholds.

The one home of these settings' defaults and documentation
(:meth:`engine.load.pressure.LoadThresholds.from_section` takes its thresholds from here).
"""

from typing import ClassVar, Final, Literal

import attrs

from engine.settings import (
    Rule,
    choice,
    enforce_section_rules,
    fraction,
    integer,
    not_above_rule,
    number,
    setting,
)

__all__ = ["LoadConfig"]

_RESOURCES: Final = ("cpu", "memory", "db_connections")


@attrs.frozen
class LoadConfig:
    """The local load controller: pressure from CPU, memory and database connections."""

    mode: Literal["legacy", "observe", "adaptive"] = setting(
        "legacy",
        "`legacy` admits runs up to the claim limit; `observe` also computes pressure and safe "
        "capacity but admits as legacy; `adaptive` enforces them.",
        choice("legacy", "observe", "adaptive"),
    )
    sample_interval: float = setting(
        1.0,
        "Seconds between two samples of CPU, memory and database-connection use.",
        number(gt=0),
    )
    heavy_limit: int = setting(
        0,
        "Most runs in the heavy phases (preparing and finalizing) at once; 0 means equal to "
        "the claim limit.",
        integer(0),
    )
    cpu_elevated: float = setting(
        0.80,
        "CPU use, as a fraction of the available CPU, at which pressure becomes elevated.",
        fraction(),
    )
    cpu_critical: float = setting(
        0.95,
        "CPU use, as a fraction, at which pressure becomes critical.",
        fraction(),
    )
    memory_elevated: float = setting(
        0.75,
        "Memory use, as a fraction of the cgroup limit, at which pressure becomes elevated.",
        fraction(),
    )
    memory_critical: float = setting(
        0.90,
        "Memory use, as a fraction, at which pressure becomes critical.",
        fraction(),
    )
    db_connections_elevated: float = setting(
        0.70,
        "Database connections in use, as a fraction of the pools' maximum, at which pressure "
        "becomes elevated.",
        fraction(),
    )
    db_connections_critical: float = setting(
        0.90,
        "Database connections in use, as a fraction, at which pressure becomes critical.",
        fraction(),
    )
    escalate_samples: int = setting(
        2,
        "Consecutive samples above a threshold needed to raise the pressure state.",
        integer(1),
    )
    recover_samples: int = setting(
        3,
        "Consecutive samples below a threshold needed to lower the pressure state.",
        integer(1),
    )
    retry_base: float = setting(
        0.25,
        "Seconds a refused run's job is snoozed at least; the snooze is `retry_base` plus "
        "(hash of the task id mod `retry_spread_ms`) milliseconds.",
        number(ge=0),
    )
    retry_spread_ms: int = setting(
        501,
        "Modulus, in milliseconds, of the per-task part of that snooze; 501 with the default "
        "base gives 250 to 750 ms, which spreads a burst of refused runs over half a second.",
        integer(1),
    )

    rules: ClassVar[tuple[Rule, ...]] = tuple(
        not_above_rule(f"load.{res}_elevated", f"load.{res}_critical") for res in _RESOURCES
    )
    """The rules among these fields: no resource is critical before it is elevated."""

    def __attrs_post_init__(self) -> None:
        enforce_section_rules(self, self.rules)
