"""Assertions on what an engine stored: ``await assert_submitted(eng, model="summarize")``.

Each reads the engine's tasks (every status, oldest first) and filters them by the criteria
given; an omitted criterion matches everything:

- ``model``, ``tenant`` (the identity's ``tenant_id``) and ``status``: equal;
- ``payload``: contained in the task's payload. A mapping matches a mapping holding at least
  its keys, each value matched the same way (so nested mappings are subsets too); anything else
  (lists, strings, numbers) must be equal.

A failed assertion says what was expected and lists what *was* submitted, so the test output
shows the difference without a debugger::

    AssertionError: expected a task submitted with model='summarize', payload containing
    {'doc': 2}; none was.
    2 tasks were submitted (oldest first):
      - model='summarize' tenant='acme' status=queued payload={'doc': 1}
      - model='translate' tenant='acme' status=queued payload={'doc': 2}
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any, Final

from engine.domain.tasks import Task, TaskStatus
from engine.service.engine import Engine

__all__ = [
    "all_submitted",
    "assert_submitted",
    "describe_task",
    "describe_tasks",
    "payload_contains",
    "refute_submitted",
]

#: The most tasks these helpers read (newest first, then shown oldest first).
READ_LIMIT: Final = 10_000
#: The most tasks a failure message lists.
SHOWN: Final = 20
_PAYLOAD_CHARS: Final = 200


def payload_contains(payload: Any, expected: Any) -> bool:
    """True if ``expected`` is contained in ``payload`` (see the module docstring)."""
    if isinstance(expected, Mapping):
        return isinstance(payload, Mapping) and all(
            key in payload and payload_contains(payload[key], value)
            for key, value in expected.items()
        )
    return bool(payload == expected)


def describe_task(task: Task) -> str:
    """One line for a failure message: model, tenant, status and payload."""
    payload = repr(task.payload)
    if len(payload) > _PAYLOAD_CHARS:
        payload = payload[: _PAYLOAD_CHARS - 3] + "..."
    return (
        f"model={task.model!r} tenant={task.identity.tenant_id!r} "
        f"status={task.status.value} payload={payload}"
    )


def describe_tasks(tasks: list[Task], what: str = "submitted") -> str:
    """``N tasks were <what> (oldest first):`` and a line per task (at most :data:`SHOWN`)."""
    if not tasks:
        return f"no task was {what}."
    head = "1 task was" if len(tasks) == 1 else f"{len(tasks)} tasks were"
    lines = [f"{head} {what} (oldest first):"]
    lines += [f"  - {describe_task(t)}" for t in tasks[:SHOWN]]
    if len(tasks) > SHOWN:
        lines.append(f"  ... and {len(tasks) - SHOWN} more")
    return "\n".join(lines)


def _criteria(
    model: str | None, tenant: str | None, status: TaskStatus | str | None, payload: Any
) -> str:
    parts = []
    if model is not None:
        parts.append(f"model={model!r}")
    if tenant is not None:
        parts.append(f"tenant={tenant!r}")
    if status is not None:
        parts.append(f"status={TaskStatus(status).value}")
    if payload is not None:
        parts.append(f"payload containing {payload!r}")
    return (" with " + ", ".join(parts)) if parts else ""


def _sort_key(task: Task) -> tuple[datetime, int, str]:
    # One submit stores its tasks with one created_at; their jobs are numbered in order.
    return (task.created_at, task.river_job_id or 0, str(task.id))


async def _stored(eng: Engine) -> list[Task]:
    return sorted(await eng.list_tasks(limit=READ_LIMIT), key=_sort_key)


def _matching(
    tasks: Iterable[Task],
    model: str | None,
    tenant: str | None,
    status: TaskStatus | str | None,
    payload: Any,
) -> list[Task]:
    wanted = None if status is None else TaskStatus(status)
    return [
        t
        for t in tasks
        if (model is None or t.model == model)
        and (tenant is None or t.identity.tenant_id == tenant)
        and (wanted is None or t.status is wanted)
        and (payload is None or payload_contains(t.payload, payload))
    ]


async def all_submitted(
    eng: Engine,
    *,
    model: str | None = None,
    payload: Any = None,
    tenant: str | None = None,
    status: TaskStatus | str | None = None,
) -> list[Task]:
    """Every task ``eng`` stored that matches, oldest first (at most :data:`READ_LIMIT` are
    read)."""
    return _matching(await _stored(eng), model, tenant, status, payload)


async def assert_submitted(
    eng: Engine,
    *,
    model: str | None = None,
    payload: Any = None,
    tenant: str | None = None,
    status: TaskStatus | str | None = None,
    count: int | None = None,
) -> list[Task]:
    """Assert that a task matching was submitted (exactly ``count`` of them when given);
    return the matching tasks, oldest first.

    Raises:
        AssertionError: none matched (or not ``count``); the message lists every task stored.
    """
    stored = await _stored(eng)
    found = _matching(stored, model, tenant, status, payload)
    if (count is None and found) or (count is not None and len(found) == count):
        return found
    criteria = _criteria(model, tenant, status, payload)
    if count is None:
        expected, got = f"a task submitted{criteria}", "none was"
    else:
        noun = "task" if count == 1 else "tasks"
        expected = f"{count} {noun} submitted{criteria}"
        got = "none was" if not found else ("1 was" if len(found) == 1 else f"{len(found)} were")
    raise AssertionError(f"expected {expected}; {got}.\n{describe_tasks(stored)}")


async def refute_submitted(
    eng: Engine,
    *,
    model: str | None = None,
    payload: Any = None,
    tenant: str | None = None,
    status: TaskStatus | str | None = None,
) -> None:
    """Assert that no task matching was submitted.

    Raises:
        AssertionError: some matched; the message lists every task stored.
    """
    stored = await _stored(eng)
    found = _matching(stored, model, tenant, status, payload)
    if not found:
        return
    got = "1 was" if len(found) == 1 else f"{len(found)} were"
    criteria = _criteria(model, tenant, status, payload)
    raise AssertionError(f"expected no task submitted{criteria}; {got}.\n{describe_tasks(stored)}")
