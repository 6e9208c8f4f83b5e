"""Jobs, their arguments and insert options.

A job's arguments are an attrs class with a ``kind`` class variable, as River's ``JobArgs``
(``Kind()``); fields marked ``attrs.field(metadata={"unique": True})`` form the unique key when
inserting with ``UniqueOpts(by_args=True)``, as River's ``river:"unique"`` struct tag.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any, ClassVar, Protocol, runtime_checkable

import attrs
import cattrs

from engine.db.bridge import Record
from engine.errors import JobError
from engine.queue.states import JobState
from engine.queue.unique import UniqueOpts

__all__ = [
    "InsertManyParams",
    "InsertOpts",
    "InsertResult",
    "Job",
    "JobArgs",
    "JobCancel",
    "JobSnooze",
    "converter",
]

#: Structures job args from their stored JSON; shared so apps can register their own hooks.
converter = cattrs.Converter()

_STATES = {s.value: s for s in JobState}
_intern = sys.intern
#: Args values up to this long are interned with their keys (see :func:`_shared_args`).
_INTERN_VALUE_MAX = 64
_TAG = re.compile(r"\A[\w][\w\-]+[\w]\Z")
_MAX_SMALLINT = 32767


@runtime_checkable
class JobArgs(Protocol):
    """What job arguments look like: an attrs instance whose class names its ``kind``."""

    kind: ClassVar[str]


class JobSnooze(Exception):
    """Raise from a handler to run the job again after ``seconds`` without using an attempt."""

    def __init__(self, seconds: float) -> None:
        if seconds < 0:
            raise ValueError("snooze seconds must be >= 0")
        super().__init__(f"snoozed for {seconds} s")
        self.seconds = float(seconds)


class JobCancel(Exception):
    """Raise from a handler to cancel the job for good; the reason is recorded as its error."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def _validate_queue(_inst: object, _attr: object, value: str) -> None:
    if not 0 < len(value) < 128:
        raise ValueError(f"queue name must be 1..127 characters, got {len(value)}")


def _validate_tags(_inst: object, _attr: object, value: tuple[str, ...]) -> None:
    for tag in value:
        if len(tag) > 255 or not _TAG.match(tag):
            raise ValueError(
                f"tag {tag!r} must be 3..255 characters of letters, digits, '_' and '-', "
                "starting and ending with a letter or digit"
            )


def _to_tags(value: Iterable[str]) -> tuple[str, ...]:
    return tuple(value)


def _validate_priority(_inst: object, _attr: object, value: int) -> None:
    if not 1 <= value <= 4:
        raise ValueError(f"priority must be 1..4 (1 is the highest), got {value}")


def _validate_max_attempts(_inst: object, _attr: object, value: int | None) -> None:
    if value is not None and not 1 <= value <= _MAX_SMALLINT:
        raise ValueError(f"max_attempts must be 1..{_MAX_SMALLINT}, got {value}")


@attrs.frozen
class InsertOpts:
    """How to insert a job (River's ``InsertOpts``); every field has River's default, or, for
    ``max_attempts``, the client's."""

    queue: str = attrs.field(default="default", validator=_validate_queue)
    priority: int = attrs.field(default=1, validator=_validate_priority)
    scheduled_at: datetime | None = None
    """Run at this time. Any value makes the job ``scheduled``, even a past one."""
    max_attempts: int | None = attrs.field(default=None, validator=_validate_max_attempts)
    """Attempts before the job is discarded; None takes the inserting client's default
    (``queue.default_max_attempts``, River's 25)."""
    tags: tuple[str, ...] = attrs.field(default=(), converter=_to_tags, validator=_validate_tags)
    metadata: Mapping[str, Any] = attrs.field(factory=dict)
    unique: UniqueOpts | None = None
    pending: bool = False
    """Insert as ``pending``: never fetched until something moves it on."""


@attrs.frozen
class InsertManyParams:
    """One job of an ``insert_many`` call (River's ``InsertManyParams``): its args, its insert
    options and, when ``args`` is a mapping, its kind.

    ``insert_many`` also takes bare args and ``(args, opts)`` pairs; this form is the one that
    can carry a kind, so it is how a mapping of args goes into a bulk insert.
    """

    args: Any
    """An attrs instance whose class names its ``kind``, or a mapping (then ``kind`` is
    required)."""
    opts: InsertOpts | None = None
    """How to insert it; None takes River's defaults (and the client's ``max_attempts``)."""
    kind: str | None = attrs.field(default=None, kw_only=True)
    """The job kind; required for mapping args, and it overrides an args class's ``kind``."""


@attrs.frozen
class Job:
    """One ``river_job`` row."""

    id: int
    state: JobState
    kind: str
    args: dict[str, Any]
    queue: str
    priority: int
    attempt: int
    max_attempts: int
    scheduled_at: datetime
    created_at: datetime
    attempted_at: datetime | None
    attempted_by: tuple[str, ...]
    finalized_at: datetime | None
    errors: tuple[dict[str, Any], ...]
    metadata: dict[str, Any]
    tags: tuple[str, ...]
    unique_key: bytes | None

    @classmethod
    def from_record(cls, rec: Record) -> Job:
        """Build from a ``river_job`` row (``RETURNING *`` or ``SELECT *``).

        The texts every job of a queue repeats (kind, queue, tags, the client that attempted
        it, the args' keys and short values) are interned: a process holding 50,000 running
        jobs keeps one copy of each instead of one per job (~400 bytes a job).
        """
        return cls(
            id=rec["id"],
            state=_STATES[rec["state"]],
            kind=_intern(rec["kind"]),
            args=_shared_args(rec["args"]),
            queue=_intern(rec["queue"]),
            priority=rec["priority"],
            attempt=rec["attempt"],
            max_attempts=rec["max_attempts"],
            scheduled_at=rec["scheduled_at"],
            created_at=rec["created_at"],
            attempted_at=rec["attempted_at"],
            attempted_by=tuple(map(_intern, rec["attempted_by"] or ())),
            finalized_at=rec["finalized_at"],
            errors=tuple(rec["errors"] or ()),
            metadata=rec["metadata"],
            tags=tuple(map(_intern, rec["tags"] or ())),
            unique_key=rec["unique_key"],
        )


def _shared_args(args: Any) -> Any:
    """``args`` (a decoded JSON object) with its keys, and its short text values, interned:
    each row's JSON decodes into new strings, though a queue's jobs mostly share them (a task
    job's ``task_id`` and ``model`` keys, its model). The same mapping, equal and as mutable."""
    if not isinstance(args, dict):
        return args
    return {
        _intern(k): (_intern(v) if isinstance(v, str) and len(v) <= _INTERN_VALUE_MAX else v)
        for k, v in args.items()
    }


@attrs.frozen
class InsertResult:
    """The job an insert produced, or the live duplicate it found (``skipped``)."""

    job: Job
    skipped: bool


def args_kind(args: Any) -> str:
    """The kind of an args instance, with a clear error for a class that names none."""
    if isinstance(args, Mapping):
        raise JobError(
            "job args given as a mapping have no kind: pass kind=... with them, or use an "
            "attrs class with a ClassVar[str] kind"
        )
    kind = getattr(type(args), "kind", None)
    if not isinstance(kind, str) or not kind:
        raise JobError(
            f"{type(args).__name__} has no 'kind': give job args classes a ClassVar[str] kind"
        )
    return check_kind(kind)


def check_kind(kind: object) -> str:
    """``kind`` if River accepts it as a job kind (1 to 127 characters).

    Raises:
        JobError: it is not a string of 1 to 127 characters.
    """
    if not isinstance(kind, str) or not 0 < len(kind) < 128:
        size = len(kind) if isinstance(kind, str) else type(kind).__name__
        raise JobError(f"job kind must be a string of 1..127 characters, got {size}")
    return kind


def args_to_dict(args: Any) -> dict[str, Any]:
    """Unstructure args to JSON-ready values (attrs instances or plain mappings)."""
    if isinstance(args, Mapping):
        return dict(args)
    if not attrs.has(type(args)):
        raise JobError(f"job args must be an attrs instance or a mapping, not {type(args)!r}")
    value = converter.unstructure(args)
    assert isinstance(value, dict)
    return value


def unique_arg_names(args: Any) -> tuple[str, ...] | None:
    """Fields tagged ``metadata={"unique": True}``, or None when none are (then all count)."""
    if not attrs.has(type(args)):
        return None
    names = tuple(f.name for f in attrs.fields(type(args)) if f.metadata.get("unique"))
    return names or None
