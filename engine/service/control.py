"""The control layer of the service tree: its siblings, started in order, each supervised.

The HTTP server (metrics, health, the dashboard, callbacks), the load sampler, recovery, the
admission dispatcher, the capacity source that owns the generations, and the gauges that no
event updates. :func:`start_control` is the one place that knows their order; the tree
(:mod:`engine.service.root`) starts it after the records layer and stops it first.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Awaitable, Callable

import attrs
import trio

from engine.admission.dispatcher import Dispatcher
from engine.capacity.fixed import FixedCapacity
from engine.capacity.refresher import CapacityRefresher
from engine.capacity.snapshot import UNBOUNDED_FALLBACK
from engine.config import EngineConfig
from engine.db.sqlfiles import QUERIES
from engine.load.sampler import LoadSamplerService, ProcessSampler, db_usage
from engine.metrics import Metrics
from engine.providers.base import callback_poll_interval
from engine.queue.generation import MAX_WORKERS
from engine.recovery.rescuer import RecoveryReport, Rescuer
from engine.service.engine import Engine
from engine.service.settings import dispatcher_settings, recovery_settings
from engine.service.supervise import supervise
from engine.tasks.jobs import model_claim_filter

__all__ = ["start_control"]

log = logging.getLogger(__name__)

_WAITING_BY_MODEL = QUERIES["admission_count_waiting_by_model"]
#: Seconds between two updates of the gauges (queue depth, leader, waiting admissions).
_GAUGES_INTERVAL = 5.0


async def start_control(engine: Engine, nursery: trio.Nursery, *, worker: bool) -> None:
    """Start the control layer's siblings in order, each under :func:`supervise`."""
    config, db, metrics, health = engine.config, engine.db, engine.metrics, engine.health
    hub = engine.queue.notifier.hub
    # A worker whose providers take upstream callbacks serves POST /hooks/<task id>, on the
    # one HTTP server (started for it even with metrics and the dashboard off).
    hooks = worker and any(
        callback_poll_interval(p) is not None for p in engine.runner.providers.values()
    )
    if config.metrics.enabled or config.dashboard.enabled or hooks:
        # One HTTP server: /metrics (if metrics.enabled), /healthz, /readyz, the hooks and the
        # dashboard (if dashboard.enabled); refused off loopback without the dashboard's
        # credentials. Imported here: the web stack is loaded only by a service that serves it.
        from engine.web.service import http_server

        server = http_server(
            engine,
            metrics=bool(config.metrics.enabled),
            dashboard=bool(config.dashboard.enabled),
            hooks=hooks,
        )
        port = await nursery.start(supervise, "metrics", lambda: server.run, health)
        base = f"http://{config.metrics.host}:{port}"
        if hooks:
            engine.runner.hooks_base_url = base
            log.info(
                "upstream callbacks served",
                extra={"event": "hooks_started", "url": f"{base}/hooks/"},
            )
        if config.metrics.enabled:
            engine.metrics_url = f"{base}/metrics"
            log.info(
                "metrics served", extra={"event": "metrics_started", "url": engine.metrics_url}
            )
        if config.dashboard.enabled:
            engine.dashboard_url = f"{base}/"
            log.info(
                "dashboard served",
                extra={"event": "dashboard_started", "url": engine.dashboard_url},
            )
    sampler: LoadSamplerService | None = None
    if worker and engine.load is not None:
        sampler = LoadSamplerService(
            engine.load,
            ProcessSampler(),
            interval=config.load.sample_interval,
            connections=lambda: db_usage(db),
            on_snapshot=metrics.set_load,
        )
        await nursery.start(supervise, "load_sampler", lambda: sampler.run, health)

    def rescuer() -> Callable[..., Awaitable[None]]:
        return Rescuer(
            recovery_settings(config),
            db,
            engine.instance_id,
            engine.queue.channels.insert,
            client_mode=not worker,
            on_report=lambda report: _count_recovery(metrics, report),
        ).run

    await nursery.start(supervise, "recovery", rescuer, health)
    await nursery.start(
        supervise,
        "admission",
        lambda: (
            Dispatcher(dispatcher_settings(config), db, engine.queue.channels.insert, hub=hub).run
        ),
        health,
    )
    if worker:
        await nursery.start(supervise, "capacity", lambda: _capacity(engine, sampler), health)
    await nursery.start(supervise, "gauges", lambda: functools.partial(_gauges, engine), health)


def _capacity(engine: Engine, sampler: LoadSamplerService | None) -> Callable[..., Awaitable[None]]:
    """A fresh capacity source (its ``run``), as ``worker.capacity`` chooses."""
    config = engine.config
    served = tuple(sorted(engine.runner.providers))
    # Live tasks carry their model in the job's args; claim only those this process serves
    # (and every job without a model: simulation tasks, jobs a River client inserted).
    args_filter = model_claim_filter(served)
    if config.worker.capacity == "fixed":
        return FixedCapacity(
            engine.queue,
            config.queue.name,
            _fixed_size(config),
            policy=engine.policy,
            load=engine.load,
            args_filter=args_filter,
            on_change=lambda: engine.metrics.generations_changed(len(engine.queue.generations)),
        ).run
    return CapacityRefresher(
        config.worker,
        engine.db,
        engine.queue,
        engine.queue.slots,
        policy=engine.policy,
        load=engine.load,
        sampler=sampler,
        observer=engine.metrics,
        args_filter=args_filter,
        models=served,
        on_state=engine.health.mark,
        hub=engine.queue.notifier.hub,
    ).run


def _fixed_size(config: EngineConfig) -> int:
    worker = config.worker
    # One generation runs at most MAX_WORKERS jobs, whatever the cluster-wide cap allows.
    return min(worker.instance_hard_limit or worker.hard_limit or UNBOUNDED_FALLBACK, MAX_WORKERS)


def _count_recovery(metrics: Metrics, report: RecoveryReport) -> None:
    for kind, n in attrs.asdict(report).items():
        metrics.count_recoveries(kind, n)


async def _gauges(
    engine: Engine, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
) -> None:
    """Refresh the gauges that no event updates, every few seconds."""
    metrics, queue = engine.metrics, engine.queue
    task_status.started()
    while True:
        metrics.set_queue_depth(await queue.counts())
        metrics.set_leader(queue.elector is not None and queue.elector.is_leader)
        metrics.generations_changed(len(queue.generations))
        waiting = await engine.db.tasks.fetch(_WAITING_BY_MODEL)
        metrics.set_admissions_waiting({row["model"]: row["waiting"] for row in waiting})
        await trio.sleep(_GAUGES_INTERVAL)
