"""Building the service's parts from the configuration: the open :class:`Engine` with its
store, runner, queue client and notices, before any of them runs.

:func:`~engine.service.root.serve` calls :func:`assemble` once per start attempt; every part
gets the one observer (the metrics) when it is built.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence

from engine.admission.gate import ScopeGate
from engine.capacity.room import ShutdownPolicy
from engine.config import EngineConfig
from engine.db.channels import every_channel, river_channels
from engine.db.database import Database, DatabaseUrls
from engine.db.listen import ListenHub
from engine.errors import ConfigError
from engine.load.controller import LoadController
from engine.load.retry_delay import refused_start_delay
from engine.metrics import Metrics
from engine.providers.base import Provider
from engine.providers.simulated import SimulatedProvider
from engine.queue.client import make_instance_id, make_queue_client
from engine.queue.slots import SlotPool
from engine.queue.workers import Workers
from engine.schedules.model import Schedule, check_schedules
from engine.service.engine import Engine
from engine.service.health import Health
from engine.service.observe import Observer
from engine.tasks.jobs import TaskRunArgs
from engine.tasks.leases import LeaseKeeper
from engine.tasks.notices import TaskNotices
from engine.tasks.runner import TaskRunner
from engine.tasks.store import EventWriter, TaskStore

__all__ = ["assemble", "configured_schedules", "with_http_models"]


def with_http_models(
    providers: Mapping[str, Provider], http: Mapping[str, Provider]
) -> dict[str, Provider]:
    """The app's providers and the ``[[http_models]]`` ones together.

    Raises:
        ConfigError: a model has both.
    """
    both = sorted(set(providers) & set(http))
    if both:
        raise ConfigError(
            [
                f"http_models: model {name!r} also has a provider from the app (or engine.open); "
                "describe it in one place"
                for name in both
            ]
        )
    return {**providers, **http}


def configured_schedules(
    config: EngineConfig, schedules: Sequence[Schedule]
) -> tuple[Schedule, ...]:
    """The configuration's schedules and the app's, checked together.

    Raises:
        ConfigError: a schedule of the app is invalid, or two share a name.
    """
    every = (*config.schedules, *schedules)
    problems = check_schedules(every)
    if problems:
        raise ConfigError(problems)
    return every


async def assemble(
    config: EngineConfig,
    db: Database,
    urls: DatabaseUrls,
    providers: dict[str, Provider],
    simulated: Provider | None,
    load: LoadController | None,
) -> Engine:
    """Build every part of the service tree from the configuration; no service runs yet."""
    instance_id = config.instance_name or make_instance_id()
    store = TaskStore(db.tasks, instance_id, lease_ttl=config.tasks.lease_ttl)
    events = EventWriter(db.tasks)
    keeper = LeaseKeeper(store, config.tasks.lease_renew_interval)
    metrics = Metrics()
    # One observer for every part, handed over as each is built: nothing happens unobserved.
    observer: Observer = metrics
    runner = TaskRunner(
        store,
        events,
        keeper,
        providers,
        simulated=simulated or SimulatedProvider(),
        instance_id=instance_id,
        load=load,
        lock_timeout_delay=config.worker.lock_timeout_requeue_delay,
        queue_timeout=config.admission.queue_timeout,
        admission=ScopeGate(db.tasks, db.coordination),
        load_retry_delay=functools.partial(
            refused_start_delay,
            base=config.load.retry_base,
            spread_ms=config.load.retry_spread_ms,
        ),
        observer=observer,
    )
    workers = Workers()
    workers.register(TaskRunArgs, runner.work, kind=config.queue.job_kind)
    slots = SlotPool(0)  # nothing runs until the capacity source grants a share
    # The process's one LISTEN connection, every consumer a subscriber (run by _run_tree).
    hub = ListenHub(db.tasks.listen_dsn, every_channel(await river_channels(db.queue)))
    queue = await make_queue_client(
        db,
        config.queue,
        workers=workers,
        instance_id=instance_id,
        slots=slots,
        hub=hub,
        observer=observer,
    )
    return Engine(
        config,
        db,
        queue,
        store,
        TaskNotices(hub, keeper.cancel, keeper.wake),
        keeper,
        runner,
        event_writer=events,
        urls=urls,
        metrics=metrics,
        health=Health(),
        policy=ShutdownPolicy(
            drain_timeout=config.worker.shutdown_drain_timeout,
            stop_timeout=config.worker.stop_timeout,
        ),
        load=load,
    )
