"""The gates a task run passes, as the runner sees them: the process's load and the scopes'
admission.

The job handler (:class:`engine.tasks.runner.TaskRunner`) asks two gates before and while it
runs a task: the **load gate** for a start (a :class:`LoadSlot`, moved through the phases of
the execution and released at its end) and, for a task of a limited model or group, the
**admission gate** for its scope slots. Both are implemented above the tasks layer (the load
controller of ``engine.load``, the scope admission of ``engine.admission``), so the runner
names only what it uses of them here, with the outcomes of an admission; the service hands
it the real ones.
"""

from __future__ import annotations

import enum
import uuid
from typing import Protocol

import attrs

from engine.domain.tasks import Task

__all__ = [
    "REFUSED_START_DELAY",
    "Admission",
    "AdmissionGate",
    "Admitted",
    "LoadGate",
    "LoadSlot",
    "Phase",
    "RateLimited",
    "Waiting",
]


class Phase(enum.StrEnum):
    """The phase an execution's load slot is in; ``preparing`` and ``finalizing`` are heavy."""

    PREPARING = "preparing"
    WAITING_UPSTREAM = "waiting_upstream"
    FINALIZING = "finalizing"


#: Seconds a job whose start the load gate refused snoozes when the runner has no rule for it
#: (the service gives it ``engine.load.retry_delay`` with ``load.retry_base`` and
#: ``load.retry_spread_ms``): the middle of that
#: rule's 250-750 ms.
REFUSED_START_DELAY = 0.5


class LoadSlot(Protocol):
    """One execution's place in the process's load: it starts ``preparing``."""

    def enter_nowait(self, phase: Phase) -> None:
        """Move to ``phase`` if that needs no wait; raise ``trio.WouldBlock`` (nothing changed)
        when the phase is heavy and the heavy ones are full, or others wait for them."""
        ...

    async def enter(self, phase: Phase) -> None:
        """Move to ``phase``, waiting for room if the phase is heavy and the heavy ones are
        full (cancellable: then the slot stays in its previous phase)."""
        ...

    def release(self) -> None:
        """Give the place back (idempotent)."""
        ...


class LoadGate(Protocol):
    """The process's load: whether one more execution may start now."""

    def try_start(self) -> LoadSlot | None:
        """A slot for one more execution, or None when the load refuses a start."""
        ...


@attrs.frozen
class Admitted:
    """Go ahead: the task holds a slot in each of ``scopes`` and is running now.

    Attributes:
        task: the task as the admission started it (``running``, its attempt counted).
        scopes: the limited scopes it holds a slot in (none for a rate limit alone).
    """

    task: Task
    scopes: tuple[str, ...] = ()


@attrs.frozen
class Waiting:
    """A scope is full or others wait ahead: the task now waits in line (it is queued again,
    and the dispatcher enqueues it when there is room)."""

    scopes: tuple[str, ...]


@attrs.frozen
class RateLimited:
    """A scope's rate limit is spent: try again in ``delay`` seconds (nothing was taken)."""

    scope: str
    delay: float


Admission = Admitted | Waiting | RateLimited
"""What the admission gate decided for a pending claim."""


class AdmissionGate(Protocol):
    """The scopes' admission: whether a task of a limited model or group may start now."""

    async def admit(
        self,
        task: Task,
        token: uuid.UUID,
        owner: str,
        *,
        job_id: int | None,
        lease_ttl: float,
        queue_timeout: float | None,
    ) -> Admission:
        """Decide whether ``task``, a pending claim (queued, holding ``token``), may start now:
        started (:class:`Admitted`, its lease renewed for ``lease_ttl`` seconds), in line for
        its scopes (:class:`Waiting`: the claim is released and job ``job_id`` completed, the
        wait bounded by ``queue_timeout``), or :class:`RateLimited`.

        Raises:
            LeaseUnavailable: ``token`` no longer holds the lease; nothing was written.
        """
        ...
