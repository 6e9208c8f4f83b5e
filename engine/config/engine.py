"""EngineConfig: the top-level settings, one section per service, and the rules between them.

Each section is declared by the service that owns it (see :mod:`engine.config`); this module
composes them and holds what belongs to no one service: the top-level fields and the rules that
relate two sections.
"""

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar, Final

import attrs

from engine.admission.config import AdmissionConfig
from engine.capacity.config import WorkerConfig
from engine.db.config import DatabaseConfig
from engine.load.config import LoadConfig
from engine.logs import LoggingConfig
from engine.providers.http.description import HttpModel
from engine.queue.config import QueueConfig
from engine.recovery.config import RecoveryConfig
from engine.schedules.model import Schedule
from engine.settings import Requirement, Rule, enforce_rules, path, setting, text
from engine.tasks.config import TasksConfig
from engine.web.config import DashboardConfig, MetricsConfig

__all__ = ["SECTION_CLASSES", "EngineConfig", "all_rules"]

_NAME_RE: Final = re.compile(r"\A[^\s]+\Z")


def _instance_name() -> Any:
    return Requirement(
        "must be 1 to 63 characters without whitespace",
        lambda v: isinstance(v, str) and len(v) <= 63 and _NAME_RE.match(v) is not None,
        optional=True,
    )


def _stale_rule(section: str, what: str) -> Rule:
    return Rule(
        (f"{section}.stale_after", "worker.refresh_interval"),
        f"{section}.stale_after must be more than twice worker.refresh_interval: a worker writes "
        f"its heartbeat only once per refresh, so with a shorter threshold a live worker looks "
        f"dead and {what} while it is still working",
        lambda v: v[f"{section}.stale_after"] > 2 * v["worker.refresh_interval"],
    )


@attrs.frozen
class EngineConfig:
    """The whole engine configuration; build it with :func:`~engine.config.load_config`."""

    # attrs.field spelled out: ruff (RUF009) takes setting() on a Path field for a mutable default.
    data_dir: Path | None = attrs.field(
        default=None,
        validator=path(optional=True),
        metadata={
            "doc": "Directory for the engine's local state, such as the embedded PostgreSQL "
            "cluster; unset means the launcher's default. `~` is expanded."
        },
    )
    app: str | None = setting(
        None,
        "Your providers, as `package.module:attribute`: a mapping of model name to provider, "
        "or a callable or async context manager that gives one (imported at start; the "
        "service runs the tasks of exactly these models, plus simulation tasks). "
        "`python -m engine run --app` sets it too. Unset: simulation tasks only.",
        text(3, 500, optional=True),
    )
    instance_name: str | None = setting(
        None,
        "Human-readable name of this instance, used in its instance and client ids in place of "
        "the host name; unset means the host name. Keep it short: client ids must stay within "
        "100 characters.",
        _instance_name(),
    )
    database: DatabaseConfig = attrs.field(factory=DatabaseConfig)
    queue: QueueConfig = attrs.field(factory=QueueConfig)
    worker: WorkerConfig = attrs.field(factory=WorkerConfig)
    load: LoadConfig = attrs.field(factory=LoadConfig)
    recovery: RecoveryConfig = attrs.field(factory=RecoveryConfig)
    admission: AdmissionConfig = attrs.field(factory=AdmissionConfig)
    tasks: TasksConfig = attrs.field(factory=TasksConfig)
    metrics: MetricsConfig = attrs.field(factory=MetricsConfig)
    dashboard: DashboardConfig = attrs.field(factory=DashboardConfig)
    logging: LoggingConfig = attrs.field(factory=LoggingConfig)
    http_models: tuple[HttpModel, ...] = attrs.field(
        default=(),
        metadata={
            "doc": "Models served by the HTTP provider kit, as `[[http_models]]` tables of the "
            "TOML file only (docs/http-providers.md).",
            "list_of_tables": True,
        },
    )
    schedules: tuple[Schedule, ...] = attrs.field(
        default=(),
        metadata={
            "doc": "Periodic schedules, as `[[schedules]]` tables of the TOML file only "
            "(docs/schedules.md).",
            "list_of_tables": True,
        },
    )

    rules: ClassVar[tuple[Rule, ...]] = (
        _stale_rule("recovery", "recovery takes its running jobs away"),
        _stale_rule("admission", "its admitted tasks are yielded"),
    )
    """The rules between two sections; each section checks its own (its ``rules``)."""

    def __attrs_post_init__(self) -> None:
        enforce_rules(self.rules, lambda dotted: _value_at(self, dotted))


def _sections() -> Iterator[tuple[str, type[Any]]]:
    for attribute in attrs.fields(EngineConfig):
        if isinstance(attribute.type, type) and attrs.has(attribute.type):
            # A section module may use postponed annotations: the loader needs real types.
            yield attribute.name, attrs.resolve_types(attribute.type)


SECTION_CLASSES: Final[dict[str, type[Any]]] = dict(_sections())
"""Each section's TOML table name and class, in declaration order."""


def all_rules() -> tuple[Rule, ...]:
    """Every rule between settings: each section's own, in section order, then
    :attr:`EngineConfig.rules`."""
    own = (rule for cls in SECTION_CLASSES.values() for rule in getattr(cls, "rules", ()))
    return (*own, *EngineConfig.rules)


def _value_at(config: EngineConfig, dotted: str) -> Any:
    value: Any = config
    for part in dotted.split("."):
        value = getattr(value, part)
    return value
