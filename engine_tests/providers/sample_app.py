"""A sample ``app`` module, as a user writes one, in each form ``open_providers`` accepts.

``EVENTS`` records what the context managers did, so a test sees the resource open and close.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from types import TracebackType
from typing import Any

from engine.domain.tasks import Task
from engine.providers.base import PollResult

#: What the context managers did, in order ("entered", "exited", "exited with <error>").
EVENTS: list[str] = []


class EchoProvider:
    """A provider that answers with its input at once."""

    poll_interval = 0.0

    async def prepare(self, task: Task) -> Any:
        """The payload is the request."""
        return task.payload

    async def submit(self, task: Task, prepared: Any) -> str:
        """Accept anything."""
        return f"echo-{task.id}"

    async def poll(self, task: Task, upstream_ref: str) -> PollResult:
        """Done on the first poll."""
        return PollResult(True, result=task.payload)

    async def finalize(self, task: Task, result: Any) -> Any:
        """The result as it came."""
        return result

    async def cancel(self, task: Task, upstream_ref: str) -> None:
        """Nothing to stop."""


class NoPollProvider:
    """A provider that forgot ``poll``: registering it must fail before any submit."""

    poll_interval = 1.0

    async def prepare(self, task: Task) -> Any:
        """The payload is the request."""
        return task.payload

    async def submit(self, task: Task, prepared: Any) -> str:
        """Accept anything."""
        return "ref"

    async def finalize(self, task: Task, result: Any) -> Any:
        """The result as it came."""
        return result

    async def cancel(self, task: Task, upstream_ref: str) -> None:
        """Nothing to stop."""


#: The plain form: a mapping of model name to provider.
PROVIDERS = {"echo": EchoProvider()}

#: A mapping with a provider that cannot poll.
BROKEN = {"echo": EchoProvider(), "no-poll": NoPollProvider()}


class Registry:
    """Providers kept on an object, for a dotted attribute (``sample_app:REGISTRY.providers``)."""

    def __init__(self) -> None:
        self.providers = {"echo": EchoProvider()}


REGISTRY = Registry()


def make_providers() -> dict[str, Any]:
    """A sync factory."""
    return {"echo": EchoProvider()}


async def make_providers_async() -> dict[str, Any]:
    """An async factory."""
    return {"echo": EchoProvider()}


@asynccontextmanager
async def open_app() -> AsyncIterator[dict[str, Any]]:
    """A function returning an async context manager: the provider's resources live for the
    block (here only recorded in ``EVENTS``)."""
    EVENTS.append("entered")
    try:
        yield {"echo": EchoProvider()}
    except BaseException as exc:
        EVENTS.append(f"exited with {type(exc).__name__}")
        raise
    EVENTS.append("exited")


@asynccontextmanager
async def open_broken_app() -> AsyncIterator[dict[str, Any]]:
    """Like :func:`open_app`, but yields a provider without ``poll``."""
    EVENTS.append("entered")
    try:
        yield {"no-poll": NoPollProvider()}
    except BaseException as exc:
        EVENTS.append(f"exited with {type(exc).__name__}")
        raise
    EVENTS.append("exited")


class Session:
    """A class-based async context manager: an instance is one, the class is its factory."""

    async def __aenter__(self) -> dict[str, Any]:
        EVENTS.append("entered")
        return {"echo": EchoProvider()}

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        EVENTS.append("exited" if exc_type is None else f"exited with {exc_type.__name__}")
