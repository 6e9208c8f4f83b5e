"""Running a task: the decision table and a fenced execution (docs/tasks.md).

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

The handler is split by what each part does: this module decides (the table above, and how a
run that failed is recorded), :mod:`engine.tasks.execution` claims, admits, hands back and runs
one execution, :mod:`engine.tasks.upstream` makes the provider calls, :mod:`engine.tasks.fenced`
writes, and :mod:`engine.tasks.leases` renews the leases. The load and admission gates it asks
(:mod:`engine.tasks.gates`) are given to it: the service passes the load controller and the
scope admission.
"""

from __future__ import annotations

import logging
import random
import uuid
from collections.abc import Callable, Mapping
from typing import Any

from engine.db.bridge import uuid_of
from engine.domain.tasks import TaskStatus
from engine.errors import ConnectionLost, LeaseUnavailable, LockTimeout, ManualReview
from engine.providers.base import Provider
from engine.queue.job import Job, JobSnooze
from engine.tasks.execution import Executions, Run, TaskQueued
from engine.tasks.gates import REFUSED_START_DELAY, AdmissionGate, LoadGate, LoadSlot
from engine.tasks.jobs import TaskRunArgs
from engine.tasks.leases import LeaseKeeper
from engine.tasks.observe import QUIET, TaskObserver
from engine.tasks.store import EventWriter, TaskStore
from engine.tasks.upstream import ProviderCrash

__all__ = ["TaskRunner"]

log = logging.getLogger(__name__)


class TaskRunner(Executions):
    """The job handler for task jobs; see the module docstring.

    ``load`` is the process's load gate (None: every start is let through) and
    ``load_retry_delay`` the seconds a job it refused snoozes, by task id (None: a fixed
    ``REFUSED_START_DELAY``); ``admission`` starts the pending claims of limited tasks.
    ``observer`` is told of every start, phase and outcome, from the first
    (:mod:`engine.tasks.observe`; nothing observes the runner without one).
    """

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
        observer: TaskObserver = QUIET,
    ) -> None:
        super().__init__(
            store,
            events,
            keeper,
            providers,
            simulated=simulated,
            instance_id=instance_id,
            admission=admission,
            queue_timeout=queue_timeout,
            handback_delay=handback_delay,
            observer=observer,
        )
        self.load = load
        self.lock_timeout_delay = lock_timeout_delay
        self.load_retry_delay = load_retry_delay

    # ---- the decision table -----------------------------------------------------------------

    async def work(self, job: Job, args: TaskRunArgs) -> None:
        """Handle one task job, following the decision table in the module docstring.

        The lease claim is the first statement and also the read: only when it finds the task
        not runnable does a second read say why (missing, final, not due, leased elsewhere).
        """
        task_id = uuid_of(args.task_id)
        lease: LoadSlot | None = None
        if self.load is not None:
            lease = self.load.try_start()
            if lease is None:
                if await self._runnable(task_id, job) is None:  # 1, -, 2
                    return
                raise JobSnooze(self._refused_start_delay(task_id))  # 3
        # A token only has to differ from the task's other executions' tokens: 128 bits of the
        # process's random generator (reseeded in a forked child) are that, at a fifth of
        # uuid4's cost.
        run = Run(task_id, uuid_of(random.getrandbits(128).to_bytes(16, "big")))
        try:
            await self._execute(run, job, lease)  # 4, 5
        except LeaseUnavailable:  # 6
            return
        except ManualReview as exc:  # 7
            crash = exc.__cause__ if isinstance(exc.__cause__, ProviderCrash) else None
            log.warning(
                "moved to manual review after ambiguous upstream submission",
                extra={"event": "task_manual_review", "task_id": str(task_id)},
                exc_info=None if crash is None else crash.original,
            )
            return
        except TaskQueued as queued:  # 8
            raise JobSnooze(queued.delay) from None
        except LockTimeout as exc:  # 10
            # A lock that timed out while claiming left the task untouched: no token of this
            # run was stored, so a requeue would find nothing (and wait for the same lock).
            status = None
            if run.task is not None:
                status = await self.store.requeue(
                    task_id, run.token, delay=self.lock_timeout_delay, only_before_submission=True
                )
            if status is None and await self._still_queued(task_id):
                # Untouched and still queued, which is the outcome #10 wants; only the job
                # has to wait.
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
        except ProviderCrash as crash:
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

    def _refused_start_delay(self, task_id: uuid.UUID) -> float:
        rule = self.load_retry_delay
        return REFUSED_START_DELAY if rule is None else rule(str(task_id))

    async def _still_queued(self, task_id: uuid.UUID) -> bool:
        current = await self.store.get_now(task_id)
        return current is not None and current.status is TaskStatus.QUEUED

    async def _fail(
        self, run: Run, exc: BaseException, *, error: dict[str, Any] | None = None
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
            self.observer.task_finished(TaskStatus.FAILED, run.task)
            if run.task is not None:
                self.emit(
                    run.task,
                    "task.failed",
                    status="failed",
                    message=error["message"],
                    payload=error,
                )
