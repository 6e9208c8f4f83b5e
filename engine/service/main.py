"""The engine service that ``python -m engine run`` runs: one root nursery, siblings inside.

::

    run_service
    └── open_engine                  pools, migrations, queue client, task services
        └── root nursery
            ├── metrics server       /metrics, /healthz, /readyz
            ├── load sampler         CPU, memory, connections → load controller (worker mode)
            ├── recovery             interrupted tasks, orphaned jobs, lost tasks
            ├── admission            waiting tasks admitted as scope slots free up
            ├── capacity refresher   registry heartbeat, share, generations (worker mode)
            └── gauges               queue depth, leader, task counts, every few seconds

Every sibling runs under :func:`supervise`: a crash after start-up is logged and the sibling is
restarted with backoff; a failure during start-up tears the whole start down and tries it again
(``worker.startup_attempts`` in all, ``worker.startup_retry_delay`` apart), then ends the service
with that error (non-zero exit), never a silent hang. Client-only mode
(``worker.mode = "client"``) runs no sampler and no refresher and executes nothing: it serves
submissions and recovers lost tasks (§5.3).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

import attrs
import trio

from engine.admission.dispatcher import Dispatcher
from engine.capacity.refresher import CapacityRefresher
from engine.config import EngineConfig
from engine.db.database import DatabaseUrls
from engine.db.dsn import redact
from engine.db.sqlfiles import QUERIES
from engine.errors import ConfigError, leaves
from engine.load.controller import LoadController, LoadThresholds
from engine.load.sampler import LoadSamplerService, ProcessSampler, db_usage
from engine.metrics import Metrics, MetricsServer
from engine.providers.base import Provider
from engine.providers.simulated import Latency, SimulatedProvider, SimulationConfig
from engine.queue.slots import SlotPool
from engine.recovery.rescuer import RecoveryReport, Rescuer
from engine.service.engine import Engine, open_engine

__all__ = ["DEMO_MODELS", "DEMO_SIMULATION", "install_demo_catalogue", "run_service", "supervise"]

log = logging.getLogger(__name__)

_WAITING_COUNT = QUERIES["admission_count_waiting"]

#: The simulated upstream the service uses for ``simulation`` tasks: a few hundred ms per task,
#: three polls, 5 % upstream failures.
DEMO_SIMULATION = SimulationConfig(
    prepare=Latency("uniform", 0.02, 0.1),
    submit=Latency("uniform", 0.02, 0.08),
    poll=Latency("fixed", 0.01),
    finalize=Latency("uniform", 0.02, 0.1),
    polls=3,
    poll_interval=0.2,
    failure_rate=0.05,
)

#: Installed on an empty catalogue so a first ``submit`` has something to run.
DEMO_MODELS: dict[str, int | None] = {"demo-image": 16, "demo-video": 8, "demo-chat": None}


async def install_demo_catalogue(engine: Engine) -> bool:
    """Add the demo models if the catalogue is empty; True if it did."""
    if await engine.db.coordination.fetchval("SELECT count(*) FROM engine_model"):
        return False
    for name, limit in DEMO_MODELS.items():
        await engine.set_model(
            name, concurrency_limit=limit, provider="simulated", settings={"demo": True}
        )
    log.info(
        "installed the demo catalogue",
        extra={"event": "demo_catalogue", "models": list(DEMO_MODELS)},
    )
    return True


async def supervise(
    name: str,
    run: Callable[..., Awaitable[Any]],
    *,
    task_status: trio.TaskStatus[Any] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Run the service ``run(task_status=...)``; restart it with backoff if it crashes after
    it started. A crash before it started is raised (the service cannot come up)."""
    started = False

    async def start_once(*, task_status: trio.TaskStatus[Any] = trio.TASK_STATUS_IGNORED) -> None:
        await run(task_status=task_status)

    backoff = 0.5
    while True:
        try:
            if not started:
                async with trio.open_nursery() as nursery:
                    value = await nursery.start(start_once)
                    started = True
                    task_status.started(value)
            else:
                await run()
            return
        except Exception as exc:
            if not started:
                raise
            log.error(
                "service crashed; restarting",
                exc_info=exc,
                extra={"event": "service_crashed", "service": name, "backoff": backoff},
            )
            await trio.sleep(backoff)
            backoff = min(backoff * 2, 30.0)


def _thresholds(config: EngineConfig) -> LoadThresholds:
    load = config.load
    return LoadThresholds(
        cpu_elevated=load.cpu_elevated,
        cpu_critical=load.cpu_critical,
        memory_elevated=load.memory_elevated,
        memory_critical=load.memory_critical,
        db_elevated=load.db_connections_elevated,
        db_critical=load.db_connections_critical,
        escalate_samples=load.escalate_samples,
        recover_samples=load.recover_samples,
    )


class _StartStatus:
    """Passes ``started`` on to the caller's task status and remembers that it came."""

    def __init__(self, outer: trio.TaskStatus[Engine]) -> None:
        self.outer = outer
        self.started_yet = False

    def started(self, value: Engine | None = None) -> None:
        assert value is not None
        self.started_yet = True
        self.outer.started(value)


async def run_service(
    config: EngineConfig,
    urls: DatabaseUrls,
    *,
    providers: dict[str, Provider] | None = None,
    simulated: Provider | None = None,
    task_status: trio.TaskStatus[Engine] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Run the engine against the databases at ``urls`` until cancelled.

    ``task_status.started(engine)`` comes once every sibling is up (the instance is registered
    and its first generation, if any, is fetching) and hands back the open :class:`Engine`.
    Only returns when cancelled.

    A start that fails (connecting, migrating, registering, the first recovery round, a first
    generation) is torn down and tried again from scratch ``worker.startup_retry_delay``
    seconds later, ``worker.startup_attempts`` times in all (the reference's
    ``retryAsyncQueueStartup``, §5.3); the last attempt's error escapes and ends the process
    with a non-zero status. Once started, nothing is retried here: each sibling restarts on
    its own (:func:`supervise`).
    """
    attempts = max(1, config.worker.startup_attempts)
    status = _StartStatus(task_status)
    for attempt in range(1, attempts + 1):
        try:
            await _serve(config, urls, providers, simulated, status)
            return
        except Exception as exc:
            if (
                status.started_yet
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


def _describe(exc: BaseException) -> str:
    """The error's message, looking through the exception groups nurseries wrap it in."""
    found = list(leaves(exc))
    leaf = found[0] if len(found) == 1 else exc
    return str(leaf) or type(leaf).__name__


async def _serve(
    config: EngineConfig,
    urls: DatabaseUrls,
    providers: dict[str, Provider] | None,
    simulated: Provider | None,
    task_status: _StartStatus,
) -> None:
    """One attempt of :func:`run_service`."""
    worker = config.worker.mode == "worker"
    metrics = Metrics()
    slots = SlotPool(0)  # nothing runs until the first refresh grants a share
    load = LoadController(
        mode=config.load.mode,
        claim_limit=0,
        heavy_limit=config.load.heavy_limit,
        thresholds=_thresholds(config),
    )
    ready = False
    async with open_engine(
        config,
        urls=urls,
        providers=providers,
        simulated=simulated or SimulatedProvider(DEMO_SIMULATION),
        load=load if worker else None,
        execute=worker,
        slots=slots,
        fixed_generation=False,
    ) as eng:
        if config.tasks.demo_catalogue:
            await install_demo_catalogue(eng)
        eng.queue.completer.on_flushed = metrics.observe_completions
        eng.runner.on_finished = lambda status: metrics.count_task(status.value)
        eng.runner.on_phase = metrics.observe_task_phase
        eng.queue.on_claim = metrics.observe_claim
        async with trio.open_nursery() as root:
            if config.metrics.enabled:
                server = MetricsServer(
                    metrics,
                    host=config.metrics.host,
                    port=config.metrics.port,
                    ready=lambda: ready,
                )
                port = await root.start(supervise, "metrics", server.run)
                eng.metrics_url = f"http://{config.metrics.host}:{port}/metrics"
                log.info(
                    "metrics served", extra={"event": "metrics_started", "url": eng.metrics_url}
                )
                print(f"engine: metrics at {eng.metrics_url}", flush=True)
            sampler = None
            if worker:
                sampler = LoadSamplerService(
                    load,
                    ProcessSampler(),
                    interval=config.load.sample_interval,
                    connections=lambda: db_usage(eng.db),
                    on_snapshot=metrics.set_worker_load,
                )
                await root.start(supervise, "load_sampler", sampler.run)
            rescuer = Rescuer(
                config,
                eng.db,
                eng.instance_id,
                eng.queue.channels.insert,
                client_mode=not worker,
                on_report=lambda r: _count_recovery(metrics, r),
            )
            await root.start(supervise, "recovery", rescuer.run)
            dispatcher = Dispatcher(config, eng.db, eng.queue.channels.insert)
            await root.start(supervise, "admission", dispatcher.run)
            if worker:
                refresher = CapacityRefresher(
                    config,
                    eng.db,
                    eng.queue,
                    slots,
                    load=load,
                    sampler=sampler,
                    metrics=metrics,
                )
                await root.start(supervise, "capacity", refresher.run)
            root.start_soon(supervise, "gauges", _gauges_service(eng, metrics))
            ready = True
            log.info(
                "service started",
                extra={
                    "event": "service_started",
                    "url": redact(urls.tasks),
                    "instance_id": eng.instance_id,
                    "mode": config.worker.mode,
                },
            )
            task_status.started(eng)


def _count_recovery(metrics: Metrics, report: RecoveryReport) -> None:
    for kind, n in attrs.asdict(report).items():
        metrics.count_recoveries(kind, n)


def _gauges_service(eng: Engine, metrics: Metrics) -> Callable[..., Awaitable[None]]:
    async def run(*, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        while True:
            metrics.set_queue_depth(await eng.queue.counts())
            metrics.set_leader(eng.queue.elector is not None and eng.queue.elector.is_leader)
            metrics.set_generations(len(eng.queue.generations))
            metrics.set_admissions_waiting(int(await eng.db.tasks.fetchval(_WAITING_COUNT) or 0))
            await trio.sleep(5.0)

    return run
