"""What the tasks layer needs of the open engine it works in.

An operator's decision on a task (:mod:`engine.tasks.review`) runs on the open engine's
database, queue and settings. The tasks layer sits below the service that builds that engine
(``engine.service``), so it names only what it uses, as a protocol that
:class:`engine.service.engine.Engine` satisfies.
"""

from __future__ import annotations

from typing import Protocol

from engine.db.database import Database
from engine.queue.client import QueueClient
from engine.queue.config import QueueConfig

__all__ = ["EngineSettings", "OpenEngine", "WorkerSettings"]


class WorkerSettings(Protocol):
    """What the tasks layer reads of the ``[worker]`` section."""

    @property
    def enqueue_rollback_timeout(self) -> float:
        """Seconds a failed enqueue transaction's rollback may take."""
        ...


class EngineSettings(Protocol):
    """What the tasks layer reads of the engine's configuration (``EngineConfig`` has it)."""

    @property
    def queue(self) -> QueueConfig:
        """The ``[queue]`` section: the options of the jobs it inserts."""
        ...

    @property
    def worker(self) -> WorkerSettings:
        """The part of the ``[worker]`` section it reads."""
        ...


class OpenEngine(Protocol):
    """An open engine, as far as the tasks layer uses one."""

    @property
    def config(self) -> EngineSettings:
        """The engine's settings."""
        ...

    @property
    def db(self) -> Database:
        """The engine's database pools."""
        ...

    @property
    def queue(self) -> QueueClient:
        """The engine's job queue."""
        ...

    @property
    def instance_id(self) -> str:
        """This process's instance id, recorded with the events it writes."""
        ...
