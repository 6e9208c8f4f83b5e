"""Valid tasks and requests in one call, for tests: ``make_request(payload={"prompt": "hi"})``.

Every field has a default that passes :meth:`Engine.submit`'s validation (the model
``test-model``, an empty payload, the tenant ``test-tenant`` and the user ``test-user``); an
override replaces one field by name. The identity's own fields may be given directly
(``make_request(tenant_id="acme")``), on top of ``identity=`` when both are given.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from typing import Any, Final

import attrs

from engine.domain.tasks import Identity, RunMode, Task, TaskPhase, TaskRequest, TaskStatus

__all__ = ["DEFAULT_IDENTITY", "DEFAULT_MODEL", "make_request", "make_task"]

#: The model of a task made without ``model=``.
DEFAULT_MODEL: Final = "test-model"
#: The identity of a task made without one: a tenant and a user, as submit requires.
DEFAULT_IDENTITY: Final = Identity(tenant_id="test-tenant", user_id="test-user")

_IDENTITY_FIELDS = frozenset(f.name for f in attrs.fields(Identity))
_REQUEST_FIELDS = frozenset(f.name for f in attrs.fields(TaskRequest))
_TASK_FIELDS = frozenset(f.name for f in attrs.fields(Task))
# Enum fields also take their text ("simulation", "failed"), as the database stores them.
_ENUMS: Mapping[str, type[RunMode] | type[TaskStatus] | type[TaskPhase]] = {
    "run_mode": RunMode,
    "status": TaskStatus,
    "phase": TaskPhase,
}


def _split(
    factory: str, fields: Iterable[str], overrides: Mapping[str, Any]
) -> tuple[dict[str, Any], dict[str, Any]]:
    """(identity fields, own fields) of ``overrides``; unknown names raise TypeError."""
    own = frozenset(fields)
    unknown = sorted(set(overrides) - own - _IDENTITY_FIELDS)
    if unknown:
        raise TypeError(
            f"{factory}() got unknown field(s) {', '.join(map(repr, unknown))}; it takes "
            f"{', '.join(sorted(own))}, and the identity's {', '.join(sorted(_IDENTITY_FIELDS))}"
        )
    identity = {k: v for k, v in overrides.items() if k in _IDENTITY_FIELDS}
    rest = {k: v for k, v in overrides.items() if k in own}
    for name, enum in _ENUMS.items():
        value = rest.get(name)
        if isinstance(value, str):
            rest[name] = enum(value)
    return identity, rest


def _identity(given: Any, fields: Mapping[str, Any]) -> Identity:
    identity = DEFAULT_IDENTITY if given is None else given
    if not isinstance(identity, Identity):
        raise TypeError(f"identity must be an engine.Identity, not {type(identity).__name__}")
    return attrs.evolve(identity, **fields) if fields else identity


def make_request(**overrides: Any) -> TaskRequest:
    """A :class:`~engine.TaskRequest` that submit accepts (model :data:`DEFAULT_MODEL`, payload
    ``{}``, identity :data:`DEFAULT_IDENTITY`, a new id), with ``overrides`` by field name.

    Raises:
        TypeError: a name is neither a field of TaskRequest nor one of Identity.
    """
    identity_fields, fields = _split("make_request", _REQUEST_FIELDS, overrides)
    identity = _identity(fields.pop("identity", None), identity_fields)
    return TaskRequest(**{"model": DEFAULT_MODEL, "payload": {}, **fields, "identity": identity})


def make_task(**overrides: Any) -> Task:
    """A :class:`~engine.Task` as submit stores it: queued, due now, never run (attempts 0, no
    lease, no upstream reference, no result), model :data:`DEFAULT_MODEL`, payload ``{}``,
    identity :data:`DEFAULT_IDENTITY`, a new id; ``overrides`` by field name.

    Only the fields given change: ``make_task(status="succeeded")`` has no ``finished_at``
    unless you give one too.

    Raises:
        TypeError: a name is neither a field of Task nor one of Identity.
    """
    identity_fields, fields = _split("make_task", _TASK_FIELDS, overrides)
    identity = _identity(fields.pop("identity", None), identity_fields)
    now = datetime.now(UTC)
    defaults: dict[str, Any] = {
        "id": uuid.uuid4(),
        "model": DEFAULT_MODEL,
        "group_key": None,
        "run_mode": RunMode.LIVE,
        "payload": {},
        "status": TaskStatus.QUEUED,
        "phase": None,
        "progress": 0.0,
        "execution_token": None,
        "execution_owner": None,
        "lease_expires_at": None,
        "submitted_at": None,
        "upstream_ref": None,
        "attempts": 0,
        "next_run_at": now,
        "river_job_id": None,
        "result": None,
        "error": None,
        "cancel_requested_at": None,
        "created_at": now,
        "updated_at": now,
        "started_at": None,
        "finished_at": None,
    }
    return Task(**{**defaults, **fields, "identity": identity})
