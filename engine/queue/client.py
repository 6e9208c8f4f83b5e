"""The queue client: insert, control, and the services that execute jobs.

A :class:`QueueClient` is made by :func:`make_queue_client` and runs three services: the
completer (:meth:`QueueClient.run_completer`, shielded: it outlives every generation and flushes
their last outcomes), the notifier (:meth:`QueueClient.run_notifier`: River's channels on the
process's one LISTEN connection, fanned out to producers and to control messages) and, when
the process executes jobs, the leader elector with its maintenance
(:meth:`QueueClient.make_elector`). It *makes* generations (:meth:`QueueClient.make_generation`);
whoever sizes them runs them in its own nursery (the service's capacity source,
``engine.capacity``).

:func:`open` is the queue on its own, as River's client is: from the app's settings it opens
the database (``database.url`` or the embedded server, migrated), and runs :func:`open_queue` on
it with one generation. :func:`open_queue` takes pools the caller owns: the three services and
a nursery for generations started with :meth:`QueueClient.start_generation`. Leaving the block
stops every generation (drain up to ``stop_timeout``, ``queue.shutdown_drain_timeout`` by
default, then cancel), and only then lets the completer make its last flush::

    services nursery
    ├── completer          shielded; ends when every generation's channel clone is closed
    ├── notifier           LISTEN (its own connection), fan-out to producers and control
    ├── elector            leader only: scheduler, cleaner
    └── generations nursery
        ├── generation 1   fetch scope ⊂ work scope
        └── generation 2

:meth:`QueueClient.wait_drained` waits until a queue has nothing left to do now, by its rows
(docs/queue.md, "Waiting until a queue is drained").
"""

from __future__ import annotations

import json
import logging
import math
import os
import socket
import time
import zlib
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from datetime import datetime
from pathlib import Path
from typing import Any, Protocol

import trio

from engine.db.bridge import Connection, asyncio_loop
from engine.db.channels import RiverChannels, river_channels
from engine.db.config import DatabaseConfig
from engine.db.database import Database, open_database
from engine.db.listen import ListenHub
from engine.db.resolve import migrate_databases, open_urls
from engine.db.sqlfiles import QUERIES
from engine.errors import leaves
from engine.queue.completer import Completer, CompleterConfig
from engine.queue.config import QueueConfig
from engine.queue.elector import Elector, ElectorConfig
from engine.queue.generation import Generation, GenerationConfig
from engine.queue.insert import (
    InsertManyItem,
    InsertParams,
    insert,
    insert_many,
    insert_tx,
    prepare,
    prepare_many,
)
from engine.queue.job import InsertOpts, InsertResult, Job
from engine.queue.maintenance import CleanerConfig, JobCleaner, JobScheduler, SchedulerConfig
from engine.queue.notifier import Notifier, notify_queues
from engine.queue.observe import QUIET, QueueObserver
from engine.queue.slots import SlotPool
from engine.queue.states import JobState
from engine.queue.workers import Workers


class QueueSettings(Protocol):
    """What :func:`open` reads of the app's configuration: :class:`~engine.config.EngineConfig`
    has it (``engine.load_config()``), and so may any object with these three attributes."""

    @property
    def database(self) -> DatabaseConfig:
        """The ``[database]`` section: where the database is and how the pools behave."""
        ...

    @property
    def queue(self) -> QueueConfig:
        """The ``[queue]`` section."""
        ...

    @property
    def data_dir(self) -> Path | None:
        """Where the embedded server lives when ``database.url`` is unset."""
        ...


__all__ = [
    "QueueClient",
    "QueueSettings",
    "make_instance_id",
    "make_queue_client",
    "open",
    "open_queue",
]

log = logging.getLogger(__name__)

_GET = QUERIES["job_get_by_id"]
_LIST = QUERIES["job_list"]
_CANCEL = QUERIES["job_cancel"]
_RETRY = QUERIES["job_retry"]
_PAUSE = QUERIES["queue_pause"]
_RESUME = QUERIES["queue_resume"]
_COUNTS = QUERIES["job_count_by_state"]
_HAS_WORK = QUERIES["job_queue_has_work"]
_NOTIFY = "SELECT pg_notify($1, $2)"

#: Seconds the jobs a stop cancelled get to record their outcome, on top of the drain, before
#: the stop gives up waiting on them (each outcome is written shielded, with its own deadline).
_CANCEL_GRACE = 5.0


def make_instance_id() -> str:
    """``host:pid:nanos``, unique per process start; a long host is shortened with a hash so
    client ids stay within River's 100 characters (River rejects a longer one)."""
    host = socket.gethostname() or "localhost"
    if len(host) > 32:
        host = f"{host[:23]}-{zlib.crc32(host.encode()):08x}"
    return f"{host}:{os.getpid()}:{time.time_ns()}"


class QueueClient:
    """Insert and control jobs; start generations that execute them (inside ``open_queue``)."""

    def __init__(
        self,
        db: Database,
        config: QueueConfig,
        *,
        workers: Workers | None,
        instance_id: str,
        channels: RiverChannels,
        notifier: Notifier,
        completer: Completer,
        slots: SlotPool,
        observer: QueueObserver = QUIET,
    ) -> None:
        self.db = db
        self.config = config
        self.workers = workers
        self.instance_id = instance_id
        self.channels = channels
        self.notifier = notifier
        self.completer = completer
        self.slots = slots
        self.cancel_scopes: dict[int, trio.CancelScope] = {}
        self.generations: list[Generation] = []
        self.elector: Elector | None = None
        self._leader_services: tuple[Callable[[], Awaitable[None]], ...] = ()
        #: Told of every claim of the generations this client makes (the completer has it too).
        self.observer = observer
        self._nursery: trio.Nursery | None = None
        self._completer_scope = trio.CancelScope(shield=True)

    # ---- inserting -------------------------------------------------------------------------
    # Every insert takes the same args: an attrs instance whose class names its ``kind``, or a
    # mapping with ``kind=``. Bulk inserts take each job as args, ``(args, opts)``, or
    # InsertManyParams (which can carry a kind, so mappings go in that way).

    async def insert(
        self, args: Any, opts: InsertOpts | None = None, *, kind: str | None = None
    ) -> InsertResult:
        """Insert one job; a live duplicate under ``opts.unique`` comes back ``skipped``.

        ``args`` is an attrs instance whose class names its ``kind``, or a mapping with
        ``kind=`` given. Without ``opts.max_attempts`` the job gets
        ``queue.default_max_attempts``.

        Raises:
            JobError: no kind (a mapping without ``kind=``), unencodable args, bad unique
                options; nothing was stored.
        """
        return await insert(self.db.queue, self._prepare(args, opts, kind), self.channels.insert)

    async def insert_tx(
        self,
        conn: Connection,
        args: Any,
        opts: InsertOpts | None = None,
        *,
        kind: str | None = None,
    ) -> InsertResult:
        """:meth:`insert` inside the caller's transaction on ``conn``: visible at commit, gone
        on rollback (River's ``InsertTx``)."""
        (result,) = await insert_tx(conn, [self._prepare(args, opts, kind)], self.channels.insert)
        return result

    async def insert_many(self, items: Sequence[InsertManyItem]) -> list[InsertResult]:
        """Insert many jobs in one transaction, one result per item in order (River's
        ``InsertMany``).

        Each item is args (an attrs instance whose class names its kind), an ``(args, opts)``
        pair, or :class:`~engine.queue.job.InsertManyParams` ``(args, opts, kind=...)``, the
        form for mapping args.

        Raises:
            JobError: an item is refused (a mapping without a kind, among others); the message
                names its index, and nothing was stored.
        """
        return await insert_many(self.db.queue, self._prepare_many(items), self.channels.insert)

    async def insert_many_tx(
        self, conn: Connection, items: Sequence[InsertManyItem]
    ) -> list[InsertResult]:
        """:meth:`insert_many` inside the caller's transaction on ``conn``: visible at commit,
        gone on rollback (River's ``InsertManyTx``)."""
        return await insert_tx(conn, self._prepare_many(items), self.channels.insert)

    def _prepare(
        self, args: Any, opts: InsertOpts | None = None, kind: str | None = None
    ) -> InsertParams:
        return prepare(args, opts, kind=kind, default_max_attempts=self.config.default_max_attempts)

    def _prepare_many(self, items: Sequence[InsertManyItem]) -> list[InsertParams]:
        return prepare_many(items, default_max_attempts=self.config.default_max_attempts)

    # ---- reading and control ---------------------------------------------------------------

    async def get(self, job_id: int) -> Job | None:
        """The job with ``job_id``, or None."""
        row = await self.db.queue.fetchrow(_GET, job_id)
        return None if row is None else Job.from_record(row)

    async def list(
        self, *, state: JobState | None = None, queue: str | None = None, limit: int = 100
    ) -> list[Job]:
        """Jobs newest first, optionally filtered."""
        rows = await self.db.queue.fetch(_LIST, state.value if state else None, queue, limit)
        return [Job.from_record(r) for r in rows]

    async def counts(self) -> dict[str, dict[str, int]]:
        """``{queue: {state: n}}`` for every queue with jobs."""
        out: dict[str, dict[str, int]] = {}
        for row in await self.db.queue.fetch(_COUNTS):
            out.setdefault(row["queue"], {})[row["state"]] = int(row["n"])
        return out

    async def has_work(self, queue: str = "default") -> bool:
        """Whether ``queue`` has work now, by its rows: a job ``available`` or ``running``, or
        ``scheduled`` / ``retryable`` and due. See :meth:`wait_drained`."""
        return bool(await self.db.queue.fetchval(_HAS_WORK, queue))

    def holding(self, queue: str) -> int:
        """Jobs of ``queue`` this client's generations hold now: running, or reserved by a
        claim in flight."""
        return sum(
            producer.running
            for generation in self.generations
            for producer in generation.producers
            if producer.config.queue == queue
        )

    async def wait_drained(self, queue: str = "default", *, poll_interval: float = 0.01) -> None:
        """Return once ``queue`` is drained: no job of it is ``available`` or ``running``, and
        none is ``scheduled`` or ``retryable`` and due.

        The queue's rows decide, whoever inserted or works its jobs, and a job counts as
        running until its outcome is written, so once this returns every outcome this
        client's generations recorded for the queue is in the database. Jobs that wait for
        later (scheduled for later, a snooze of more than 5 s, a retry due later) and
        ``pending`` jobs do not count: drained means nothing left to do now. A job inserted
        in a transaction that has not committed is not seen; a paused queue with available
        jobs stays undrained until it is resumed. There is no timeout: wrap the call in
        ``trio.fail_after``.

        While this client's generations hold jobs of the queue it looks again every
        ``poll_interval`` seconds without asking the database; otherwise it asks the database,
        less and less often while the work is elsewhere (other processes, a due job waiting
        for the leader's scheduler), down to once every ``queue.fetch_poll_interval``.
        """
        if poll_interval <= 0:
            raise ValueError("poll_interval must be > 0 seconds")
        longest = max(poll_interval, self.config.fetch_poll_interval)
        delay = poll_interval
        # Until then this client's last outcomes may still be on their way to the database
        # (the completer writes within a tick): keep looking at the short interval.
        writing_until = -math.inf
        while True:
            if self.holding(queue):
                writing_until = trio.current_time() + 2 * self.config.completer_tick
                delay = poll_interval
            elif not await self.has_work(queue):
                return
            elif trio.current_time() < writing_until:
                delay = poll_interval
            else:
                delay = min(delay * 2, longest)
            await trio.sleep(delay)

    async def cancel(self, job_id: int, now: datetime | None = None) -> Job | None:
        """Cancel a job: at once unless it is running; a running job's process is told to
        cancel its handler, and the job ends ``cancelled``. Returns the job after the change."""
        async with self.db.queue.acquire() as conn:
            row = await conn.fetchrow(_CANCEL, job_id, now or datetime.now().astimezone())
            if row is None:
                return None
            job = Job.from_record(row)
            if job.state is JobState.RUNNING:
                await conn.execute(
                    _NOTIFY,
                    self.channels.control,
                    json.dumps({"action": "cancel", "job_id": job_id, "queue": job.queue}),
                )
        return job

    async def retry(self, job_id: int) -> Job | None:
        """Run a job again now (not while it runs); returns it, or None if it cannot."""
        row = await self.db.queue.fetchrow(_RETRY, job_id)
        if row is None:
            return None
        job = Job.from_record(row)
        await notify_queues(self.db.queue, self.channels.insert, [job.queue])
        return job

    async def pause(self, queue: str) -> None:
        """Pause fetching from ``queue`` in every process (running jobs go on)."""
        await self.db.queue.fetchrow(_PAUSE, queue, self.channels.control)

    async def resume(self, queue: str) -> None:
        """Resume ``queue`` everywhere; producers fetch at once."""
        await self.db.queue.fetchrow(_RESUME, queue, self.channels.control)

    def _on_control(self, message: Mapping[str, Any]) -> None:
        if message.get("action") == "cancel":
            scope = self.cancel_scopes.get(int(message.get("job_id", -1)))
            if scope is not None:
                scope.cancel(reason="job cancelled")

    # ---- executing -------------------------------------------------------------------------

    def client_id(self, capacity: int) -> str:
        """``<instance>-exec-<capacity>-<nanos>``: River's client id, whose instance part orphan
        recovery reads back from a job's ``attempted_by``."""
        return f"{self.instance_id}-exec-{capacity}-{time.time_ns()}"

    def make_generation(
        self,
        queues: Mapping[str, int],
        *,
        args_filter: tuple[str, tuple[str, ...]] | None = None,
    ) -> Generation:
        """A new generation fetching ``queues`` (name → max_workers), not started yet: run it
        with ``await nursery.start(generation.run)`` in the nursery that owns it. While it
        runs it is listed in :attr:`generations`.

        ``args_filter`` ``(key, values)`` claims only jobs whose args lack ``key`` or hold one of
        ``values`` there (None: every job).
        """
        if self.workers is None:
            raise RuntimeError("make_generation needs a queue client made with workers")
        generation = Generation(
            GenerationConfig.from_section(
                self.config,
                client_id=self.client_id(sum(queues.values())),
                queues=queues,
                args_filter=args_filter,
            ),
            pool=self.db.queue,
            workers=self.workers,
            notifier=self.notifier,
            completer=self.completer,
            slots=self.slots,
            cancel_scopes=self.cancel_scopes,
            observer=self.observer,
            on_stopped=self.generations.remove,
        )
        self.generations.append(generation)
        return generation

    async def start_generation(self, queues: Mapping[str, int]) -> Generation:
        """Start a generation in :func:`open_queue`'s own nursery; returns once it is fetching.
        Stop it with ``stop()`` / ``stop_and_cancel()``."""
        if self._nursery is None:
            raise RuntimeError("start_generation needs the block of open_queue(..., workers=...)")
        generation = self.make_generation(queues)
        await self._nursery.start(generation.run)
        return generation

    async def stop_all(self, timeout: float) -> None:
        """Drain every generation for up to ``timeout`` seconds, then cancel what still runs."""
        for generation in list(self.generations):
            generation.stop("queue client closing")
        with trio.move_on_after(timeout):
            for generation in list(self.generations):
                await generation.stopped.wait()
        for generation in list(self.generations):
            generation.stop_and_cancel("queue client closing: drain timed out")
        for generation in list(self.generations):
            await generation.stopped.wait()

    def make_elector(self, also: Sequence[Callable[[], Awaitable[None]]] = ()) -> Elector:
        """The leader elector, which runs the scheduler and the cleaner while it leads, and
        each of ``also`` (the owner's leader-only services: periodic schedules)."""
        self._leader_services = tuple(also)
        self.elector = Elector(
            self.db.queue,
            self.notifier,
            ElectorConfig.from_section(self.config, leader_id=f"{self.instance_id}-leader"),
            self._lead,
        )
        return self.elector

    async def run_completer(
        self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """Run the completer, shielded from the outside: it must outlive the generations and
        flush their last outcomes. It ends once :meth:`close_completer` was called and every
        generation's channel clone is closed, or at the deadline that call sets."""
        with self._completer_scope:
            await self.completer.run(task_status=task_status)

    async def close_completer(self) -> None:
        """Close the completer's channel and bound its final flush
        (``final_flush_timeout``)."""
        await self.completer.close()
        self._completer_scope.deadline = (
            trio.current_time() + self.completer.config.final_flush_timeout
        )

    async def run_notifier(
        self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """Run the notifier (River's channels on the process's LISTEN connection, fanned out to
        producers and leadership) with this client's control handler (remote job cancels); a
        client made without a hub runs its own hub here."""
        with self.notifier.subscribe_control(self._on_control):
            await self.notifier.run(task_status=task_status)

    async def _lead(self) -> None:
        scheduler = JobScheduler(
            self.db.queue, self.channels.insert, SchedulerConfig.from_section(self.config)
        )
        cleaner = JobCleaner(self.db.queue, CleanerConfig.from_section(self.config))
        async with trio.open_nursery() as nursery:
            nursery.start_soon(scheduler.run)
            nursery.start_soon(cleaner.run)
            for service in self._leader_services:
                nursery.start_soon(service)


async def make_queue_client(
    db: Database,
    config: QueueConfig,
    *,
    workers: Workers | None = None,
    instance_id: str | None = None,
    slots: SlotPool | None = None,
    hub: ListenHub | None = None,
    observer: QueueObserver = QUIET,
) -> QueueClient:
    """A queue client on ``db``; with ``workers`` it can execute jobs. Its services are not
    running yet (see the module docstring).

    ``observer`` is told of every claim and every completion written, from the first
    (:mod:`engine.queue.observe`; nothing observes the queue without one).

    ``hub``: the process's LISTEN connection, which must listen on River's channels and which
    its maker runs (the service's records layer). Without one the client makes its own, on
    River's channels only, run by :meth:`QueueClient.run_notifier`.
    """
    channels = await river_channels(db.queue)
    completer = Completer(
        db.queue,
        CompleterConfig.from_section(config),
        notify_channel=channels.insert,
        observer=observer,
    )
    return QueueClient(
        db,
        config,
        workers=workers,
        instance_id=instance_id or make_instance_id(),
        channels=channels,
        notifier=Notifier(
            hub or ListenHub(db.queue.listen_dsn, channels.all), channels, runs_hub=hub is None
        ),
        completer=completer,
        slots=slots or SlotPool(math.inf),
        observer=observer,
    )


@asynccontextmanager
async def open_queue(
    db: Database,
    config: QueueConfig,
    *,
    workers: Workers | None = None,
    instance_id: str | None = None,
    stop_timeout: float | None = None,
    slots: SlotPool | None = None,
) -> AsyncIterator[QueueClient]:
    """Open a queue client on the pools of ``db``, which the caller owns (migrated already);
    with ``workers`` it can execute jobs and campaigns for leadership. :func:`open` opens the
    database as well.

    Leaving the block drains generations for up to ``stop_timeout`` seconds
    (None: ``queue.shutdown_drain_timeout``), cancels the rest (each records its outcome: back
    to ``available``, attempt restored), and flushes every completion before returning.
    """
    if stop_timeout is None:
        stop_timeout = config.shutdown_drain_timeout
    client = await make_queue_client(
        db, config, workers=workers, instance_id=instance_id, slots=slots
    )
    async with trio.open_nursery() as services:
        await services.start(client.run_completer)
        try:
            await services.start(client.run_notifier)
            if workers is not None:
                await services.start(client.make_elector().run)
            async with trio.open_nursery() as generations:
                client._nursery = generations
                try:
                    yield client
                finally:
                    with trio.CancelScope(shield=True):
                        with trio.move_on_after(stop_timeout + _CANCEL_GRACE):
                            await client.stop_all(stop_timeout)
                client._nursery = None
        finally:
            await client.close_completer()
            services.cancel_scope.cancel(reason="queue client closed")


@asynccontextmanager
async def open(
    config: QueueSettings,
    *,
    workers: Workers | None = None,
    queues: Mapping[str, int] | None = None,
    instance_id: str | None = None,
) -> AsyncIterator[QueueClient]:
    """The queue on its own, as River's client is, on the database of ``config`` (the app's
    :class:`~engine.config.EngineConfig`, e.g. ``engine.load_config()``, or any
    :class:`QueueSettings`); yields the client.

    It finds the database as the service does: ``database.url`` (and the role URLs), or the
    embedded server in ``data_dir`` (started if needed, the database created if missing),
    opens the pools with the ``[database]`` settings, and applies pending migrations when
    ``database.migrate_on_start``. It runs the completer and the notifier and, with
    ``workers``, the leader elector (scheduler and cleaner while it leads) and one generation
    working ``queues`` (queue name → most jobs at once; None: ``{"default":
    queue.max_workers}``; ``{}``: none yet, start them with
    :meth:`QueueClient.start_generation`). Without ``workers`` the client only inserts and
    controls jobs.

    Leaving the block stops fetching, gives running jobs ``queue.shutdown_drain_timeout``
    seconds to finish, cancels the rest (back to ``available``, attempt restored), writes
    every outcome, then closes the pools and releases the embedded server. An exception
    raised in the block leaves it as itself (not in an exception group) when it is the only
    one.

    Raises:
        ValueError: ``queues`` without ``workers``.
        ConnectionLost: the database could not be reached (``database.connect_attempts``).
        EmbeddedPostgresError: the embedded server could not be started.
        MigrationError: a migration failed.
    """
    if workers is None and queues:
        raise ValueError("queues= needs workers= to work them")
    try:
        async with AsyncExitStack() as stack:
            await stack.enter_async_context(asyncio_loop())
            urls = await stack.enter_async_context(open_urls(config.database, config.data_dir))
            db = await stack.enter_async_context(
                open_database(urls, config.database, application_name="engine-queue")
            )
            if config.database.migrate_on_start:
                await migrate_databases(db, river_indexes=config.queue.river_indexes)
            client = await stack.enter_async_context(
                open_queue(db, config.queue, workers=workers, instance_id=instance_id)
            )
            if workers is not None:
                sizes = {"default": config.queue.max_workers} if queues is None else queues
                if sizes:
                    await client.start_generation(sizes)
            yield client
    except BaseExceptionGroup as group:
        found = [e for e in leaves(group) if not isinstance(e, trio.Cancelled)]
        if len(found) == 1:
            raise found[0] from found[0].__cause__
        raise
