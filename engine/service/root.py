"""The one service tree: :func:`serve` owns the root nursery and the whole start and stop order.

``async with engine.open(config, providers=...)``, ``await nursery.start(engine.serve, config,
providers=...)`` and ``python -m engine run`` all run this tree; the command line adds only
signal handling, the demo catalogue and what it prints::

    serve
    ├── trio-asyncio loop, the database (embedded server or URL), pools, migrations, providers
    └── root nursery
        ├── records layer           outlives the control layer, so every outcome is recorded
        │   ├── embedded watch      restarts the embedded server if it stops (when it is ours)
        │   ├── event writer        task history, buffered (one INSERT per 50 ms or 1,000)
        │   ├── completer           batched job completions; shielded, flushes last
        │   ├── listen hub          the process's one LISTEN connection, every channel
        │   ├── notifier            River's channels: inserts, job control, leadership
        │   ├── task notices        finished tasks wake wait(), cancels reach runs
        │   ├── lease keeper        renews this process's task leases, one UPDATE per round
        │   └── elector [worker]    while leader: scheduler, cleaner, periodic schedules
        └── control layer           each sibling supervised: restarted from a fresh state
            ├── http server         /metrics, /healthz, /readyz, the dashboard (if
            │                       metrics.enabled or dashboard.enabled)
            ├── load sampler [worker]
            ├── recovery            interrupted tasks, orphaned jobs, lost tasks
            ├── admission           dispatcher (waiting tasks into free scope slots), reaper
            ├── capacity [worker]   registry refresher or fixed size; owns the generations
            │   └── generations     each: fetch scope ⊂ work scope, runner tasks
            └── gauges              queue depth, leader, generations, waiting admissions

``[worker]`` marks what client mode (``worker.mode = "client"``) leaves out: it submits, waits,
cancels, dispatches admissions and recovers lost tasks, and executes nothing. ``control=False``
leaves out the whole control layer (the command line's read-only commands).

Start order is top to bottom; each service reports ready through ``task_status`` before the
next starts, and :func:`serve` hands back the open :class:`~engine.service.engine.Engine` once
every one is up. A start that fails is torn down and tried again from scratch
(``worker.startup_attempts``, ``worker.startup_retry_delay`` apart); a configuration error is
not retried.

Stop order is the reverse, whatever stops the tree (the caller's cancellation, the end of an
``engine.open`` block, a crash): the control layer stops first (the capacity source marks the
instance draining and drains its generations: no new claims, running tasks get
``worker.shutdown_drain_timeout``, then what still runs is requeued), then the completer makes
its last flush, then the records layer stops and the event writer flushes, then the pools close
and the embedded server is released. Both layers are shielded from outside cancellation and
stopped explicitly, so that order holds even when the caller's scope is cancelled.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path

import attrs
import trio

from engine.config import EngineConfig
from engine.db.bridge import Connection, asyncio_loop
from engine.db.database import DatabaseUrls, open_database
from engine.db.dsn import redact
from engine.db.probe import probe_database
from engine.db.resolve import (
    embedded_data_dir,
    external_urls,
    migrate_databases,
    open_urls,
)
from engine.db.watch import watch_embedded
from engine.errors import ConfigError, leaves
from engine.load.controller import LoadController
from engine.load.pressure import LoadThresholds
from engine.providers.app import check_providers, load_app, open_providers
from engine.providers.base import Provider
from engine.providers.context import open_lifespans
from engine.queue.insert import InsertParams, insert_tx
from engine.schedules.model import Schedule
from engine.schedules.scheduler import PeriodicScheduler
from engine.service.assemble import assemble, configured_schedules, with_http_models
from engine.service.control import start_control
from engine.service.engine import Engine
from engine.service.health import DATABASE
from engine.tasks.callbacks import CallbackCleaner

__all__ = ["open", "serve"]

log = logging.getLogger(__name__)

#: Seconds the records layer gets to stop once the control layer has: the completer's and the
#: event writer's last flushes are bounded on their own (30 s and 10 s), this bounds the rest.
_RECORDS_STOP_TIMEOUT = 45.0


async def serve(
    config: EngineConfig,
    *,
    providers: Mapping[str, Provider] | None = None,
    simulated: Provider | None = None,
    urls: DatabaseUrls | None = None,
    control: bool = True,
    load: LoadController | None = None,
    schedules: Sequence[Schedule] = (),
    task_status: trio.TaskStatus[Engine] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Run the whole engine until cancelled; ``task_status.started(engine)`` once it is up.

    Args:
        config: the configuration (``engine.load_config()``).
        providers: a provider per model name; default: the ``app`` setting's providers, else
            none (simulation tasks only). Each is checked when registered.
        simulated: the provider of ``simulation`` tasks (default: a zero-latency one).
        urls: where the databases are (default: resolved from ``config``, starting the
            embedded server if no URL is configured).
        control: False runs the records layer only (submit, read, wait, cancel; no recovery,
            admission, capacity or metrics), for read-only tools.
        load: the load controller (default: one built from the ``load`` settings).
        schedules: periodic schedules of the app, run (with the configuration's
            ``[[schedules]]``) by whichever worker instance leads.

    Raises:
        ConfigError: invalid settings, app, providers or schedules (not retried).
        EngineError: the start failed ``worker.startup_attempts`` times; the last error.
    """
    attempts = max(1, config.worker.startup_attempts)
    started = False

    def on_started(engine: Engine) -> None:
        nonlocal started
        started = True
        task_status.started(engine)

    for attempt in range(1, attempts + 1):
        try:
            await _serve_once(
                config, providers, simulated, urls, control, load, schedules, on_started
            )
            return
        except Exception as exc:
            if (
                started
                or attempt == attempts
                or all(isinstance(e, ConfigError) for e in leaves(exc))
            ):
                raise  # a configuration error does not go away by trying again
            log.warning(
                "service start failed; retrying",
                extra={
                    "event": "service_start_retry",
                    "attempt": attempt,
                    "attempts": attempts,
                    "delay": config.worker.startup_retry_delay,
                    "error": _describe(exc),
                },
            )
        await trio.sleep(config.worker.startup_retry_delay)


@asynccontextmanager
async def open(
    config: EngineConfig,
    *,
    providers: Mapping[str, Provider] | None = None,
    simulated: Provider | None = None,
    urls: DatabaseUrls | None = None,
    control: bool = True,
    load: LoadController | None = None,
    schedules: Sequence[Schedule] = (),
) -> AsyncIterator[Engine]:
    """Run the whole engine (:func:`serve`) for the block and yield the open engine.

    Leaving the block stops it by the shutdown policy: running tasks get
    ``worker.shutdown_drain_timeout`` to finish, the rest are requeued. An exception raised in
    the block leaves it as itself (not wrapped in an exception group) when it is the only one.
    """
    try:
        async with asyncio_loop(), trio.open_nursery() as nursery:
            engine: Engine = await nursery.start(
                functools.partial(
                    serve,
                    config,
                    providers=providers,
                    simulated=simulated,
                    urls=urls,
                    control=control,
                    load=load,
                    schedules=schedules,
                )
            )
            try:
                yield engine
            finally:
                nursery.cancel_scope.cancel(reason="engine block ended")
    except BaseExceptionGroup as group:
        found = [e for e in leaves(group) if not isinstance(e, trio.Cancelled)]
        if len(found) == 1:
            raise found[0] from found[0].__cause__
        raise


def _describe(exc: BaseException) -> str:
    """The error's message, looking through the exception groups nurseries wrap it in."""
    found = list(leaves(exc))
    leaf = found[0] if len(found) == 1 else exc
    return str(leaf) or type(leaf).__name__


async def _serve_once(
    config: EngineConfig,
    providers: Mapping[str, Provider] | None,
    simulated: Provider | None,
    urls: DatabaseUrls | None,
    control: bool,
    load: LoadController | None,
    schedules: Sequence[Schedule],
    on_started: Callable[[Engine], None],
) -> None:
    """One attempt of :func:`serve`."""
    worker = control and config.worker.mode == "worker"
    dbc = config.database
    every_schedule = configured_schedules(config, schedules)
    async with AsyncExitStack() as stack:
        await stack.enter_async_context(asyncio_loop())
        if providers is None and config.app is not None and worker:
            providers = await stack.enter_async_context(open_providers(load_app(config.app)))
        if config.http_models and worker:
            # Imported here: httpx is loaded only by a service that serves HTTP models.
            from engine.providers.http.provider import open_http_providers

            providers = with_http_models(
                providers or {},
                await stack.enter_async_context(open_http_providers(config.http_models)),
            )
        served = check_providers(providers or {})
        # Entered once, before any task runs; exited after the last one (and after the pools
        # close), before the providers' own context closes.
        resources = await stack.enter_async_context(open_lifespans(served)) if worker else {}
        # The embedded server is ours to keep up only when we started it from the config.
        external = urls is not None or external_urls(config.database) is not None
        if urls is None:
            urls = await stack.enter_async_context(open_urls(config.database, config.data_dir))
        db = await stack.enter_async_context(open_database(urls, config.database))
        if dbc.migrate_on_start:
            await migrate_databases(db, river_indexes=config.queue.river_indexes)
        if load is None and worker:
            load = LoadController(
                mode=config.load.mode,
                claim_limit=0,
                heavy_limit=config.load.heavy_limit,
                thresholds=LoadThresholds.from_section(config.load),
            )
        engine = await assemble(config, db, urls, served, simulated, load if worker else None)
        engine.runner.resources = resources
        await _run_tree(
            engine,
            worker=worker,
            control=control,
            schedules=every_schedule,
            watch=None if external else embedded_data_dir(config.data_dir),
            on_started=on_started,
        )


def _periodic(engine: Engine, schedules: Sequence[Schedule]) -> PeriodicScheduler:
    """The leader's periodic scheduler, submitting through the engine's own paths."""
    channel = engine.queue.channels.insert

    async def insert_jobs(conn: Connection, params: Sequence[InsertParams]) -> object:
        return await insert_tx(conn, params, channel)

    return PeriodicScheduler(
        engine.db.tasks,
        schedules,
        engine.submit_tx,
        insert_jobs,
        leader_id=engine.instance_id,
        default_max_attempts=engine.config.queue.default_max_attempts,
        rollback_timeout=engine.config.worker.enqueue_rollback_timeout,
    )


@attrs.define(eq=False)
class _Layer:
    """A nursery of services that stops only when told to: shielded from outside cancellation,
    so the tree's layers stop in order (:func:`serve`'s docstring)."""

    name: str
    scope: trio.CancelScope = attrs.field(factory=lambda: trio.CancelScope(shield=True))
    done: trio.Event = attrs.field(factory=trio.Event)
    running: bool = False

    async def run(self, *, task_status: trio.TaskStatus[trio.Nursery]) -> None:
        self.running = True
        try:
            with self.scope:
                async with trio.open_nursery() as nursery:
                    task_status.started(nursery)
                    await trio.sleep_forever()
        finally:
            self.done.set()

    async def stop(self, timeout: float) -> None:
        """Cancel the layer's services and wait (shielded, ``timeout`` at most) until they end."""
        if not self.running:
            return
        self.scope.cancel(reason=f"engine stopping: {self.name} layer")
        with trio.move_on_after(timeout, shield=True):
            await self.done.wait()


async def _run_tree(
    engine: Engine,
    *,
    worker: bool,
    control: bool,
    schedules: Sequence[Schedule],
    watch: Path | None,
    on_started: Callable[[Engine], None],
) -> None:
    """Start both layers in order, hand back the engine, and stop them in order. ``watch``:
    the embedded server's data directory, kept up by a watcher (None: not ours)."""
    config = engine.config
    records, controls = _Layer("records"), _Layer("control")
    async with trio.open_nursery() as root:
        try:
            services = await root.start(records.run)
            if watch is not None:
                await services.start(
                    functools.partial(
                        watch_embedded,
                        watch,
                        interval=config.database.embedded_check_interval,
                        on_state=lambda up: engine.health.mark("embedded_server", up),
                    )
                )
            await services.start(
                functools.partial(
                    probe_database,
                    engine.db,
                    interval=config.database.probe_interval,
                    on_state=lambda up: engine.health.mark(DATABASE, up),
                )
            )
            await services.start(engine.event_writer.run)
            await services.start(engine.queue.run_completer)
            await services.start(engine.queue.notifier.hub.run)
            await services.start(engine.queue.run_notifier)
            await services.start(engine.notices.run)
            await services.start(engine.keeper.run)
            if worker:
                also: tuple[Callable[[], Awaitable[None]], ...] = (
                    CallbackCleaner(engine.db.tasks).run,
                )
                if schedules:
                    also += (_periodic(engine, schedules).run,)
                await services.start(engine.queue.make_elector(also).run)
            elif schedules and control:
                log.info(
                    "schedules run on the leading worker instance, not on a client",
                    extra={"event": "schedules_not_run", "schedules": [s.name for s in schedules]},
                )
            if control:
                siblings = await root.start(controls.run)
                await start_control(engine, siblings, worker=worker)
            engine.health.serving = True
            # The command line's read-only tools open the records layer only: not worth a line.
            log.log(
                logging.INFO if control else logging.DEBUG,
                "service started",
                extra={
                    "event": "service_started",
                    "url": redact(engine.urls.tasks),
                    "instance_id": engine.instance_id,
                    "mode": config.worker.mode if control else "tools",
                    "models": sorted(engine.runner.providers),
                },
            )
            on_started(engine)
            await trio.sleep_forever()
        finally:
            engine.health.serving = False
            with trio.CancelScope(shield=True):
                # Generous: the capacity source bounds its own drain and stop.
                await controls.stop(
                    config.worker.mark_draining_timeout
                    + engine.policy.drain_timeout
                    + engine.policy.stop_timeout
                    + 5.0
                )
                await engine.queue.close_completer()
                await records.stop(_RECORDS_STOP_TIMEOUT)
            root.cancel_scope.cancel(reason="engine stopped")
