"""What a schedule submits, and how it catches up: the data of one schedule.

A schedule submits, per period, either a task (:class:`ScheduledTask`, or a function of the
period that builds a :class:`~engine.domain.tasks.TaskRequest`) or a plain River job
(:class:`ScheduledJob`, for a Go River worker or your own queue client). Schedules come from
configuration (``[[schedules]]`` tables, :func:`schedule_from_table`) or from the embedding app
(``engine.open(config, schedules=[...])``); both are checked by :func:`schedule_problems` before
anything runs.
"""

from __future__ import annotations

import enum
import json
import re
import uuid
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from typing import Any, cast

import attrs

from engine.domain.tasks import Identity, RunMode, TaskRequest
from engine.schedules.timing import Timing, parse_timing

__all__ = [
    "CatchUp",
    "Schedule",
    "ScheduledJob",
    "ScheduledTask",
    "TaskBuilder",
    "check_schedules",
    "duplicate_names",
    "period_task_id",
    "schedule_from_table",
    "schedule_problems",
]

#: A function of the period's boundary that builds the task to submit for it.
TaskBuilder = Callable[[datetime], TaskRequest]

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:-]{0,99}")
# Fixed, so a period's task id is the same in every process and release.
_PERIOD_NAMESPACE = uuid.UUID("6f1c52a4-3a63-4a43-9f0e-0d6f3c1e5b7a")


class CatchUp(enum.StrEnum):
    """What a leader does with periods that passed while nobody led (a hand-over, an outage).

    ``all`` submits each missed period (the newest ``max_catch_up`` of them); ``latest``
    submits only the newest missed period and passes over the rest.
    """

    ALL = "all"
    LATEST = "latest"


@attrs.frozen
class ScheduledTask:
    """The task a schedule submits each period (its id is derived from the period)."""

    model: str
    tenant_id: str
    payload: Any = attrs.field(factory=dict)
    user_id: str | None = None
    """Default: ``schedule:<name>``."""
    group_key: str | None = None
    run_mode: RunMode = RunMode.LIVE

    def request(self, schedule: str, period: datetime) -> TaskRequest:
        """The request for ``period`` (the task id is :func:`period_task_id`)."""
        return TaskRequest(
            model=self.model,
            payload=self.payload,
            identity=Identity(
                tenant_id=self.tenant_id, user_id=self.user_id or f"schedule:{schedule}"
            ),
            group_key=self.group_key,
            run_mode=self.run_mode,
            id=period_task_id(schedule, period),
        )


@attrs.frozen
class ScheduledJob:
    """The plain River job a schedule inserts each period, with River's periodic metadata
    (``periodic: true``, ``river:periodic_job_id``: the schedule's name)."""

    kind: str
    args: Mapping[str, Any] = attrs.field(factory=dict)
    queue: str = "default"
    priority: int = 1
    max_attempts: int | None = None
    tags: tuple[str, ...] = ()


@attrs.frozen
class Schedule:
    """One periodic schedule: its name, when its periods begin, what it submits per period.

    Give exactly one of ``cron`` (five fields, or six with seconds last; in ``timezone``,
    default UTC) and ``every`` (seconds, or ``"15m"``, ``"1h30m"``; counted from the Unix
    epoch), and exactly one of ``task`` and ``job``.
    """

    name: str
    cron: str | None = None
    every: float | str | None = None
    timezone: str | None = None
    task: ScheduledTask | TaskBuilder | None = None
    job: ScheduledJob | None = None
    catch_up: CatchUp = CatchUp.ALL
    max_catch_up: int = 100
    """With ``catch_up = "all"``: at most this many missed periods are submitted at once (the
    newest); older ones are passed over and counted."""
    run_on_start: bool = False
    """Submit the period under way when the schedule first starts in a database, instead of
    waiting for the next boundary. (A leader that starts later finds the periods it missed
    by itself, through ``catch_up``: submitting the current period again would be twice.)"""

    @property
    def timing(self) -> Timing:
        """The parsed timing (:func:`schedule_problems` first: this raises ValueError)."""
        return parse_timing(self.cron, self.every, self.timezone)

    def target(self) -> str:
        """What it submits, as ``status`` shows it: ``task report``, ``job cleanup → q``."""
        if self.job is not None:
            return f"job {self.job.kind} → {self.job.queue}"
        if isinstance(self.task, ScheduledTask):
            return f"task {self.task.model}"
        return "task (built by the app)"

    def limit(self) -> int:
        """How many missed periods one pass submits at most."""
        return self.max_catch_up if self.catch_up is CatchUp.ALL else 1


def period_task_id(schedule: str, period: datetime) -> uuid.UUID:
    """The id of the task ``schedule`` submits for the period beginning at ``period``: the
    same in every process, so a period's task can exist only once."""
    return uuid.uuid5(_PERIOD_NAMESPACE, f"{schedule}\n{period.isoformat()}")


def _json_problem(value: object, what: str) -> str | None:
    try:
        json.dumps(value, allow_nan=False)
    except (TypeError, ValueError) as exc:
        return f"{what} is not JSON ({exc})"
    return None


def schedule_problems(schedule: Schedule, where: str) -> list[str]:
    """Everything wrong with ``schedule``, each naming ``where`` and the field (empty: fine)."""
    problems: list[str] = []
    if not isinstance(schedule.name, str) or not _NAME.fullmatch(schedule.name):
        problems.append(
            f"{where}.name = {schedule.name!r}: 1 to 100 letters, digits and _ . : - "
            "(starting with a letter or digit)"
        )
    try:
        parse_timing(schedule.cron, schedule.every, schedule.timezone)
    except ValueError as exc:
        field = "every" if schedule.every is not None and schedule.cron is None else "cron"
        if "exactly one" in str(exc):
            field = "cron/every"
        elif "timezone" in str(exc):
            field = "timezone"
        problems.append(f"{where}.{field}: {exc}")
    if (schedule.task is None) == (schedule.job is None):
        problems.append(f"{where}: give exactly one of task and job")
    if isinstance(schedule.task, ScheduledTask):
        task = schedule.task
        if not isinstance(task.model, str) or not task.model.strip():
            problems.append(f"{where}.task.model: required (the model's name)")
        if not isinstance(task.tenant_id, str) or not task.tenant_id.strip():
            problems.append(f"{where}.task.tenant_id: required")
        problem = _json_problem(task.payload, f"{where}.task.payload")
        if problem:
            problems.append(problem)
    elif not callable(task_value := cast(object, schedule.task)) and task_value is not None:
        # Typed as a builder, but an app may pass anything.
        problems.append(f"{where}.task: a ScheduledTask or a function of the period")
    if schedule.job is not None:
        job = schedule.job
        if not isinstance(job.kind, str) or not 0 < len(job.kind) < 128:
            problems.append(f"{where}.job.kind: 1 to 127 characters")
        if not isinstance(job.queue, str) or not 0 < len(job.queue) < 128:
            problems.append(f"{where}.job.queue: 1 to 127 characters")
        if not isinstance(job.priority, int) or not 1 <= job.priority <= 4:
            problems.append(f"{where}.job.priority: 1 (highest) to 4")
        if job.max_attempts is not None and (
            not isinstance(job.max_attempts, int) or not 1 <= job.max_attempts <= 32767
        ):
            problems.append(f"{where}.job.max_attempts: 1 to 32767")
        problem = _json_problem(dict(job.args), f"{where}.job.args")
        if problem:
            problems.append(problem)
    if not isinstance(schedule.max_catch_up, int) or schedule.max_catch_up < 1:
        problems.append(f"{where}.max_catch_up: a whole number of at least 1")
    return problems


_TASK_KEYS = {f.name for f in attrs.fields(ScheduledTask)}
_JOB_KEYS = {f.name for f in attrs.fields(ScheduledJob)}
_SCHEDULE_KEYS = {f.name for f in attrs.fields(Schedule)}


def _unknown(table: Mapping[str, Any], known: set[str], where: str) -> list[str]:
    return [
        f"{where}.{key}: unknown setting; a schedule takes {', '.join(sorted(known))}"
        for key in table
        if key not in known
    ]


def schedule_from_table(table: object, where: str) -> tuple[Schedule | None, list[str]]:
    """A schedule from a ``[[schedules]]`` TOML table, or None and the problems found."""
    if not isinstance(table, Mapping):
        return None, [f"{where}: must be a table; write [[schedules]] and its settings under it"]
    problems = _unknown(table, _SCHEDULE_KEYS, where)
    values = {k: v for k, v in table.items() if k in _SCHEDULE_KEYS}
    task, job = values.pop("task", None), values.pop("job", None)
    built_task: ScheduledTask | None = None
    built_job: ScheduledJob | None = None
    if task is not None:
        if not isinstance(task, Mapping):
            problems.append(f"{where}.task: must be a table ([schedules.task])")
        else:
            problems += _unknown(task, _TASK_KEYS, f"{where}.task")
            fields = {k: v for k, v in task.items() if k in _TASK_KEYS}
            for required in ("model", "tenant_id"):
                fields.setdefault(required, "")
            try:
                fields["run_mode"] = RunMode(fields.get("run_mode", "live"))
            except ValueError:
                problems.append(f"{where}.task.run_mode: live or simulation")
                fields["run_mode"] = RunMode.LIVE
            built_task = ScheduledTask(**fields)
    if job is not None:
        if not isinstance(job, Mapping):
            problems.append(f"{where}.job: must be a table ([schedules.job])")
        else:
            problems += _unknown(job, _JOB_KEYS, f"{where}.job")
            fields = {k: v for k, v in job.items() if k in _JOB_KEYS}
            fields.setdefault("kind", "")
            if not isinstance(fields.get("args", {}), Mapping):
                problems.append(f"{where}.job.args: must be a table")
                fields["args"] = {}
            fields["tags"] = tuple(fields.get("tags", ()))
            built_job = ScheduledJob(**fields)
    if "catch_up" in values:
        try:
            values["catch_up"] = CatchUp(values["catch_up"])
        except ValueError:
            problems.append(f"{where}.catch_up = {values['catch_up']!r}: all or latest")
            del values["catch_up"]
    if "run_on_start" in values and not isinstance(values["run_on_start"], bool):
        problems.append(f"{where}.run_on_start: true or false")
        del values["run_on_start"]
    values.setdefault("name", "")
    schedule = Schedule(task=built_task, job=built_job, **values)
    problems += schedule_problems(schedule, where)
    return (None, problems) if problems else (schedule, [])


def duplicate_names(schedules: Sequence[Schedule], where: str = "schedules") -> list[str]:
    """A problem per schedule whose name an earlier one already has."""
    problems: list[str] = []
    seen: set[str] = set()
    for n, schedule in enumerate(schedules):
        if schedule.name in seen:
            problems.append(f"{where}[{n}].name: {schedule.name!r} is used by another schedule")
        seen.add(schedule.name)
    return problems


def check_schedules(schedules: Sequence[object], where: str = "schedules") -> list[str]:
    """The problems of every schedule (the app's: anything may be passed), and names used
    twice."""
    problems: list[str] = []
    for n, schedule in enumerate(schedules):
        if not isinstance(schedule, Schedule):
            problems.append(f"{where}[{n}]: {schedule!r} is not an engine.Schedule")
            continue
        problems += schedule_problems(schedule, f"{where}[{n}]")
    return problems + duplicate_names([s for s in schedules if isinstance(s, Schedule)], where)
