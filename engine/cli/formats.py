"""How the client commands write values: JSON documents, and the cells of their tables.

``--json`` prints one JSON document on one line (:func:`dumps`). Timestamps are ISO 8601 with a
UTC offset; ids of tasks are UUID strings; a progress is a fraction rounded to four decimals
(``0.1``). The shapes of the documents are in each command group's module
(:mod:`engine.cli.tasks`, :mod:`engine.cli.status`, :mod:`engine.cli.queue`,
:mod:`engine.cli.models`); the forms they share are here.
"""

from __future__ import annotations

import enum
import json
import uuid
from datetime import datetime
from typing import Any

import attrs

from engine.capacity.registry import InstanceInfo
from engine.cli.args import format_interval
from engine.db.bridge import Record
from engine.domain.tasks import Task, TaskEvent
from engine.queue.job import Job
from engine.schedules.status import ScheduleState

__all__ = [
    "age",
    "compact",
    "dumps",
    "event_json",
    "group_json",
    "instance_json",
    "iso",
    "job_json",
    "limit_text",
    "model_json",
    "model_settings",
    "rate_text",
    "schedule_json",
    "task_json",
]


def _json_default(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, uuid.UUID):
        return str(value)
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, bytes):
        return value.hex()
    if isinstance(value, (set, frozenset, tuple)):
        return list(value)
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


def dumps(document: Any) -> str:
    """One JSON document on one line; datetimes, UUIDs, enums and bytes as strings."""
    return json.dumps(document, default=_json_default, ensure_ascii=False)


def compact(value: Any) -> str:
    """A JSON value on one line without spaces, for tables and ``tasks show``."""
    return json.dumps(value, default=_json_default, ensure_ascii=False, separators=(",", ":"))


def _progress(value: float | None) -> float | None:
    """A progress fraction as stored (a ``real``: 0.1 reads as 0.10000000149011612), rounded to
    four decimals for output."""
    return None if value is None else round(float(value), 4)


def iso(value: datetime | None) -> str | None:
    """A timestamp as JSON writes it: ISO 8601 with its UTC offset, or None."""
    return None if value is None else value.isoformat()


def task_json(task: Task) -> dict[str, Any]:
    """The ``--json`` form of a task (TASK in :mod:`engine.cli.tasks`)."""
    return {
        "id": str(task.id),
        "model": task.model,
        "group_key": task.group_key,
        "status": task.status.value,
        "phase": None if task.phase is None else task.phase.value,
        "progress": _progress(task.progress),
        "run_mode": task.run_mode.value,
        "identity": task.identity.as_dict(),
        "payload": task.payload,
        "result": task.result,
        "error": task.error,
        "attempts": task.attempts,
        "river_job_id": task.river_job_id,
        "execution_owner": task.execution_owner,
        "lease_expires_at": iso(task.lease_expires_at),
        "submitted_at": iso(task.submitted_at),
        "upstream_ref": task.upstream_ref,
        "cancel_requested_at": iso(task.cancel_requested_at),
        "next_run_at": iso(task.next_run_at),
        "created_at": iso(task.created_at),
        "updated_at": iso(task.updated_at),
        "started_at": iso(task.started_at),
        "finished_at": iso(task.finished_at),
    }


def event_json(event: TaskEvent) -> dict[str, Any]:
    """The ``--json`` form of a task event."""
    return {
        "type": event.type,
        "status": event.status,
        "phase": event.phase,
        "progress": _progress(event.progress),
        "message": event.message,
        "payload": event.payload,
        "simulated": event.simulated,
        "instance_id": event.instance_id,
        "at": iso(event.at),
    }


def job_json(job: Job) -> dict[str, Any]:
    """The ``--json`` form of a queue job."""
    return {
        "id": job.id,
        "state": job.state.value,
        "kind": job.kind,
        "queue": job.queue,
        "priority": job.priority,
        "attempt": job.attempt,
        "max_attempts": job.max_attempts,
        "args": job.args,
        "tags": list(job.tags),
        "metadata": job.metadata,
        "errors": list(job.errors),
        "scheduled_at": iso(job.scheduled_at),
        "created_at": iso(job.created_at),
        "attempted_at": iso(job.attempted_at),
        "finalized_at": iso(job.finalized_at),
    }


def _limit_json(limit: int | None) -> int | None:
    """A concurrency limit as users read it: None (unlimited) for NULL or <= 0."""
    return limit if limit is not None and limit > 0 else None


def _rate_json(row: Record) -> dict[str, Any]:
    """``rate_limit`` and ``rate_interval`` as users read them: both null without a rate limit
    (NULL or <= 0, as admission reads it)."""
    limit = _limit_json(row["rate_limit"])
    return {
        "rate_limit": limit,
        "rate_interval": None if limit is None else float(row["rate_interval"]),
    }


def model_settings(value: Any) -> dict[str, Any]:
    """A model's stored settings as a mapping (anything that is not an object becomes ``{}``)."""
    return dict(value) if isinstance(value, dict) else {}


def model_json(row: Record) -> dict[str, Any]:
    """The ``--json`` form of a catalogue model row."""
    return {
        "name": row["name"],
        "enabled": row["enabled"],
        "concurrency_limit": _limit_json(row["concurrency_limit"]),
        **_rate_json(row),
        "provider": row["provider"],
        "settings": model_settings(row["settings"]),
        "created_at": iso(row["created_at"]),
        "updated_at": iso(row["updated_at"]),
    }


def group_json(row: Record) -> dict[str, Any]:
    """The ``--json`` form of a catalogue group row."""
    return {
        "key": row["key"],
        "enabled": row["enabled"],
        "concurrency_limit": _limit_json(row["concurrency_limit"]),
        **_rate_json(row),
        "created_at": iso(row["created_at"]),
        "updated_at": iso(row["updated_at"]),
    }


def schedule_json(state: ScheduleState) -> dict[str, Any]:
    """The ``--json`` form of a schedule."""
    return attrs.asdict(state)


def instance_json(info: InstanceInfo) -> dict[str, Any]:
    """The ``--json`` form of a registry row (``models`` a list, or null)."""
    doc = attrs.asdict(info)
    doc["models"] = None if info.models is None else list(info.models)
    return doc


def age(seconds: float) -> str:
    """A duration for humans: ``4.2 s``, ``12 min``, ``3.5 h``."""
    if seconds < 120:
        return f"{seconds:.1f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def limit_text(limit: int | None) -> str:
    """A concurrency limit for humans: the number, or ``unlimited``."""
    limit = _limit_json(limit)
    return "unlimited" if limit is None else str(limit)


def rate_text(row: Record) -> str:
    """A rate limit for humans: ``10/1s`` (10 requests per second), or ``none``; ``--rate``
    accepts it as printed."""
    rate = _rate_json(row)
    if rate["rate_limit"] is None:
        return "none"
    return f"{rate['rate_limit']}/{format_interval(rate['rate_interval'])}s"
