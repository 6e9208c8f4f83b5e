"""What the task runner reports as it runs tasks: the seam its observer (the service's metrics)
plugs into.

:class:`engine.tasks.runner.TaskRunner` is handed one :class:`TaskObserver` when it is built,
so the first task it runs is reported like every later one; the tasks layer knows nothing
above it (:data:`QUIET` when nothing observes it).
"""

from __future__ import annotations

from typing import Final, Protocol

from engine.domain.tasks import Task, TaskStatus

__all__ = ["QUIET", "NullTaskObserver", "TaskObserver"]


class TaskObserver(Protocol):
    """The runner's events, each reported synchronously from the run where it happened: an
    implementation must be cheap and must not raise."""

    def task_started(self, task: Task) -> None:
        """An execution started running ``task`` (``task.attempts`` counts it)."""
        ...

    def phase_done(self, phase: str, seconds: float, model: str) -> None:
        """A task of ``model`` spent ``seconds`` in ``phase`` (e.g. ``preparing``)."""
        ...

    def task_finished(self, status: TaskStatus, task: Task | None) -> None:
        """This process recorded ``status`` as the outcome of ``task``; ``task`` is None for a
        run that failed before its claim returned the task."""
        ...


class NullTaskObserver:
    """Observes nothing: the observer of a runner built without one."""

    def task_started(self, task: Task) -> None:
        """Ignore the start."""

    def phase_done(self, phase: str, seconds: float, model: str) -> None:
        """Ignore the phase."""

    def task_finished(self, status: TaskStatus, task: Task | None) -> None:
        """Ignore the outcome."""


QUIET: Final[TaskObserver] = NullTaskObserver()
"""The shared :class:`NullTaskObserver`."""
