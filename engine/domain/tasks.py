"""Tasks: what users submit (an AI request for a model), their identity and their events."""

from __future__ import annotations

import enum
import sys
import uuid
from datetime import datetime
from typing import Any

import attrs

from engine.db.bridge import Record

__all__ = [
    "FINAL_STATUSES",
    "Identity",
    "RunMode",
    "Task",
    "TaskEvent",
    "TaskPhase",
    "TaskRequest",
    "TaskStatus",
]


class TaskStatus(enum.StrEnum):
    """Where a task is (docs/tasks.md draws the machine)."""

    QUEUED = "queued"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"
    MANUAL_REVIEW = "manual_review"


#: Statuses a task never leaves by itself (manual_review waits for a human).
FINAL_STATUSES = frozenset(
    {TaskStatus.SUCCEEDED, TaskStatus.FAILED, TaskStatus.CANCELLED, TaskStatus.MANUAL_REVIEW}
)


class TaskPhase(enum.StrEnum):
    """The phase of a running task, for load accounting: heavy, cheap, heavy."""

    PREPARING = "preparing"
    WAITING_UPSTREAM = "waiting_upstream"
    FINALIZING = "finalizing"


class RunMode(enum.StrEnum):
    """``live`` calls the model's provider; ``simulation`` runs the simulated provider."""

    LIVE = "live"
    SIMULATION = "simulation"


_IDENTITY_FIELDS = (
    "tenant_id",
    "gateway_tenant_id",
    "tenant_key",
    "user_id",
    "gateway_user_id",
    "user_source",
    "user_group_id",
    "api_key_id",
    "api_key_name",
    "api_key_prefix",
)


# Members by value: a dict lookup costs a tenth of calling the enum, three times a row read.
_STATUSES = {member.value: member for member in TaskStatus}
_PHASES = {member.value: member for member in TaskPhase}
_RUN_MODES = {member.value: member for member in RunMode}


def _shared(text: Any) -> Any:
    """``text`` interned: tasks of a tenant, a user or a model repeat the same texts, and a
    process holding 50,000 running tasks keeps one copy of each (~250 bytes a task)."""
    return None if text is None else sys.intern(text)


@attrs.frozen
class Identity:
    """Who submitted a task: the tenant, the user and the API key, kept on the task's row;
    :meth:`auth_user` turns them into the user a provider acts as."""

    tenant_id: str
    user_id: str | None = None
    gateway_user_id: str | None = None
    gateway_tenant_id: str | None = None
    tenant_key: str | None = None
    user_source: str | None = None
    user_group_id: str | None = None
    api_key_id: str | None = None
    api_key_name: str | None = None
    api_key_prefix: str | None = None

    def auth_user(self) -> dict[str, Any]:
        """The user a provider acts as: the gateway user id if set, else the user id; role
        ``user`` only when the user id is not blank; source ``gateway`` unless ``user_source`` says
        otherwise; every other identity field as it is."""
        user_id = (self.user_id or "").strip()
        return {
            "id": self.gateway_user_id or self.user_id,
            "roles": ["user"] if user_id else None,
            "source": self.user_source or "gateway",
            "tenant_id": self.tenant_id,
            "gateway_tenant_id": self.gateway_tenant_id,
            "tenant_key": self.tenant_key,
            "gateway_user_id": self.gateway_user_id,
            "user_group_id": self.user_group_id,
            "api_key_id": self.api_key_id,
            "api_key_name": self.api_key_name,
            "api_key_prefix": self.api_key_prefix,
        }

    def as_dict(self) -> dict[str, str | None]:
        """The identity columns by name."""
        return {name: getattr(self, name) for name in _IDENTITY_FIELDS}


@attrs.frozen
class TaskRequest:
    """One task to submit."""

    model: str
    payload: Any
    identity: Identity
    group_key: str | None = None
    run_mode: RunMode = RunMode.LIVE
    run_at: datetime | None = None
    """Not before this time (None: now)."""
    id: uuid.UUID = attrs.field(factory=uuid.uuid4)


@attrs.frozen
class Task:
    """One ``engine_task`` row."""

    id: uuid.UUID
    model: str
    group_key: str | None
    identity: Identity
    run_mode: RunMode
    payload: Any
    status: TaskStatus
    phase: TaskPhase | None
    progress: float
    execution_token: uuid.UUID | None
    execution_owner: str | None
    lease_expires_at: datetime | None
    submitted_at: datetime | None
    upstream_ref: str | None
    attempts: int
    next_run_at: datetime
    river_job_id: int | None
    result: Any
    error: Any
    cancel_requested_at: datetime | None
    created_at: datetime
    updated_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    #: The last upstream call was made with an idempotency key: if its answer was lost, the
    #: call may be made again with the same key (recovery requeues the task, no manual review).
    submitted_idempotently: bool = False

    @property
    def is_final(self) -> bool:
        """True once the task reached a status it never leaves by itself."""
        return self.status in FINAL_STATUSES

    @property
    def submission_unanswered(self) -> bool:
        """An upstream call started (``submitted_at``) and recorded no reference: the upstream
        may or may not have accepted the task."""
        return self.submitted_at is not None and self.upstream_ref is None

    @property
    def submission_ambiguous(self) -> bool:
        """Unanswered, and made without an idempotency key: submitting again could run it
        twice upstream, so requeueing it sends it to manual review instead. The database
        states the same rule as ``engine_task_submission_ambiguous`` (migration 0015)."""
        return self.submission_unanswered and not self.submitted_idempotently

    @property
    def simulated(self) -> bool:
        """True for run mode ``simulation``."""
        return self.run_mode is RunMode.SIMULATION

    @classmethod
    def from_record(
        cls,
        rec: Record,
        *,
        task_id: uuid.UUID | None = None,
        token: uuid.UUID | None = None,
    ) -> Task:
        """Build from an ``engine_task`` row. ``task_id`` and ``token``: objects the caller
        holds that equal the row's id and execution token, kept instead of the row's copies
        (a task waiting upstream is held for minutes, 50,000 of them in one process)."""
        return cls(
            id=rec["id"] if task_id is None else task_id,
            model=sys.intern(rec["model"]),
            group_key=_shared(rec["group_key"]),
            identity=Identity(**{name: _shared(rec[name]) for name in _IDENTITY_FIELDS}),
            run_mode=_RUN_MODES[rec["run_mode"]],
            payload=rec["payload"],
            status=_STATUSES[rec["status"]],
            phase=None if rec["phase"] is None else _PHASES[rec["phase"]],
            progress=rec["progress"],
            execution_token=rec["execution_token"] if token is None else token,
            execution_owner=_shared(rec["execution_owner"]),
            lease_expires_at=rec["lease_expires_at"],
            submitted_at=rec["submitted_at"],
            upstream_ref=rec["upstream_ref"],
            attempts=rec["attempts"],
            next_run_at=rec["next_run_at"],
            river_job_id=rec["river_job_id"],
            result=rec["result"],
            error=rec["error"],
            cancel_requested_at=rec["cancel_requested_at"],
            created_at=rec["created_at"],
            updated_at=rec["updated_at"],
            started_at=rec["started_at"],
            finished_at=rec["finished_at"],
            # Rows read before migration 0014 (or by a narrower SELECT) have no such column.
            submitted_idempotently=bool(rec.get("submitted_idempotently", False)),
        )


@attrs.frozen
class TaskEvent:
    """One entry of a task's history."""

    task_id: uuid.UUID
    type: str
    status: str | None = None
    phase: str | None = None
    progress: float | None = None
    message: str | None = None
    payload: dict[str, Any] = attrs.field(factory=dict)
    simulated: bool = False
    instance_id: str | None = None
    at: datetime | None = None
