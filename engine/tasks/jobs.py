"""The job that runs a task: its args, its insert options, giving tasks jobs, and which
instances may claim them.

A task's job carries ``{"task_id": "<uuid>"}``, unique by ``task_id`` over the live states, so
a River client (in Go) that inserts task jobs with those args dedupes against engine's. A live
task's job also carries its model (``{"task_id": …, "model": "echo"}``), so that only an
instance with a provider for that model claims it (:func:`model_claim_filter`, the producer's
args filter). ``model`` is not part of the unique key: a job inserted by a River client with
``{"task_id"}`` only collides with ours for the same task. A simulation task runs on the
simulated provider that every engine has, so its job carries no model and any instance may claim
it; so may a job inserted without one (by a River client, or by an engine from before model
routing).

Every path that gives tasks jobs (submission, admission, recovery's re-enqueue, an operator's
retry or resubmission) describes each as a :class:`TaskJob` and inserts them here, all of them
in one statement (:func:`insert_task_jobs`); :func:`give_jobs` then points the tasks at their
jobs in one more. Those are the only statements, however many tasks: an instance runs about
2,000 of them a second, so they stay batched.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from typing import ClassVar, Final

import attrs
from cattrs.gen import make_dict_unstructure_fn, override

from engine.db.bridge import Connection, Record
from engine.db.sqlfiles import QUERIES
from engine.domain.tasks import RunMode
from engine.queue.config import QueueConfig
from engine.queue.insert import InsertParams, insert_tx, prepare
from engine.queue.job import InsertOpts, InsertResult, converter
from engine.queue.states import GATEWAY_UNIQUE_STATES
from engine.queue.unique import UniqueOpts

__all__ = [
    "MODEL_ARG",
    "TaskJob",
    "TaskRunArgs",
    "give_jobs",
    "insert_task_jobs",
    "model_claim_filter",
    "task_insert_opts",
]

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


# Unique by task_id alone (within the queue): the model in a live task's args routes the job and
# must not change its key (a River client inserting {"task_id"} dedupes against ours).
_GATEWAY_UNIQUE = UniqueOpts(by_args=("task_id",), by_queue=True, by_state=GATEWAY_UNIQUE_STATES)
_SET_JOB = QUERIES["task_set_job_many"]


def task_insert_opts(config: QueueConfig, run_at: datetime | None = None) -> InsertOpts:
    """The job options of a task: unique by task id over the live states; scheduled only
    when it is due later (a ``run_at`` already past inserts an available job)."""
    scheduled = run_at if run_at is not None and run_at > datetime.now(UTC) else None
    return InsertOpts(
        queue=config.name,
        priority=config.insert_priority,
        max_attempts=config.insert_max_attempts,
        tags=config.insert_tags,
        unique=_GATEWAY_UNIQUE,
        scheduled_at=scheduled,
    )


@attrs.frozen
class TaskJob:
    """A task to give a job, and what that job is made of.

    Attributes:
        task_id: the task.
        model: the task's model; it routes a live task's job (see :class:`TaskRunArgs`).
            ``None`` for a task that is gone (its job finds no task and completes).
        run_mode: the task's run mode (a :class:`RunMode` or its stored text).
        run_at: when the task is due; a job due later is scheduled, else available now.
    """

    task_id: uuid.UUID
    model: str | None = None
    run_mode: RunMode | str = RunMode.SIMULATION
    run_at: datetime | None = None

    @classmethod
    def from_record(cls, row: Record) -> TaskJob:
        """The job of a task row (its ``id``, ``model``, ``run_mode`` and ``next_run_at``)."""
        return cls(row["id"], row["model"], row["run_mode"], row["next_run_at"])

    def params(self, queue: QueueConfig) -> InsertParams:
        """The job, ready to insert on ``queue``."""
        live = self.model is not None and RunMode(self.run_mode) is RunMode.LIVE
        return prepare(
            TaskRunArgs(str(self.task_id), self.model if live else None),
            task_insert_opts(queue, self.run_at),
            kind=queue.job_kind,
        )


async def insert_task_jobs(
    conn: Connection,
    jobs: Sequence[TaskJob],
    *,
    queue: QueueConfig,
    notify_channel: str | None,
) -> list[InsertResult]:
    """Insert the jobs of ``jobs`` on ``conn``, in the caller's transaction, in one statement
    (:func:`~engine.queue.insert.insert_tx`); return the results in the order of ``jobs``.

    A task that already has a live job gets that job back, flagged ``skipped`` (the jobs are
    unique by task id). The tasks are not pointed at their jobs: a submission stores the tasks
    after their jobs, with the job ids (else see :func:`give_jobs`).
    """
    return await insert_tx(conn, [job.params(queue) for job in jobs], notify_channel)


async def give_jobs(
    conn: Connection,
    jobs: Sequence[TaskJob],
    *,
    queue: QueueConfig,
    notify_channel: str | None,
) -> list[InsertResult]:
    """Give existing tasks their jobs, in the caller's transaction on ``conn``: insert them
    (:func:`insert_task_jobs`, one statement), then point each task at its job (one statement,
    ``task_set_job_many``); return the insert results in the order of ``jobs``.

    A result flagged ``skipped`` is the task's live job found instead; a caller to which that
    matters (a previous job still running) checks it and raises, rolling the whole back.
    """
    if not jobs:
        return []
    results = await insert_task_jobs(conn, jobs, queue=queue, notify_channel=notify_channel)
    await conn.execute(_SET_JOB, [job.task_id for job in jobs], [r.job.id for r in results])
    return results


def model_claim_filter(models: Iterable[str] | None) -> tuple[str, tuple[str, ...]] | None:
    """The producer args filter for an instance that serves ``models``.

    ``None`` (serves every model) gives ``None``: claim every job, the fast path. Otherwise the
    instance claims jobs whose args name one of ``models``, and jobs that name none (simulation
    tasks, jobs inserted without a model). An empty ``models`` claims only the latter.
    """
    if models is None:
        return None
    return (MODEL_ARG, tuple(sorted(set(models))))
