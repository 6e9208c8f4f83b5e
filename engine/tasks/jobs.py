"""The job that runs a task: its args, and which instances may claim it.

A task's job carries ``{"task_id": "<uuid>"}``, unique by ``task_id`` over the live states, the
same args and unique key as the Go worker's River jobs. A live task's job also carries its model
(``{"task_id": …, "model": "echo"}``), so that only an instance with a provider for that model
claims it (:func:`model_claim_filter`, the producer's args filter). ``model`` is not part of the
unique key: a job inserted by a Go River client with ``{"task_id"}`` only collides with ours for
the same task. A simulation task runs on the simulated provider that every engine has, so its
job carries no model and any instance may claim it; so may a job inserted without one (by the Go
worker, or by an engine from before model routing).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import ClassVar, Final

import attrs
from cattrs.gen import make_dict_unstructure_fn, override

from engine.domain.tasks import RunMode
from engine.queue.job import converter

__all__ = ["MODEL_ARG", "TaskRunArgs", "model_claim_filter"]

MODEL_ARG: Final = "model"
"""The args key a task job's model is stored under, and the key the claim filter reads."""


@attrs.frozen
class TaskRunArgs:
    """The job's args: which task to run, unique by ``task_id``; for a live task, its model.

    Attributes:
        task_id: the task's id as a string; the one unique field (River's ``river:"unique"``).
        model: the live task's model, which routes the job to instances serving it; ``None``
            for a simulation task (and for jobs inserted without one), which any instance runs.
            Left out of the stored args when ``None``, so such jobs are ``{"task_id"}`` only.
    """

    kind: ClassVar[str] = "gateway_task_run"
    task_id: str = attrs.field(metadata={"unique": True})
    model: str | None = None

    @classmethod
    def for_task(cls, task_id: object, model: str, run_mode: RunMode | str) -> TaskRunArgs:
        """The args of a task's job: the model for a live task, none for a simulation task.

        Args:
            task_id: the task's id (a UUID or its string).
            model: the task's model.
            run_mode: the task's run mode (a :class:`RunMode` or its stored text).
        """
        live = RunMode(run_mode) is RunMode.LIVE
        return cls(str(task_id), model if live else None)


# Omit ``model`` when None: a simulation task's args stay exactly River's ``{"task_id": …}``.
converter.register_unstructure_hook(
    TaskRunArgs,
    make_dict_unstructure_fn(TaskRunArgs, converter, model=override(omit_if_default=True)),
)


def model_claim_filter(models: Iterable[str] | None) -> tuple[str, tuple[str, ...]] | None:
    """The producer args filter for an instance that serves ``models``.

    ``None`` (serves every model) gives ``None``: claim every job, the fast path. Otherwise the
    instance claims jobs whose args name one of ``models``, and jobs that name none (simulation
    tasks, jobs inserted without a model). An empty ``models`` claims only the latter.
    """
    if models is None:
        return None
    return (MODEL_ARG, tuple(sorted(set(models))))
