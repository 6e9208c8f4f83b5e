"""One execution of a task: the lease claim, the admission of a pending claim, the hand-back
of a task this process cannot run, the run under the execution's lease and cancel scope, and a
user's cancel.

Rows 4 to 8 of the decision table (:mod:`engine.tasks.runner`) start here: the claim either
returns the task, or a second read says why not; a task submitted before with no recorded
answer goes to manual review; a task with no provider here is handed back; a pending claim
asks the admission gate; then the provider calls run (:mod:`engine.tasks.upstream`).
"""

from __future__ import annotations

import logging
import uuid
from collections import OrderedDict
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

import trio

from engine.db.sqlfiles import QUERIES
from engine.domain.tasks import Task, TaskStatus
from engine.errors import LeaseUnavailable, ManualReview
from engine.providers.base import Provider, submits_idempotently
from engine.providers.context import TaskContext, task_context
from engine.queue.job import Job
from engine.tasks.gates import AdmissionGate, LoadSlot, RateLimited, Waiting
from engine.tasks.leases import Execution, LeaseKeeper
from engine.tasks.observe import QUIET, TaskObserver
from engine.tasks.store import EventWriter, ProgressReport, TaskStore
from engine.tasks.upstream import UpstreamCalls

__all__ = ["Executions", "Run", "TaskQueued"]

#: The runner's log lines keep the one logger name they have always had.
log = logging.getLogger("engine.tasks.runner")

_HAND_BACK = QUERIES["task_hand_back"]
#: Seconds the hand-back's write may take (it records a requeue: shielded, bounded).
_HAND_BACK_TIMEOUT = 10.0
#: Tasks whose hand-back this runner remembers, so a task that keeps coming back to an
#: instance without its provider gets one event and one log line from it, not one per snooze.
_HANDED_BACK_MEMORY = 10_000


class TaskQueued(Exception):
    """The task must run later; the job snoozes for ``delay`` seconds (row 8)."""

    def __init__(self, delay: float) -> None:
        super().__init__(f"task queued for {delay:.3f} s")
        self.delay = delay


class Run:
    """One run of the handler: the task it runs, known once the lease claim returns it."""

    __slots__ = ("claimed_at", "handing_back", "started", "task", "task_id", "token")

    def __init__(self, task_id: uuid.UUID, token: uuid.UUID) -> None:
        self.task_id = task_id
        self.token = token
        self.task: Task | None = None
        #: True once the task runs under this token (not while its claim waits for admission).
        self.started = False
        #: True while the run hands the task back (its write failing retries the job).
        self.handing_back = False
        #: When the lease claim returned: the job's slot is held from then on, also while
        #: the claim waits for admission.
        self.claimed_at: datetime | None = None


class Executions(UpstreamCalls):
    """The executions of task runs: a base of :class:`engine.tasks.runner.TaskRunner`."""

    def __init__(
        self,
        store: TaskStore,
        events: EventWriter,
        keeper: LeaseKeeper,
        providers: Mapping[str, Provider],
        *,
        simulated: Provider,
        instance_id: str,
        admission: AdmissionGate | None,
        queue_timeout: float | None,
        handback_delay: float,
        observer: TaskObserver = QUIET,
    ) -> None:
        super().__init__(store, events, instance_id=instance_id, observer=observer)
        self.keeper = keeper
        self.providers = providers
        self.simulated = simulated
        #: Asked to start a pending claim (a task of a limited model or group); None where no
        #: claim can be pending (the testing kit's runs without a database).
        self.admission = admission
        self.queue_timeout = queue_timeout
        #: Seconds a job of a task handed back (no provider here) snoozes before any instance
        #: claims it again.
        self.handback_delay = handback_delay
        self._handed_back: OrderedDict[uuid.UUID, None] = OrderedDict()
        #: What each model's provider ``lifespan()`` yielded at service start, by model name
        #: (each task's ``TaskContext.resources``).
        self.resources: dict[str, Any] = {}

    def provider_for(self, task: Task) -> Provider | None:
        """The simulated provider for simulation runs, else the one registered for the model;
        None when this process has none for it (the task is handed back)."""
        if task.simulated:
            return self.simulated
        return self.providers.get(task.model)

    async def _runnable(self, task_id: uuid.UUID, job: Job) -> Task | None:
        """The task if it may still run; None (with a warning if it is gone) if not."""
        task = await self.store.get(task_id)
        if task is None:
            log.warning(
                "task job for a missing task; completing it",
                extra={"event": "task_missing", "task_id": str(task_id), "job_id": job.id},
            )
            return None
        return None if task.is_final else task

    async def _execute(self, run: Run, job: Job, lease: LoadSlot | None) -> None:
        token = run.token
        claimed = await self.store.claim(run.task_id, token)
        run.claimed_at = datetime.now(UTC)
        if claimed is None:
            current = await self._runnable(run.task_id, job)
            now = datetime.now(UTC)
            if current is not None and current.next_run_at > now:
                raise TaskQueued((current.next_run_at - now).total_seconds())
            raise LeaseUnavailable()  # leased elsewhere, final, missing or being cancelled
        task = run.task = claimed
        provider = self.provider_for(task)
        if task.submission_unanswered and not (
            task.submitted_idempotently and (provider is None or submits_idempotently(provider))
        ):
            # A previous execution started the upstream call and never recorded its answer:
            # submitting again could run it twice upstream. Any instance can say so,
            # with or without a provider, and the claim made it running whatever its limits.
            # A call made with an idempotency key is made again below, with the same key (the
            # upstream answers with the job the lost call started); an instance without the
            # provider hands it back to one that has it.
            self._started(run, task)
            await self._finish(
                task,
                token,
                TaskStatus.MANUAL_REVIEW,
                error={
                    "code": "ambiguous_submission",
                    "message": "submitted upstream with no recorded outcome",
                },
            )
            raise ManualReview()
        if provider is None:
            # Checked before admission and before any provider method: this process cannot
            # run the task, so it must not fail it, hold a slot for it, or count an attempt.
            run.handing_back = True
            await self._hand_back(task, token)
            return
        if task.status is TaskStatus.QUEUED:
            # A pending claim: the task's model or group is limited, so it holds the lease but
            # stays queued until the gate starts it (sql/queries/engine_task.sql).
            if self.admission is None:
                raise RuntimeError(f"task {task.id} waits for admission, and no gate admits here")
            outcome = await self.admission.admit(
                task,
                token,
                self.instance_id,
                job_id=job.id,
                lease_ttl=self.store.lease_ttl,
                queue_timeout=self.queue_timeout,
            )
            if isinstance(outcome, Waiting):
                # In line for its scopes, still queued; its job was completed with the wait,
                # and the dispatcher enqueues a new one when there is room.
                self.emit(
                    task,
                    "task.waiting",
                    status="queued",
                    message="waiting for room in " + ", ".join(outcome.scopes),
                    payload={"scopes": list(outcome.scopes)},
                )
                return
            if isinstance(outcome, RateLimited):
                await self.store.requeue(task.id, token, delay=outcome.delay)
                self.emit(
                    task,
                    "task.rate_limited",
                    status="queued",
                    payload={"scope": outcome.scope, "delay": outcome.delay},
                )
                raise TaskQueued(outcome.delay)
            task = run.task = outcome.task
        self._started(run, task)
        execution = Execution(task.id, token)
        execution.provider = provider
        self.keeper.running[task.id] = execution
        context = self.context_for(task, token)
        try:
            with task_context(context):
                with execution.scope:
                    await self._run_provider(task, token, lease, execution, context)
                if execution.lease_lost:
                    raise LeaseUnavailable("the execution lease was lost")
                if execution.scope.cancelled_caught:
                    await self._cancelled(task, token, execution)
        finally:
            if self.keeper.running.get(task.id) is execution:
                del self.keeper.running[task.id]

    def context_for(self, task: Task, token: uuid.UUID) -> TaskContext:
        """The :class:`TaskContext` of one execution of ``task`` (token ``token``)."""
        base = self.hooks_base_url
        return TaskContext(
            task,
            token,
            resources=None if task.simulated else self.resources.get(task.model),
            callback_url=None if base is None else f"{base.rstrip('/')}/hooks/{task.id}",
            sink=self._report_progress,
        )

    def _report_progress(
        self, context: TaskContext, fraction: float, progress: float, message: str | None
    ) -> None:
        task = context.task
        self.events.report_progress(
            ProgressReport(
                task.id,
                context.token,
                context.phase.value,
                progress,
                fraction,
                message,
                task.simulated,
                self.instance_id,
                datetime.now(UTC),
            )
        )

    def _started(self, run: Run, task: Task) -> None:
        run.started = True
        self.observer.task_started(task)
        self.emit(
            task,
            "task.started",
            status="running",
            phase="preparing",
            progress=0.1,
            # claimed_at: when this run's slot was taken (before admission, for a limited task).
            payload={
                "attempt": task.attempts,
                "claimed_at": None if run.claimed_at is None else run.claimed_at.isoformat(),
            },
        )

    async def _hand_back(self, task: Task, token: uuid.UUID) -> None:
        """Give ``task`` back to the queue for an instance that has its provider: lease
        released, the claim's attempt given back, the job snoozed ``handback_delay`` seconds
        (a snooze uses no job attempt either). Raises TaskQueued; returns only if a cancel
        requested meanwhile made the task cancelled instead."""
        # The claim stamps started_at and updated_at with one time only on a first start.
        first_start = task.status is TaskStatus.RUNNING and task.started_at == task.updated_at
        with trio.fail_after(_HAND_BACK_TIMEOUT, shield=True):
            row = await self.store.pool.fetchrow(_HAND_BACK, task.id, token, first_start)
        if row is None:
            raise LeaseUnavailable()  # another execution owns it now
        handed = Task.from_record(row)
        if handed.status is TaskStatus.CANCELLED:
            self.observer.task_finished(TaskStatus.CANCELLED, handed)
            self.emit(
                handed,
                "task.cancelled",
                status="cancelled",
                message=handed.error["message"],
                payload=handed.error,
            )
            return
        if task.id not in self._handed_back:
            # Once per task and instance: a task no instance serves comes back every
            # handback_delay seconds, and its history should say so once, not every time.
            self._handed_back[task.id] = None
            if len(self._handed_back) > _HANDED_BACK_MEMORY:
                self._handed_back.popitem(last=False)
            reason = {"reason": "no_provider", "model": task.model, "instance_id": self.instance_id}
            self.emit(
                handed,
                "task.handed_back",
                status="queued",
                message=f"no provider for model {task.model!r} on this instance; handed back",
                payload=reason,
            )
            log.info(
                "task handed back: no provider for its model here",
                extra={"event": "task_handed_back", "task_id": str(task.id), **reason},
            )
        raise TaskQueued(self.handback_delay)

    async def _cancelled(self, task: Task, token: uuid.UUID, execution: Execution) -> None:
        # Only a user's cancel tells the upstream to stop: after a shutdown or a lost lease the
        # next run resumes polling the same upstream request.
        if execution.provider is not None and execution.upstream_ref is not None:
            with trio.move_on_after(5, shield=True):
                try:
                    await execution.provider.cancel(task, execution.upstream_ref)
                except Exception as exc:
                    log.warning(
                        "upstream cancel failed",
                        extra={"event": "upstream_cancel_failed", "error": repr(exc)},
                    )
        await self._finish(
            task,
            token,
            TaskStatus.CANCELLED,
            error={"code": "cancelled", "message": "cancelled while running"},
        )
