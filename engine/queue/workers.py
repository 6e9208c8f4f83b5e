"""Handlers registered per job kind."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterator
from typing import Any, Generic, TypeVar

import attrs

from engine.queue.job import Job, converter

__all__ = ["Handler", "Worker", "Workers"]

A = TypeVar("A")

#: A job handler: ``await handler(job, args)``. Return to complete the job; raise
#: :class:`~engine.queue.job.JobSnooze` or :class:`~engine.queue.job.JobCancel` to snooze or
#: cancel it; any other exception is an error (retried with backoff, discarded at max attempts).
Handler = Callable[[Job, A], Awaitable[None]]


@attrs.frozen
class Worker(Generic[A]):
    """One kind's handler, its args class and optional timeout in seconds.

    A None timeout takes the queue's ``job_timeout`` (itself unset, so no deadline, by
    default); ``math.inf`` means no deadline whatever the queue's (River: ``Timeout()`` -1).
    """

    kind: str
    args_type: type[A]
    handler: Handler[A]
    timeout: float | None = None

    def structure(self, args: dict[str, Any]) -> A:
        """Turn stored JSON args into ``args_type`` (mappings pass through as they are)."""
        if self.args_type is dict:
            return args  # type: ignore[return-value]
        return converter.structure(args, self.args_type)


class Workers:
    """The handlers of one process, by job kind."""

    def __init__(self) -> None:
        self._by_kind: dict[str, Worker[Any]] = {}

    def register(
        self,
        args_type: type[A],
        handler: Handler[A],
        *,
        kind: str | None = None,
        timeout: float | None = None,
    ) -> Worker[A]:
        """Register ``handler`` for jobs of ``args_type.kind`` (or ``kind``).

        ``timeout`` is the deadline of one run in seconds; None takes the queue's
        ``job_timeout``, ``math.inf`` means none.

        Raises:
            ValueError: the kind is already registered, or ``timeout`` is not positive.
        """
        name = kind or getattr(args_type, "kind", None)
        if not isinstance(name, str) or not name:
            raise ValueError(f"{args_type.__name__} has no kind; pass kind= or set a ClassVar")
        if name in self._by_kind:
            raise ValueError(f"a worker for kind {name!r} is already registered")
        if timeout is not None and timeout <= 0:
            raise ValueError("timeout must be > 0 seconds, or None for no deadline")
        worker = Worker(name, args_type, handler, timeout)
        self._by_kind[name] = worker
        return worker

    def get(self, kind: str) -> Worker[Any] | None:
        """The worker for ``kind``, or None."""
        return self._by_kind.get(kind)

    def __iter__(self) -> Iterator[Worker[Any]]:
        return iter(self._by_kind.values())

    def __contains__(self, kind: object) -> bool:
        return kind in self._by_kind
