"""What a provider knows about the task it runs: :class:`TaskContext`, and service-long resources.

During every provider method (``prepare``, ``submit``, ``poll``, ``finalize``, ``cancel``) the
engine sets the task's context in a :mod:`contextvars` variable, read with
:func:`current_task_context` (``engine.current_task_context()``). A context variable rather
than an extra argument keeps every provider written against the four-argument methods working,
and it follows trio's rules: a task the provider starts in a nursery of its own inherits it.

:meth:`TaskContext.report_progress` records how far the provider is. The report becomes the
task's ``progress`` (scaled into the current phase's share of the engine's scale, so the bar
never runs backwards) and a ``task.progress`` event. Reports are coalesced: per task at most
one is written per ``EventWriter.progress_interval`` (1 s), the latest winning, so a provider
reporting in a tight loop costs no more statements than one reporting every second; and the
write is fenced by the execution's token, so a stale execution reports nothing.

A provider may also have ``lifespan()``, an async context manager the service enters once
before it runs any task and exits at shutdown (after the last task, before the database
closes); :func:`open_lifespans` does that, and what each yields is
:attr:`TaskContext.resources` for the provider's tasks.
"""

from __future__ import annotations

import math
import uuid
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import AsyncExitStack, asynccontextmanager
from contextvars import ContextVar, Token
from typing import Any

from engine.domain.tasks import Task, TaskPhase
from engine.errors import InvalidProvider

__all__ = [
    "ProgressSink",
    "TaskContext",
    "current_task_context",
    "open_lifespans",
    "task_context",
    "task_progress",
]

#: Where each phase's reports land on the task's progress scale (claimed 0.1, about to
#: submit 0.3, submitted 0.4, finalizing 0.9, succeeded 1.0).
_PHASE_SPAN: Mapping[TaskPhase, tuple[float, float]] = {
    TaskPhase.PREPARING: (0.1, 0.3),
    TaskPhase.WAITING_UPSTREAM: (0.4, 0.9),
    TaskPhase.FINALIZING: (0.9, 0.99),
}

#: Receives each report: (context, fraction 0..1, the task's progress, message).
ProgressSink = Callable[["TaskContext", float, float, str | None], None]

_CURRENT: ContextVar[TaskContext] = ContextVar("engine_task_context")


def task_progress(phase: TaskPhase, fraction: float) -> float:
    """The task's progress for ``fraction`` (0..1) of ``phase``'s work."""
    low, high = _PHASE_SPAN[phase]
    return round(low + (high - low) * fraction, 4)


class TaskContext:
    """One execution of one task, as its provider sees it.

    Attributes:
        task: the task as the execution claimed it.
        token: the execution's token (every write it makes is fenced by it).
        phase: the phase the execution is in (the engine moves it).
        resources: what the provider's ``lifespan()`` yielded at service start (None without
            one).
        callback_url: where the upstream may call back to finish the task
            (``<base>/hooks/<task id>``), or None when this process serves no hooks.
    """

    def __init__(
        self,
        task: Task,
        token: uuid.UUID,
        *,
        phase: TaskPhase = TaskPhase.PREPARING,
        resources: Any = None,
        callback_url: str | None = None,
        sink: ProgressSink | None = None,
    ) -> None:
        self.task = task
        self.token = token
        self.phase = phase
        self.resources = resources
        self.callback_url = callback_url
        self._sink = sink
        #: The last report's fraction and message (None before the first).
        self.last_report: tuple[float, str | None] | None = None

    def report_progress(self, fraction: float, message: str | None = None) -> None:
        """Report that ``fraction`` (0..1, clamped) of the current phase's work is done, with
        an optional short ``message``. Never blocks: the write is coalesced and rate limited
        (see the module docstring).

        Raises:
            ValueError: ``fraction`` is not a finite number.
        """
        if isinstance(fraction, bool) or not isinstance(fraction, int | float):
            raise ValueError(f"progress must be a number from 0 to 1, not {fraction!r}")
        if not math.isfinite(fraction):
            raise ValueError(f"progress must be a finite number, not {fraction!r}")
        fraction = min(1.0, max(0.0, float(fraction)))
        if message is not None:
            message = str(message)[:500]
        self.last_report = (fraction, message)
        if self._sink is not None:
            self._sink(self, fraction, task_progress(self.phase, fraction), message)


def current_task_context() -> TaskContext:
    """The context of the task whose provider method is running (in it, or in a task it
    started).

    Raises:
        RuntimeError: called outside a provider method the engine runs.
    """
    try:
        return _CURRENT.get()
    except LookupError:
        raise RuntimeError(
            "no task context here: engine.current_task_context() works only inside a "
            "provider method the engine calls (prepare, submit, poll, finalize, cancel)"
        ) from None


def task_context(context: TaskContext) -> _ContextBlock:
    """Make ``context`` the current task context for the block (the engine's runner does)."""
    return _ContextBlock(context)


class _ContextBlock:
    """The block of :func:`task_context`: a slotted class rather than a generator-based
    context manager, since every running execution is inside one for its whole run and a
    generator with its wrapper costs ~300 bytes more a task (a process holds 50,000 tasks
    waiting upstream)."""

    __slots__ = ("_context", "_reset")

    def __init__(self, context: TaskContext) -> None:
        self._context = context
        self._reset: Token[TaskContext] | None = None

    def __enter__(self) -> TaskContext:
        self._reset = _CURRENT.set(self._context)
        return self._context

    def __exit__(self, *exc: object) -> None:
        if self._reset is not None:
            _CURRENT.reset(self._reset)
            self._reset = None


def _is_async_cm(obj: object) -> bool:
    return hasattr(type(obj), "__aenter__") and hasattr(type(obj), "__aexit__")


@asynccontextmanager
async def open_lifespans(providers: Mapping[str, object]) -> AsyncIterator[dict[str, Any]]:
    """Enter the ``lifespan()`` of every provider that has one, once per provider object (one
    serving several models is entered once), in model name order; exit them in reverse when
    the block ends. Yields ``{model: what its provider's lifespan yielded}``.

    Raises:
        InvalidProvider: a ``lifespan`` that is not callable or does not return an async
            context manager (every lifespan entered so far is exited first).
    """
    resources: dict[str, Any] = {}
    entered: dict[int, Any] = {}
    async with AsyncExitStack() as stack:
        for name in sorted(providers):
            provider = providers[name]
            hook = getattr(provider, "lifespan", None)
            if hook is None:
                continue
            if id(provider) not in entered:
                manager: Any = hook() if callable(hook) else None
                if not _is_async_cm(manager):
                    raise InvalidProvider(
                        [
                            f"provider for model {name!r} ({type(provider).__qualname__}) has a "
                            "lifespan that does not return an async context manager; define "
                            "it with @asynccontextmanager (async def lifespan(self): ... yield)"
                        ]
                    )
                entered[id(provider)] = await stack.enter_async_context(manager)
            resources[name] = entered[id(provider)]
        yield resources
