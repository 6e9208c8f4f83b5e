"""What the tasks layer needs of the open engine it works in.

An operator's decision on a task (:mod:`engine.tasks.review`) runs on the open engine's
database, queue and settings. The tasks layer sits below the service that builds that engine
(``engine.service``), so it names only what it uses, as a protocol that
:class:`engine.service.engine.Engine` satisfies.
"""

from __future__ import annotations

from typing import Protocol

from engine.config import EngineConfig
from engine.db.database import Database
from engine.queue.client import QueueClient

__all__ = ["OpenEngine"]


class OpenEngine(Protocol):
    """An open engine, as far as the tasks layer uses one."""

    @property
    def config(self) -> EngineConfig:
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
