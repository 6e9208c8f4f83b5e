"""Running a task: the Go worker's decision table and a fenced execution (docs/tasks.md).

The job handler, row by row (each row is a test in ``engine_tests/tasks/test_runner.py``):

| #  | condition                                   | job outcome                                  |
|----|---------------------------------------------|----------------------------------------------|
| 1  | reading the task fails                      | error → retried with backoff                 |
| -  | the task does not exist                     | completed, with a warning                    |
| 2  | the task is final                           | completed (no-op run)                        |
| 3  | the worker load refuses a start             | snooze 250–750 ms, no attempt used           |
| 4  | run with a fresh token (the lease claim)    |                                              |
| -  | no provider here for the live task's model  | task handed back (queued, attempt given      |
|    |                                             | back, event task.handed_back); snooze        |
|    |                                             | ``handback_delay`` (5 s), no attempt used    |
| -  | a limited scope is full (admission)         | completed; the task waits in line, queued    |
|    |                                             | (the dispatcher enqueues a new job)          |
| 5  | the run ends (succeeded or failed upstream) | completed                                    |
| 6  | the lease is held by another live token     | completed                                    |
| 7  | ambiguous upstream submission, or the       | completed; task in manual_review             |
|    | provider's own exception in ``submit``      |                                              |
| 7a | as 7, from a provider that submits          | submitted again in the run, same key, up to  |
|    | idempotently (``idempotent_submit``)        | ``ambiguous_resubmits`` times; then as 7     |
| 7b | ``submit`` raises NotSubmitted or           | submitted again in the run after the delay   |
|    | UpstreamBusy (nothing reached the upstream) | (busy: the model is held back); after        |
|    |                                             | ``submit_patience``: failed                  |
| 8  | the task is queued with a delay (not due,   | snooze(delay)                                |
|    | or a scope's rate limit is spent)           |                                              |
| 9  | hard stop (cancelled)                       | task requeued (shielded), job available now  |
| 10 | lock timeout (55P03) before submission      | task requeued in 1 s + event, snooze 1 s     |
| -  | the database connection is lost             | task requeued, snooze 1 s                    |
| -  | a provider method raises its own exception  | task failed, ``provider_exception`` naming   |
|    | (prepare, poll, finalize)                   | the type and the phase; job completed        |
| 11 | anything else                               | task failed (fenced), job completed          |

The job is only the execution ticket: business outcomes live in the task row, and the job is
retried only for infrastructure errors (#1, #9 when the requeue fails, #10 when it errors, a
hand-back whose write fails).

A task is ``running`` only while an execution runs it, and ``attempts`` counts those
executions. The claim of a task whose model or group has a concurrency or rate limit holds the
lease but leaves the task ``queued`` (``sql/queries/engine_task.sql``); the admission gate
starts it (``running``, attempt counted) in the transaction that takes its slots, so waiting
for a slot, or for a scope's lock, is never shown as running. A task this process cannot run
(a live model with no provider here) is handed back before any provider method runs, with the
attempt its claim counted given back, so an instance that serves the model runs it.
"""

from __future__ import annotations

import logging
import random
import uuid
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterator, Mapping
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any, NoReturn, TypeVar

import trio

from engine.db.sqlfiles import QUERIES
from engine.domain.tasks import Task, TaskEvent, TaskPhase, TaskStatus
from engine.errors import (
    ConnectionLost,
    DatabaseError,
    EngineError,
    LeaseUnavailable,
    LockTimeout,
    ManualReview,
)
from engine.providers.base import (
    AmbiguousSubmission,
    NotSubmitted,
    PollResult,
    Provider,
    ProviderError,
    UpstreamBusy,
    callback_poll_interval,
    submits_idempotently,
)
from engine.providers.context import TaskContext, task_context
from engine.providers.throttle import UpstreamThrottle
from engine.queue.job import Job, JobSnooze
from engine.tasks.gates import (
    REFUSED_START_DELAY,
    AdmissionGate,
    LoadGate,
    LoadSlot,
    Phase,
    RateLimited,
    Waiting,
)
from engine.tasks.jobs import TaskRunArgs
from engine.tasks.store import EventWriter, ProgressReport, TaskStore

__all__ = ["LeaseKeeper", "TaskQueued", "TaskRunner"]

log = logging.getLogger(__name__)

_HAND_BACK = QUERIES["task_hand_back"]
#: Seconds the hand-back's write may take (it records a requeue: shielded, bounded).
_HAND_BACK_TIMEOUT = 10.0
#: Tasks whose hand-back this runner remembers, so a task that keeps coming back to an
#: instance without its provider gets one event and one log line from it, not one per snooze.
_HANDED_BACK_MEMORY = 10_000

_T = TypeVar("_T")

#: Share of the lease a fenced write is retried for while the database is away.
WRITE_RETRY_SHARE = 0.5
_WRITE_RETRY_FIRST = 0.05
_WRITE_RETRY_MAX = 2.0


class TaskQueued(Exception):
    """The task must run later; the job snoozes for ``delay`` seconds (row 8)."""

    def __init__(self, delay: float) -> None:
        super().__init__(f"task queued for {delay:.3f} s")
        self.delay = delay


class _ProviderCrash(Exception):
    """A provider method raised an exception of its own (not a ProviderError or an
    AmbiguousSubmission, which are its answers, nor an engine error, which keeps its path)."""

    def __init__(self, phase: str, original: Exception) -> None:
        super().__init__(f"{type(original).__name__} in {phase}: {original}")
        self.phase = phase
        self.original = original

    def error(self, code: str = "provider_exception", note: str = "") -> dict[str, Any]:
        """The task's ``error``: what was raised, and by which provider method."""
        text = str(self.original)
        message = f"{type(self.original).__name__} in {self.phase}" + (f": {text}" if text else "")
        return {
            "code": code,
            "message": message + note,
            "type": type(self.original).__name__,
            "phase": self.phase,
        }


async def _answer_despite_a_stop(
    call: Callable[[], Awaitable[_T]], grace: float
) -> tuple[_T | None, bool]:
    """Await ``call()`` shielded from a stop (a cancellation from outside): once one arrives,
    the call gets ``grace`` more seconds to answer. Returns (its result, False), or (None,
    True) when the stop cut it off. Without a stop the call takes as long as it takes (its
    own timeouts bound it): a slow answer is not a stop.

    The stop's cancellation is level-triggered: a caller that goes on after a result (to record
    it) meets it again at its next unshielded checkpoint."""
    shield = trio.CancelScope(shield=True)
    result: list[_T] = []
    error: list[Exception] = []

    async def watch() -> None:
        try:
            await trio.sleep_forever()
        finally:  # the stop, or the call's end (then nothing waits on the shield any more)
            shield.deadline = min(shield.deadline, trio.current_time() + grace)

    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(watch)
            with shield:
                try:
                    result.append(await call())
                except Exception as exc:  # raised below, as itself rather than in a group
                    error.append(exc)
            nursery.cancel_scope.cancel()
    except BaseException as exc:
        only_cancelled = isinstance(exc, trio.Cancelled) or (
            isinstance(exc, BaseExceptionGroup) and exc.split(trio.Cancelled)[1] is None
        )
        if not only_cancelled:
            raise
        # Only the stop's cancellation, seen by the watcher: the call's outcome comes first.
    if error:
        raise error[0]
    if result:
        return result[0], False
    return None, shield.cancelled_caught


async def _provider_call(phase: str, call: Callable[..., Awaitable[_T]], *args: Any) -> _T:
    """Await ``call(*args)``, a provider method, naming ``phase`` on an exception of its own."""
    try:
        return await call(*args)
    except NotSubmitted as exc:
        if phase == "submit":  # an answer of submit; from any other method, its own error
            raise
        raise _ProviderCrash(phase, exc) from exc
    except (EngineError, ProviderError, AmbiguousSubmission):
        raise
    except Exception as exc:
        raise _ProviderCrash(phase, exc) from exc


def _backoff(first: float, n: int) -> float:
    """Seconds before the ``n``-th new submission: ``first`` doubling, at most 30 s, plus up
    to 50 % jitter so runs held back together do not come back together."""
    base = min(30.0, first * 2.0 ** (n - 1))
    return base * (1.0 + random.random() * 0.5)


class _Run:
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


class _Execution:
    """One running execution: its token and the scope a cancel or a lost lease cancels."""

    def __init__(self, task_id: uuid.UUID, token: uuid.UUID) -> None:
        self.task_id = task_id
        self.token = token
        self.scope = trio.CancelScope()
        self.cancel_requested = False
        self.lease_lost = False
        #: The upstream reference once known, and who to tell if the task is cancelled.
        self.upstream_ref: str | None = None
        self.provider: Provider | None = None
        self._guards: list[trio.CancelScope] = []
        #: Set when a callback for the task was recorded (or may have been): look again.
        self.woken = trio.Event()

    def wake(self) -> None:
        """Cut the current wait between polls short: a callback may be waiting."""
        self.woken.set()

    async def sleep_until(self, deadline: float) -> None:
        """Wait until ``deadline`` (trio time) or until woken, whichever is first."""
        with trio.move_on_at(deadline):
            await self.woken.wait()
        if self.woken.is_set():
            self.woken = trio.Event()

    def cancel(self, reason: str) -> None:
        """Cancel the execution, including a shielded upstream call in progress."""
        self.scope.cancel(reason=reason)
        for guard in self._guards:
            guard.cancel(reason=reason)

    @contextmanager
    def cancel_guard(self) -> Iterator[None]:
        """A scope inside a shield that this execution's own cancel still reaches."""
        with trio.CancelScope() as guard:
            self._guards.append(guard)
            try:
                if self.scope.cancel_called:
                    guard.cancel()
                yield
            finally:
                self._guards.remove(guard)


class LeaseKeeper:
    """Renews the leases of every execution in this process, one statement per interval.

    A lease that could not be renewed is lost: another execution may own the task now, so the
    stale one is cancelled at once. A renewal that reports a cancel request cancels the
    execution too (the fallback when the NOTIFY was missed).
    """

    def __init__(self, store: TaskStore, interval: float) -> None:
        self.store = store
        self.interval = interval
        self.running: dict[uuid.UUID, _Execution] = {}

    def cancel(self, task_id: uuid.UUID) -> bool:
        """Cancel the execution of ``task_id`` in this process, if it runs here."""
        execution = self.running.get(task_id)
        if execution is None:
            return False
        execution.cancel_requested = True
        execution.cancel("task cancelled")
        return True

    def wake(self, task_id: uuid.UUID | None) -> bool:
        """Wake the execution of ``task_id`` in this process (every execution for None) from
        its wait between polls: a callback was recorded for it. False if none runs here."""
        if task_id is None:
            for each in list(self.running.values()):
                each.wake()
            return bool(self.running)
        execution = self.running.get(task_id)
        if execution is None:
            return False
        execution.wake()
        return True

    async def run_once(self) -> None:
        """Renew every lease once."""
        executions = list(self.running.values())
        held = await self.store.renew([(e.task_id, e.token) for e in executions])
        for execution in executions:
            if execution.task_id not in held:
                if self.running.get(execution.task_id) is execution:
                    execution.lease_lost = True
                    execution.cancel("execution lease lost")
            elif held[execution.task_id]:
                self.cancel(execution.task_id)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Renew every ``interval`` until cancelled; a failed round is logged."""
        task_status.started()
        while True:
            await trio.sleep(self.interval)
            try:
                await self.run_once()
            except Exception as exc:
                log.warning(
                    "lease renewal failed", extra={"event": "lease_renew_failed", "error": str(exc)}
                )


class TaskRunner:
    """The job handler for task jobs; see the module docstring."""

    def __init__(
        self,
        store: TaskStore,
        events: EventWriter,
        keeper: LeaseKeeper,
        providers: Mapping[str, Provider],
        *,
        simulated: Provider,
        instance_id: str,
        load: LoadGate | None = None,
        lock_timeout_delay: float = 1.0,
        queue_timeout: float | None = None,
        admission: AdmissionGate | None = None,
        load_retry_delay: Callable[[str], float] | None = None,
        handback_delay: float = 5.0,
    ) -> None:
        self.store = store
        self.events = events
        self.keeper = keeper
        self.providers = providers
        self.simulated = simulated
        self.instance_id = instance_id
        self.load = load
        self.lock_timeout_delay = lock_timeout_delay
        self.queue_timeout = queue_timeout
        self.load_retry_delay = load_retry_delay
        #: Seconds a job of a task handed back (no provider here) snoozes before any instance
        #: claims it again.
        self.handback_delay = handback_delay
        self._handed_back: OrderedDict[uuid.UUID, None] = OrderedDict()
        #: Seconds a stop waits for an upstream submission already under way to answer.
        self.submit_grace = 10.0
        #: Seconds a run keeps submitting again after NotSubmitted / UpstreamBusy answers (the
        #: request never reached the upstream) before the task fails ``upstream_unavailable``.
        self.submit_patience = 600.0
        #: How many times a run submits again, with the same idempotency key, after an
        #: ambiguous answer from a provider that submits idempotently; then manual review.
        self.ambiguous_resubmits = 3
        #: First backoff in seconds between those submissions (doubled each time, capped at
        #: 30 s, with up to 50 % jitter).
        self.resubmit_backoff = 0.5
        #: Models whose upstream answered "busy" (429, 503): their submissions wait here.
        self.upstream_busy = UpstreamThrottle()
        #: Asked to start a pending claim (a task of a limited model or group); None where no
        #: claim can be pending (the testing kit's runs without a database).
        self.admission = admission
        #: Called with each outcome this process records and the task it ended, or None when
        #: the run failed before its claim returned the task (metrics count them).
        self.on_finished: Callable[[TaskStatus, Task | None], None] | None = None
        #: Called with (phase, seconds, model) as each phase of an execution ends (metrics).
        self.on_phase: Callable[[str, float, str], None] | None = None
        #: Called with the task each time an execution starts running it (metrics).
        self.on_started: Callable[[Task], None] | None = None
        #: Where this process serves ``POST /hooks/<task id>`` (``http://host:port``), or None
        #: when it serves no hooks: then providers' callbacks are not waited for, and every
        #: model polls at its ``poll_interval``.
        self.hooks_base_url: str | None = None
        #: What each model's provider ``lifespan()`` yielded at service start, by model name
        #: (each task's ``TaskContext.resources``).
        self.resources: dict[str, Any] = {}

    def provider_for(self, task: Task) -> Provider | None:
        """The simulated provider for simulation runs, else the one registered for the model;
        None when this process has none for it (the task is handed back)."""
        if task.simulated:
            return self.simulated
        return self.providers.get(task.model)

    def emit(self, task: Task, type_: str, **fields: Any) -> None:
        """Append an event to ``task``'s history (buffered)."""
        self.events.emit(
            TaskEvent(
                task.id,
                type_,
                simulated=task.simulated,
                instance_id=self.instance_id,
                at=datetime.now(UTC),
                **fields,
            )
        )

    # ---- the decision table -----------------------------------------------------------------

    async def work(self, job: Job, args: TaskRunArgs) -> None:
        """Handle one task job, following the decision table in the module docstring.

        The lease claim is the first statement and also the read: only when it finds the task
        not runnable does a second read say why (missing, final, not due, leased elsewhere).
        """
        task_id = uuid.UUID(args.task_id)
        lease: LoadSlot | None = None
        if self.load is not None:
            lease = self.load.try_start()
            if lease is None:
                if await self._runnable(task_id, job) is None:  # 1, -, 2
                    return
                raise JobSnooze(self._refused_start_delay(task_id))  # 3
        run = _Run(task_id, uuid.uuid4())
        try:
            await self._execute(run, job, lease)  # 4, 5
        except LeaseUnavailable:  # 6
            return
        except ManualReview as exc:  # 7
            crash = exc.__cause__ if isinstance(exc.__cause__, _ProviderCrash) else None
            log.warning(
                "moved to manual review after ambiguous upstream submission",
                extra={"event": "task_manual_review", "task_id": str(task_id)},
                exc_info=None if crash is None else crash.original,
            )
            return
        except TaskQueued as queued:  # 8
            raise JobSnooze(queued.delay) from None
        except LockTimeout as exc:  # 10
            status = await self.store.requeue(
                task_id, run.token, delay=self.lock_timeout_delay, only_before_submission=True
            )
            if status is None and await self._still_queued(task_id):
                # The lock timed out while claiming: the task is untouched and still queued,
                # which is the outcome #10 wants; only the job has to wait.
                status = TaskStatus.QUEUED
            if status is TaskStatus.QUEUED:
                task = run.task or await self.store.get_now(task_id)
                if task is not None:
                    self.emit(
                        task,
                        "task.queued",
                        status="queued",
                        phase="database_lock_timeout",
                        progress=0.2,
                        message="async task queued after database lock timeout",
                        payload={"code": "database_lock_timeout"},
                    )
                log.warning(
                    "task requeued after a database lock timeout",
                    extra={"event": "task_lock_timeout", "task_id": str(task_id)},
                )
                raise JobSnooze(self.lock_timeout_delay) from None
            await self._fail(run, exc)  # 10 → 11
        except ConnectionLost as exc:
            # The database went away under the run for longer than the writes' retries (a
            # lost connection, a restart): that says nothing about the task, so it goes back
            # to the queue rather than failing, as soon as the database answers again, so its
            # lease and scope slots are not held until they expire. If the requeue fails too,
            # the error is raised and the job retried; recovery requeues the task once its
            # lease runs out.
            status = await self._durably("requeue", lambda: self.store.requeue(task_id, run.token))
            log.warning(
                "database error during a run; task requeued",
                extra={
                    "event": "task_requeued_db_error",
                    "task_id": str(task_id),
                    "error": str(exc),
                    "status": None if status is None else status.value,
                },
            )
            raise JobSnooze(self.lock_timeout_delay) from exc
        except _ProviderCrash as crash:
            await self._fail(run, crash.original, error=crash.error())
        except Exception as exc:
            if run.task is None or run.handing_back:
                # 1: the claim (our read) failed, or the write handing the task back did: the
                # job is retried with backoff (the task is not ours to fail).
                raise
            await self._fail(run, exc)  # 11
        except BaseException:  # 9: a hard stop; requeue so another worker takes it at once
            status = await self.store.requeue(task_id, run.token)
            # A claim stopped while it waited for admission never ran: nothing to tell.
            if status is not None and run.task is not None and run.started:
                self.emit(
                    run.task,
                    "task.requeued",
                    status=status.value,
                    message="interrupted by shutdown",
                )
            raise
        finally:
            if lease is not None:
                lease.release()

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

    def _refused_start_delay(self, task_id: uuid.UUID) -> float:
        rule = self.load_retry_delay
        return REFUSED_START_DELAY if rule is None else rule(str(task_id))

    async def _still_queued(self, task_id: uuid.UUID) -> bool:
        current = await self.store.get_now(task_id)
        return current is not None and current.status is TaskStatus.QUEUED

    async def _fail(
        self, run: _Run, exc: BaseException, *, error: dict[str, Any] | None = None
    ) -> None:
        if error is None:
            error = {"code": "internal_error", "message": str(exc) or type(exc).__name__}
        log.warning(
            "river async task completed with failure",
            extra={
                "event": "task_failed",
                "task_id": str(run.task_id),
                "error": repr(exc),
                "code": error["code"],
                **({"phase": error["phase"]} if "phase" in error else {}),
            },
            exc_info=exc,
        )
        if await self.store.finish(run.task_id, run.token, TaskStatus.FAILED, error=error):
            self.events.forget_phase(run.task_id)
            if self.on_finished is not None:
                self.on_finished(TaskStatus.FAILED, run.task)
            if run.task is not None:
                self.emit(
                    run.task,
                    "task.failed",
                    status="failed",
                    message=error["message"],
                    payload=error,
                )

    # ---- one execution ------------------------------------------------------------------------

    async def _execute(self, run: _Run, job: Job, lease: LoadSlot | None) -> None:
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
        if (
            task.submitted_at is not None
            and task.upstream_ref is None
            and not (
                task.submitted_idempotently
                and (provider is None or submits_idempotently(provider))
            )
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
        execution = _Execution(task.id, token)
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

    def _started(self, run: _Run, task: Task) -> None:
        run.started = True
        if self.on_started is not None:
            self.on_started(task)
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
            if self.on_finished is not None:
                self.on_finished(TaskStatus.CANCELLED, handed)
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

    async def _run_provider(
        self,
        task: Task,
        token: uuid.UUID,
        lease: LoadSlot | None,
        execution: _Execution,
        context: TaskContext,
    ) -> None:
        provider = execution.provider
        assert provider is not None  # set by _execute
        ref: str | None = task.upstream_ref
        resumed = ref is not None
        phase_started = trio.current_time()
        try:
            if ref is None:
                prepared = await _provider_call("prepare", provider.prepare, task)
                phase_started = self._phase_done("preparing", phase_started, task.model)
                context.phase = TaskPhase.WAITING_UPSTREAM
                ref = await self._submit(task, token, lease, execution, provider, prepared)
                execution.upstream_ref = ref
                # The reference lives only in this process until it is written: a database
                # blip here must not turn a known submission into a lost one.
                upstream = ref
                if not await self._durably(
                    "record_upstream",
                    lambda: self.store.record_upstream(task.id, token, upstream),
                ):
                    raise LeaseUnavailable()
                self.emit(
                    task,
                    "task.submitted",
                    status="running",
                    phase="waiting_upstream",
                    progress=0.4,
                    payload={"upstream_ref": ref},
                )
            else:
                execution.upstream_ref = ref
                context.phase = TaskPhase.WAITING_UPSTREAM
                await self._enter(lease, Phase.WAITING_UPSTREAM)
                self.emit(
                    task,
                    "task.resumed",
                    status="running",
                    phase="waiting_upstream",
                    payload={"upstream_ref": ref},
                )
            polled = await self._wait_upstream(task, ref, provider, execution, context, resumed)
            phase_started = self._phase_done("waiting_upstream", phase_started, task.model)
            if polled.error is not None:
                raise ProviderError(polled.error, code="upstream_failed")
            context.phase = TaskPhase.FINALIZING
            await self._enter(lease, Phase.FINALIZING)
            # Informational, so buffered with the events rather than awaited (fenced: a write
            # that lands after the finish changes nothing).
            self.events.set_phase(task.id, token, TaskPhase.FINALIZING, 0.9)
            result = await _provider_call("finalize", provider.finalize, task, polled.result)
            self._phase_done("finalizing", phase_started, task.model)
        except ProviderError as exc:
            await self._finish(
                task, token, TaskStatus.FAILED, error={"code": exc.code, "message": str(exc)}
            )
            return
        await self._finish(task, token, TaskStatus.SUCCEEDED, result=result)

    async def _wait_upstream(
        self,
        task: Task,
        ref: str,
        provider: Provider,
        execution: _Execution,
        context: TaskContext,
        resumed: bool,
    ) -> PollResult:
        """Poll until the upstream says done, or a recorded callback does.

        A provider whose upstream calls back (``callback_poll_interval``), in a process that
        serves the hooks, is polled only every ``callback_poll_interval`` seconds (first after
        that long, or at once for a resumed run, whose callback may have come while nobody
        ran it): a lost callback never strands the task. Meanwhile the run sleeps until its
        next poll or until the callback's NOTIFY wakes it, and reads the callbacks recorded
        for the task. Whichever answers first, the outcome goes through the same fenced
        finish. Progress in a callback that is not final is reported as the provider's (a
        poll's progress is the provider's to report, with ``current_task_context()``).
        """
        fallback = callback_poll_interval(provider) if self.hooks_base_url is not None else None
        interval = provider.poll_interval if fallback is None else fallback
        now = trio.current_time()
        next_poll = now if fallback is None or resumed else now + interval
        while True:
            if fallback is not None:
                stored = await self.store.latest_callback(task.id)
                # A callback about another upstream job (an earlier submission's) says nothing.
                if stored is not None and stored.upstream_id in (None, ref):
                    if stored.result.done:
                        return stored.result
                    if stored.result.progress is not None:
                        context.report_progress(stored.result.progress)
            if trio.current_time() >= next_poll:
                polled = await _provider_call("poll", provider.poll, task, ref)
                if polled.done:
                    return polled
                next_poll = trio.current_time() + interval
            await execution.sleep_until(next_poll)

    async def _submit(
        self,
        task: Task,
        token: uuid.UUID,
        lease: LoadSlot | None,
        execution: _Execution,
        provider: Provider,
        prepared: Any,
    ) -> str:
        """Make the upstream call and return the upstream's reference.

        ``submitted_at`` is recorded before each call. ``NotSubmitted`` (nothing reached the
        upstream) submits again after its ``retry_after`` or a backoff, for up to
        ``submit_patience`` seconds, then fails the task (``upstream_unavailable``);
        ``UpstreamBusy`` also holds back every submission of the model in this process for
        that long (``upstream_busy``). An ambiguous answer (``AmbiguousSubmission``, or the
        provider's own exception) sends the task to manual review, unless the provider submits
        idempotently: then it is submitted again, with the same key, up to
        ``ambiguous_resubmits`` times first (never while the run is being stopped).
        """
        patience_ends = trio.current_time() + self.submit_patience
        keyed = submits_idempotently(provider)  # recorded with each call: see task_requeue_many
        refusals = resubmits = 0
        while True:
            await self._enter(lease, Phase.WAITING_UPSTREAM)
            pause = 0.0
            # Entered before submitted_at is written: a run stopped while the model is held
            # back goes back to the queue as if it had never tried.
            async with self.upstream_busy.submission(task.model) as gate:
                if not await self._durably(
                    "mark_submitting",
                    lambda: self.store.mark_submitting(task.id, token, idempotently=keyed),
                ):
                    raise LeaseUnavailable()
                stopping = False
                try:
                    # A stop that arrives mid-call waits for the answer (bounded): cut off
                    # here, the submission would be ambiguous and the task would need a human.
                    # A user's cancel still interrupts it (the execution's own scope).
                    async def call() -> str | None:
                        answer: str | None = None  # stays None if the user's cancel cut it
                        with execution.cancel_guard():
                            answer = await _provider_call(
                                "submit", provider.submit, task, prepared
                            )
                        return answer

                    ref, cut_off = await _answer_despite_a_stop(call, self.submit_grace)
                    if cut_off:
                        stopping = True
                        raise AmbiguousSubmission(
                            f"no answer from the upstream within {self.submit_grace} s of a stop"
                        )
                    if ref is None:
                        # The user's cancel cut the call short: deliver it (the execution
                        # scope is cancelled, so this checkpoint raises).
                        await trio.lowlevel.checkpoint()
                        raise AmbiguousSubmission("the upstream call was cut short")
                    return ref
                except NotSubmitted as refused:
                    # Nothing reached the upstream: say so, so that a requeue or a recovery
                    # before the next call does not take the task for an ambiguous one.
                    if not await self._durably(
                        "unmark_submitting",
                        lambda: self.store.unmark_submitting(task.id, token),
                    ):
                        raise LeaseUnavailable() from refused
                    refusals += 1
                    busy = isinstance(refused, UpstreamBusy)
                    delay = refused.retry_after
                    if delay is None:
                        delay = _backoff(self.resubmit_backoff, refusals)
                    if trio.current_time() + delay > patience_ends:
                        raise ProviderError(
                            f"the upstream did not take the request for "
                            f"{self.submit_patience:g} s: {refused}",
                            code="upstream_unavailable",
                        ) from refused
                    if busy:
                        gate.busy(delay)  # the next submission waits for the hold
                    else:
                        pause = delay
                    self.emit(
                        task,
                        "task.not_submitted",
                        status="running",
                        phase="waiting_upstream",
                        message=str(refused),
                        payload={"busy": busy, "delay": delay, "refusals": refusals},
                    )
                except (AmbiguousSubmission, _ProviderCrash) as exc:
                    if (
                        stopping
                        or resubmits >= self.ambiguous_resubmits
                        or not submits_idempotently(provider)
                    ):
                        await self._manual_review_after_submit(task, token, exc)
                    # The upstream recognises the repeat by its idempotency key: the second
                    # call returns the job of the first if it had been accepted.
                    resubmits += 1
                    pause = _backoff(self.resubmit_backoff, resubmits)
                    self.emit(
                        task,
                        "task.resubmitting",
                        status="running",
                        phase="waiting_upstream",
                        message=str(exc),
                        payload={"resubmits": resubmits, "delay": pause},
                    )
                    log.info(
                        "ambiguous submission; submitting again with the same idempotency key",
                        extra={
                            "event": "task_resubmitting",
                            "task_id": str(task.id),
                            "resubmits": resubmits,
                        },
                    )
            await trio.sleep(pause)  # outside the gate: a probe's wait holds nobody else

    async def _manual_review_after_submit(
        self, task: Task, token: uuid.UUID, exc: AmbiguousSubmission | _ProviderCrash
    ) -> NoReturn:
        """Record an ambiguous submission: manual review (row 7)."""
        if isinstance(exc, _ProviderCrash):
            # Not a refusal (that is a ProviderError): the call may have reached the upstream
            # before it raised, e.g. while reading the answer. submitted_at is recorded, so
            # this is the ambiguous case, as if the answer were lost: manual review, never a
            # resubmission and never "failed" (which would say nothing runs upstream).
            error = exc.error("ambiguous_submission", " (the upstream may have received it)")
        else:
            error = {"code": "ambiguous_submission", "message": str(exc)}
        await self._finish(task, token, TaskStatus.MANUAL_REVIEW, error=error)
        raise ManualReview() from exc

    def _phase_done(self, phase: str, started: float, model: str) -> float:
        now = trio.current_time()
        if self.on_phase is not None:
            self.on_phase(phase, now - started, model)
        return now

    async def _enter(self, lease: LoadSlot | None, phase: Phase) -> None:
        if lease is not None:
            await lease.enter(phase)

    async def _durably(self, what: str, write: Callable[[], Awaitable[_T]]) -> _T:
        """Run a fenced write, trying it again while the database is unavailable.

        Only errors that say the database was away or busy (``retryable``: a lost connection,
        a restart, a lock or statement timeout) are retried, with backoff, for as long as
        the run's lease would still hold (``WRITE_RETRY_SHARE`` of the lease). The token is
        kept meanwhile: once the database is back the write lands, or finds the lease taken
        over (False) and changes nothing.
        """
        deadline = trio.current_time() + self.store.lease_ttl * WRITE_RETRY_SHARE
        delay = _WRITE_RETRY_FIRST
        while True:
            try:
                return await write()
            except DatabaseError as exc:
                if not exc.retryable or trio.current_time() + delay > deadline:
                    raise
                log.warning(
                    "task write failed; retrying while the lease holds",
                    extra={"event": "task_write_retry", "write": what, "error": str(exc)},
                )
            await trio.sleep(delay)
            delay = min(delay * 2, _WRITE_RETRY_MAX)

    async def _finish(
        self,
        task: Task,
        token: uuid.UUID,
        status: TaskStatus,
        *,
        result: Any = None,
        error: dict[str, Any] | None = None,
    ) -> None:
        finished = await self._durably(
            "finish",
            lambda: self.store.finish(task.id, token, status, result=result, error=error),
        )
        if not finished:
            raise LeaseUnavailable()
        self.events.forget_phase(task.id)
        if self.on_finished is not None:
            self.on_finished(status, task)
        self.emit(
            task,
            f"task.{status.value}",
            status=status.value,
            progress=1.0 if status is TaskStatus.SUCCEEDED else None,
            message=None if error is None else error.get("message"),
            payload={} if error is None else error,
        )

    async def _cancelled(self, task: Task, token: uuid.UUID, execution: _Execution) -> None:
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
