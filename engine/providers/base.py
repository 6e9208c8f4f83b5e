"""The provider seam: how a task talks to its upstream API.

A provider runs a task in four steps, each its own phase for load accounting::

    prepare  (preparing: heavy)     build the upstream request, download inputs
    submit   (waiting_upstream)     send it; return the upstream reference
    poll     (waiting_upstream)     until the upstream says done (cheap, possibly for minutes)
    finalize (finalizing: heavy)    fetch, transcode, upload the result

The engine records that a submission is about to happen *before* calling :meth:`submit` and the
reference right after it returns, so a crash in between is always detected: such a task goes to
manual review and is never submitted twice.

Two answers of :meth:`Provider.submit` say more than "ambiguous": :class:`NotSubmitted` (the
request never reached the upstream, or the upstream refused it for now without accepting it:
the engine submits again after a wait) and its kind :class:`UpstreamBusy` (429 or 503 with
``Retry-After``: the engine also holds back every other submission of the model in this
process for that long). A provider whose upstream recognises a repeated submission (an
idempotency key derived from the task) declares ``idempotent_submit = True``
(:func:`submits_idempotently`): the engine then retries an ambiguous submission instead of
sending the task to manual review.

Optional parts a provider may have (providers without them keep working unchanged):

- ``lifespan()``: an async context manager the service enters once before it runs any task
  and exits at shutdown (a shared HTTP client, a connection pool); what it yields is each
  task's :attr:`~engine.providers.context.TaskContext.resources`.
- ``callback_poll_interval`` and ``parse_callback(headers, body)``: the upstream finishes jobs
  by calling back ``POST /hooks/<task id>`` (:func:`callback_poll_interval`); the run then
  polls only every ``callback_poll_interval`` seconds, as a fallback for a lost callback.

During any provider method, :func:`engine.current_task_context` is the task's
:class:`~engine.providers.context.TaskContext` (progress reports, the callback URL, the
resources).
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

import attrs

from engine.domain.tasks import Task

__all__ = [
    "AmbiguousSubmission",
    "Callback",
    "CallbackRefused",
    "NotSubmitted",
    "PollResult",
    "Provider",
    "ProviderError",
    "UpstreamBusy",
    "callback_poll_interval",
    "submits_idempotently",
]


class ProviderError(Exception):
    """The upstream refused or failed the request; the task fails with this message."""

    def __init__(self, message: str, *, code: str = "provider_error") -> None:
        super().__init__(message)
        self.code = code


class AmbiguousSubmission(Exception):
    """The submission may or may not have reached the upstream (e.g. the response was lost).

    The task goes to manual review: submitting again could run it twice upstream (unless the
    provider submits idempotently, see :func:`submits_idempotently`).
    """


class NotSubmitted(Exception):
    """The request did not reach the upstream, or the upstream refused it for now without
    accepting it (a connection refused, a name that did not resolve, HTTP 408): nothing runs
    upstream, so submitting again is safe.

    Only :meth:`Provider.submit` may raise it. The engine submits again after ``retry_after``
    seconds (its own backoff when None), within the run, for up to the runner's
    ``submit_patience``; after that the task fails with ``code: upstream_unavailable``.
    """

    def __init__(self, message: str, *, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class UpstreamBusy(NotSubmitted):
    """The upstream is rate limiting or overloaded (HTTP 429 or 503): nothing was accepted.

    Besides waiting ``retry_after`` seconds itself, the engine holds back every submission of
    the task's model in this process until then, so a storm of 429s slows the model down
    instead of failing its tasks.
    """


@attrs.frozen
class PollResult:
    """One poll's answer: not done yet, done with a result, or done with an error."""

    done: bool
    result: Any = None
    error: str | None = None
    progress: float | None = None


class CallbackRefused(Exception):
    """A callback that is not authentic or cannot be read: ``POST /hooks/<task id>`` answers
    ``status`` (401: signature or timestamp; 400: an unreadable body) with ``reason``."""

    def __init__(self, reason: str, *, status: int = 401) -> None:
        super().__init__(reason)
        self.reason = reason
        self.status = status


@attrs.frozen
class Callback:
    """A verified callback: what it says about the upstream job, and which delivery it is.

    Attributes:
        result: the job's state, as a poll would have answered it.
        delivery: names this delivery (a hash of its signature): a second callback with the
            same delivery for the same task is a replay and is refused.
        upstream_id: the upstream's id of the job it is about, when the body says; a
            callback about another job than the task's is ignored.
    """

    result: PollResult
    delivery: str
    upstream_id: str | None = None


def callback_poll_interval(provider: object) -> float | None:
    """The seconds between fallback polls of a provider whose upstream calls back, or None
    when it does not (``callback_poll_interval`` unset, or no ``parse_callback``)."""
    interval = getattr(provider, "callback_poll_interval", None)
    if interval is None or not callable(getattr(provider, "parse_callback", None)):
        return None
    if isinstance(interval, bool) or not isinstance(interval, int | float) or interval < 0:
        return None
    return float(interval)


def submits_idempotently(provider: object) -> bool:
    """True when ``provider`` declares ``idempotent_submit = True``: calling ``submit`` again for
    the same task returns the upstream job of the first call instead of starting another (an
    idempotency key derived from the task id, the same across attempts and instances). Then an
    ambiguous submission is submitted again rather than sent to manual review. An optional
    attribute, so that providers written before it need no change."""
    return getattr(provider, "idempotent_submit", False) is True


@runtime_checkable
class Provider(Protocol):
    """What the engine needs from an upstream integration.

    Optional: ``idempotent_submit: bool`` (see :func:`submits_idempotently`); ``lifespan()``,
    ``callback_poll_interval`` and ``parse_callback`` (see the module docstring).
    """

    #: Seconds between polls.
    poll_interval: float

    async def prepare(self, task: Task) -> Any:
        """Build the upstream request (phase preparing)."""

    async def submit(self, task: Task, prepared: Any) -> str:
        """Send the request upstream; return the upstream's reference for it.

        Raises:
            ProviderError: the upstream refused it (nothing runs upstream).
            AmbiguousSubmission: it is unknown whether the upstream accepted it.
            NotSubmitted: it did not reach the upstream, or was refused for now; submit again
                later (``UpstreamBusy``: the upstream asked the model to slow down).
        """

    async def poll(self, task: Task, upstream_ref: str) -> PollResult:
        """Ask the upstream how the request is doing."""

    async def finalize(self, task: Task, result: Any) -> Any:
        """Turn the upstream's result into the task's result (phase finalizing)."""

    async def cancel(self, task: Task, upstream_ref: str) -> None:
        """Best effort: ask the upstream to stop (the task is cancelled either way)."""
