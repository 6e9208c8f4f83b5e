"""The ``[tasks]`` section: task submission limits and the per-task execution lease.

The one home of these settings' defaults and documentation.
"""

from typing import ClassVar

import attrs

from engine.settings import Rule, boolean, enforce_section_rules, integer, number, setting

__all__ = ["TasksConfig"]


@attrs.frozen
class TasksConfig:
    """Task submission limits and the per-task execution lease."""

    max_payload_bytes: int = setting(
        1_000_000,
        "Largest accepted task payload, in bytes of its JSON encoding.",
        integer(1),
    )
    max_field_length: int = setting(
        256,
        "Longest accepted identity field (tenant and user ids, API key fields) and group key, "
        "in characters; a longer one rejects the task (InvalidTask). Model names are capped at "
        "200 by the catalogue's column.",
        integer(1, 100_000),
    )
    max_payload_depth: int = setting(
        64,
        "Deepest accepted nesting of objects and arrays in a task payload; a deeper one rejects "
        "the task (InvalidTask) before it is encoded.",
        integer(1, 1_000),
    )
    lease_ttl: float = setting(
        60.0,
        "Seconds an execution lease on a task lasts without renewal; a run whose lease lapsed "
        "may be taken over.",
        number(gt=0),
    )
    lease_renew_interval: float = setting(
        20.0,
        "Seconds between renewals of a running task's lease; at most half of `lease_ttl`. The "
        "defaults renew three times per `lease_ttl`, so two renewals in a row may fail before "
        "the lease lapses.",
        number(gt=0),
    )
    demo_catalogue: bool = setting(
        True,
        "Install the demo models (served by the simulated provider) when the service starts "
        "on an empty catalogue, so a first `submit` has something to run.",
        boolean(),
    )

    rules: ClassVar[tuple[Rule, ...]] = (
        Rule(
            ("tasks.lease_renew_interval", "tasks.lease_ttl"),
            "tasks.lease_renew_interval must be at most half of tasks.lease_ttl, so that one "
            "late or failed renewal does not lose the lease",
            lambda v: 2 * v["tasks.lease_renew_interval"] <= v["tasks.lease_ttl"],
        ),
    )
    """The rules among these fields."""

    def __attrs_post_init__(self) -> None:
        enforce_section_rules(self, self.rules)
