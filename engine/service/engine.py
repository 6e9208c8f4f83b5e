"""The open engine: what :func:`engine.open` yields and :func:`engine.serve` hands back.

An :class:`Engine` submits tasks, waits for them, cancels and reads them; the services that
run them live in the one service tree of :mod:`engine.service.root`.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any, overload

import trio

from engine.capacity.room import ShutdownPolicy
from engine.config import EngineConfig
from engine.db.bridge import Connection, Statements
from engine.db.channels import CATALOG, TASK_CANCEL
from engine.db.database import Database, DatabaseUrls
from engine.db.sqlfiles import QUERIES
from engine.domain.tasks import Task, TaskEvent, TaskRequest, TaskStatus
from engine.errors import TaskNotFound
from engine.load.controller import LoadController
from engine.metrics import Metrics
from engine.providers.base import Provider
from engine.queue.client import QueueClient
from engine.service.health import Health
from engine.tasks.leases import LeaseKeeper
from engine.tasks.notices import TaskNotices
from engine.tasks.review import Decision, resolve_task, retry_task
from engine.tasks.runner import TaskRunner
from engine.tasks.store import EventWriter, TaskStore
from engine.tasks.submit import submit_tasks

__all__ = ["Engine"]

log = logging.getLogger(__name__)

#: Seconds between re-reads in :meth:`Engine.wait` when no notification arrives.
WAIT_POLL_INTERVAL = 2.0

_CANCEL_QUEUED = QUERIES["task_cancel_queued"]
_REQUEST_CANCEL = QUERIES["task_request_cancel"]
_LIST = QUERIES["task_list"]
_EVENTS = QUERIES["task_event_list"]
_COUNTS = QUERIES["task_count_by_status"]
_MODEL_UPSERT = QUERIES["model_upsert"]
_GROUP_UPSERT = QUERIES["group_upsert"]


def _check_interval(rate_interval: float) -> None:
    if not 0 < rate_interval < float("inf"):
        raise ValueError(f"rate_interval must be a positive number of seconds: {rate_interval!r}")


class Engine:
    """An open engine: submit tasks, wait for them, cancel them, read them."""

    def __init__(
        self,
        config: EngineConfig,
        db: Database,
        queue: QueueClient,
        store: TaskStore,
        notices: TaskNotices,
        keeper: LeaseKeeper,
        runner: TaskRunner,
        *,
        event_writer: EventWriter,
        urls: DatabaseUrls,
        metrics: Metrics,
        health: Health,
        policy: ShutdownPolicy,
        load: LoadController | None = None,
    ) -> None:
        self.config = config
        self.db = db
        self.queue = queue
        self.store = store
        self.notices = notices
        self.keeper = keeper
        self.runner = runner
        self.event_writer = event_writer
        #: Where the databases are (for display: redact before printing).
        self.urls = urls
        #: The process's metrics (collected always, served when ``metrics.enabled``).
        self.metrics = metrics
        self.health = health
        #: How generations stop when the engine stops (see :meth:`stop_draining`).
        self.policy = policy
        self.load = load
        #: Where the metrics are served (None when ``metrics.enabled`` is off).
        self.metrics_url: str | None = None
        #: Where the dashboard is served (None when ``dashboard.enabled`` is off).
        self.dashboard_url: str | None = None

    @property
    def simulated(self) -> Provider:
        """The provider of simulation tasks."""
        return self.runner.simulated

    @property
    def ready(self) -> bool:
        """True while the engine is up and every supervised service runs (``/readyz``)."""
        return self.health.ready()

    def stop_draining(self) -> None:
        """Cut a shutdown's drain short: tasks still running are requeued at once (the
        service's second SIGINT or SIGTERM). Before a stop it only arms that for the stop."""
        self.policy.hurry()

    @property
    def instance_id(self) -> str:
        """This process's instance id (``host:pid:nanos``)."""
        return self.queue.instance_id

    # ---- submitting ----------------------------------------------------------------------

    @overload
    async def submit(self, request: TaskRequest) -> uuid.UUID: ...

    @overload
    async def submit(self, request: Sequence[TaskRequest]) -> list[uuid.UUID]: ...

    async def submit(
        self, request: TaskRequest | Sequence[TaskRequest]
    ) -> uuid.UUID | list[uuid.UUID]:
        """Validate and store one task or many, atomically; return their ids.

        One round trip: the tasks, their jobs and their first events are written by a single
        statement, its own transaction (:func:`~engine.tasks.submit.submit_tasks`).

        Raises:
            InvalidTask: any request was invalid; nothing was stored.
        """
        requests = [request] if isinstance(request, TaskRequest) else list(request)
        # Interrupted in flight, the server may still run it: the connection goes back once
        # the server has answered the cancel, or is dropped after enqueue_rollback_timeout.
        await self._store(
            self.db.tasks.bounded(self.config.worker.enqueue_rollback_timeout), requests
        )
        ids = [r.id for r in requests]
        return ids[0] if isinstance(request, TaskRequest) else ids

    async def submit_tx(self, conn: Connection, requests: Sequence[TaskRequest]) -> None:
        """Store ``requests`` inside the caller's transaction on ``conn`` (a connection to
        the tasks database): the tasks exist, and run, only if that transaction commits.

        Raises:
            InvalidTask: any request was invalid; nothing was stored, and the caller's
                transaction can go on.
        """
        # One statement either way: without a transaction open on conn it is its own.
        await self._store(conn, requests)

    async def _store(self, on: Statements, requests: Sequence[TaskRequest]) -> None:
        await submit_tasks(
            on,
            requests,
            queue=self.config.queue,
            tasks=self.config.tasks,
            instance_id=self.instance_id,
            notify_channel=self.queue.channels.insert,
        )

    # ---- reading -------------------------------------------------------------------------

    async def get(self, task_id: uuid.UUID) -> Task | None:
        """The task, or None."""
        return await self.store.get_now(task_id)

    async def wait(self, task_id: uuid.UUID, timeout: float | None = None) -> Task:
        """Wait until the task is final (woken by NOTIFY, not polling) and return it.

        Raises:
            TaskNotFound: no such task.
            trio.TooSlowError: ``timeout`` seconds passed first.
        """
        with trio.fail_after(timeout) if timeout is not None else trio.CancelScope():
            while True:
                event = self.notices.waiter(task_id)
                try:
                    task = await self.store.get_now(task_id)
                    if task is None:
                        raise TaskNotFound(f"no task {task_id}")
                    if task.is_final:
                        return task
                    # NOTIFY wakes us at once; the timeout is the fallback where notifications
                    # do not arrive (PgBouncer in transaction mode drops LISTEN).
                    with trio.move_on_after(WAIT_POLL_INTERVAL):
                        await event.wait()
                finally:
                    self.notices.forget(task_id, event)

    async def list_tasks(
        self,
        *,
        status: TaskStatus | None = None,
        model: str | None = None,
        tenant_id: str | None = None,
        limit: int = 100,
        before: datetime | None = None,
    ) -> list[Task]:
        """Tasks newest first; ``before`` pages (pass the last task's ``created_at``)."""
        rows = await self.db.tasks.fetch(
            _LIST, status.value if status else None, model, tenant_id, limit, before
        )
        return [Task.from_record(r) for r in rows]

    async def counts(self) -> dict[str, int]:
        """Tasks per status."""
        return {r["status"]: int(r["n"]) for r in await self.db.tasks.fetch(_COUNTS)}

    async def events(self, task_id: uuid.UUID) -> list[TaskEvent]:
        """The task's history, oldest first (events are written in batches: the last ones
        may take ~50 ms to appear)."""
        rows = await self.db.tasks.fetch(_EVENTS, task_id)
        return [
            TaskEvent(
                task_id=r["task_id"],
                type=r["type"],
                status=r["status"],
                phase=r["phase"],
                progress=r["progress"],
                message=r["message"],
                payload=r["payload"],
                simulated=r["simulated"],
                instance_id=r["instance_id"],
                at=r["at"],
            )
            for r in rows
        ]

    # ---- control -------------------------------------------------------------------------

    async def cancel(self, task_id: uuid.UUID) -> Task:
        """Cancel a task: a queued one at once; a running one is told to stop (its provider
        is asked to cancel upstream) and ends ``cancelled``. A final task is left as it is.

        Raises:
            TaskNotFound: no such task.
        """
        row = await self.db.tasks.fetchrow(_CANCEL_QUEUED, task_id)
        if row is not None:
            task = Task.from_record(row)
            if task.river_job_id is not None:
                await self.queue.cancel(task.river_job_id)
            return task
        requested = await self.db.tasks.fetchrow(_REQUEST_CANCEL, task_id, TASK_CANCEL)
        if requested is not None:
            self.keeper.cancel(task_id)
        current = await self.get(task_id)
        if current is None:
            raise TaskNotFound(f"no task {task_id}")
        return current

    async def retry(self, task_id: uuid.UUID) -> Task:
        """Run a failed, cancelled or manual_review task again (:mod:`engine.tasks.review`);
        return it as committed: ``queued``, with its new job as ``river_job_id``.

        The task starts over as a fresh run (its outcome, cancel request and lease cleared,
        due now), recorded as a ``task.retried`` event. A failed or manual_review task also
        loses ``submitted_at`` and ``upstream_ref``, so the upstream call is made again (for a
        manual_review task, prefer :meth:`resolve`, which records who decided and why).

        Raises:
            TaskNotFound: no such task.
            TaskError: the task is in another status (queued, running, succeeded), or its
                previous job still runs; nothing changed.
        """
        return await retry_task(self, task_id)

    async def resolve(
        self,
        task_id: uuid.UUID,
        *,
        succeeded: bool = False,
        result: Any = None,
        failed: bool = False,
        resubmit: bool = False,
        reason: str,
        actor: str,
    ) -> Task:
        """Decide a task in manual review (:mod:`engine.tasks.review`); return it as committed.

        Exactly one of ``succeeded=True`` (with the ``result`` found upstream), ``failed=True``
        (error code ``resolved_failed``, message ``reason``) or ``resubmit=True`` (queued again
        with a new job: the upstream call is made again, so the work **may run upstream
        twice**). The decision is recorded as a ``task.resolved`` or ``task.resubmitted``
        event with ``actor`` and ``reason``.

        Raises:
            ValueError: not exactly one decision, an empty ``reason`` or ``actor``, or a
                ``result`` without ``succeeded``.
            TaskNotFound: no such task.
            ReviewConflict: the task is not in manual review (any more); nothing changed.
        """
        chosen = [
            d
            for d, on in (
                (Decision.SUCCEEDED, succeeded),
                (Decision.FAILED, failed),
                (Decision.RESUBMIT, resubmit),
            )
            if on
        ]
        if len(chosen) != 1:
            raise ValueError("choose exactly one of succeeded=True, failed=True, resubmit=True")
        return await resolve_task(
            self, task_id, chosen[0], reason=reason, actor=actor, result=result
        )

    async def set_model(
        self,
        name: str,
        *,
        enabled: bool = True,
        concurrency_limit: int | None = None,
        provider: str = "simulated",
        settings: Mapping[str, Any] | None = None,
        rate_limit: int | None = None,
        rate_interval: float = 1.0,
    ) -> None:
        """Create or change a model in the catalogue.

        Every field is written as given: ``concurrency_limit`` None (or <= 0) is unlimited,
        ``rate_limit`` None (or <= 0) is no rate limit, else at most ``rate_limit`` requests
        per ``rate_interval`` seconds (a token bucket of that many tokens, refilled at that
        rate; a change applies within a second, see
        :class:`~engine.admission.gate.ScopeCatalog`).

        Raises:
            ValueError: ``rate_interval`` is not a positive number of seconds.
        """
        _check_interval(rate_interval)
        await self.db.coordination.fetchrow(
            _MODEL_UPSERT,
            name,
            enabled,
            concurrency_limit,
            provider,
            dict(settings or {}),  # the jsonb codec encodes it
            rate_limit,
            float(rate_interval),
            CATALOG,
        )

    async def set_group(
        self,
        key: str,
        *,
        enabled: bool = True,
        concurrency_limit: int | None = None,
        rate_limit: int | None = None,
        rate_interval: float = 1.0,
    ) -> None:
        """Create or change a group in the catalogue; limits as in :meth:`set_model`.

        Raises:
            ValueError: ``rate_interval`` is not a positive number of seconds.
        """
        _check_interval(rate_interval)
        await self.db.coordination.fetchrow(
            _GROUP_UPSERT,
            key,
            enabled,
            concurrency_limit,
            rate_limit,
            float(rate_interval),
            CATALOG,
        )
