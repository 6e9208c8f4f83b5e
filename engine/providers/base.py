"""The provider seam: how a task talks to its upstream API.

A provider runs a task in four steps, each its own phase for load accounting::

    prepare  (preparing: heavy)     build the upstream request, download inputs
    submit   (waiting_upstream)     send it; return the upstream reference
    poll     (waiting_upstream)     until the upstream says done (cheap, possibly for minutes)
    finalize (finalizing: heavy)    fetch, transcode, upload the result

The engine records that a submission is about to happen *before* calling :meth:`submit` and the
reference right after it returns, so a crash in between is always detected: such a task goes to
manual review and is never submitted twice.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

import attrs

from engine.tasks.models import Task

__all__ = ["AmbiguousSubmission", "PollResult", "Provider", "ProviderError"]


class ProviderError(Exception):
    """The upstream refused or failed the request; the task fails with this message."""

    def __init__(self, message: str, *, code: str = "provider_error") -> None:
        super().__init__(message)
        self.code = code


class AmbiguousSubmission(Exception):
    """The submission may or may not have reached the upstream (e.g. the response was lost).

    The task goes to manual review: submitting again could run it twice upstream.
    """


@attrs.frozen
class PollResult:
    """One poll's answer: not done yet, done with a result, or done with an error."""

    done: bool
    result: Any = None
    error: str | None = None
    progress: float | None = None


@runtime_checkable
class Provider(Protocol):
    """What the engine needs from an upstream integration."""

    #: Seconds between polls.
    poll_interval: float

    async def prepare(self, task: Task) -> Any:
        """Build the upstream request (phase preparing)."""

    async def submit(self, task: Task, prepared: Any) -> str:
        """Send the request upstream; return the upstream's reference for it.

        Raises:
            ProviderError: the upstream refused it (nothing runs upstream).
            AmbiguousSubmission: it is unknown whether the upstream accepted it.
        """

    async def poll(self, task: Task, upstream_ref: str) -> PollResult:
        """Ask the upstream how the request is doing."""

    async def finalize(self, task: Task, result: Any) -> Any:
        """Turn the upstream's result into the task's result (phase finalizing)."""

    async def cancel(self, task: Task, upstream_ref: str) -> None:
        """Best effort: ask the upstream to stop (the task is cancelled either way)."""
