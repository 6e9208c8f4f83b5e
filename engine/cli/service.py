"""``python -m engine run`` and ``migrate``: the service's own commands.

``run`` runs the service tree (:func:`engine.service.root.serve`) as the command line runs it:
metrics and the dashboard on unless configured off, the demo simulation and, on an empty
database, the demo catalogue (:mod:`engine.cli.catalogue`); signals as
:func:`~engine.cli.signals.serve_until_signal` handles them. ``migrate`` applies pending
migrations to every configured database and reports them. ``demo`` starts the same service
(:func:`start_service`).
"""

from __future__ import annotations

import argparse
import functools
import logging
import sys
from collections.abc import Sequence

import attrs
import trio

from engine.cli.catalogue import DEMO_SIMULATION, install_demo_catalogue
from engine.cli.exits import EXIT_INTERRUPTED, EXIT_OK
from engine.cli.signals import Shutdown, serve_until_signal
from engine.config import EngineConfig
from engine.db.bridge import asyncio_loop
from engine.db.database import open_database
from engine.db.dsn import redact
from engine.db.migrate import MigrationReport
from engine.db.resolve import migrate_databases, open_urls
from engine.providers.simulated import SimulatedProvider
from engine.service.engine import Engine
from engine.service.root import serve

__all__ = ["run_migrate", "run_service", "service_config", "start_service"]

log = logging.getLogger("engine.cli")


def service_config(config: EngineConfig) -> EngineConfig:
    """The configuration as the command line's service runs it: metrics and the dashboard on
    unless ``metrics.enabled`` / ``dashboard.enabled`` say otherwise (an embedded engine has
    them off unless it says on)."""
    if config.metrics.enabled is None:
        config = attrs.evolve(config, metrics=attrs.evolve(config.metrics, enabled=True))
    if config.dashboard.enabled is None:
        config = attrs.evolve(config, dashboard=attrs.evolve(config.dashboard, enabled=True))
    return config


async def start_service(
    config: EngineConfig, nursery: trio.Nursery, shutdown: Shutdown | None = None
) -> Engine:
    """Start the service tree in ``nursery`` as the command line runs it (demo simulation,
    demo catalogue on an empty database) and print where its metrics are."""
    eng: Engine = await nursery.start(
        functools.partial(
            serve, service_config(config), simulated=SimulatedProvider(DEMO_SIMULATION)
        )
    )
    if shutdown is not None:
        shutdown.on_second = eng.stop_draining
    if config.tasks.demo_catalogue:
        await install_demo_catalogue(eng)
    if eng.metrics_url is not None:
        print(f"engine: metrics at {eng.metrics_url}", flush=True)
    if eng.dashboard_url is not None:
        print(f"engine: dashboard at {eng.dashboard_url}", flush=True)
    return eng


def run_service(_args: argparse.Namespace, config: EngineConfig) -> int:
    """Run ``run``: the service until the first signal, then drain; exit 0."""

    async def run(shutdown: Shutdown) -> None:
        async with trio.open_nursery() as nursery:
            eng = await start_service(config, nursery, shutdown)
            served = ", ".join(sorted(eng.runner.providers)) or "none (simulation tasks only)"
            print(
                f"engine: running; database {redact(eng.urls.tasks)}; models {served} "
                "(Ctrl-C to stop)",
                flush=True,
            )

    signame = trio.run(serve_until_signal, run)
    if signame is not None:
        log.info("stopped", extra={"event": "shutdown_complete", "signal": signame})
    return EXIT_OK


def _format_versions(versions: Sequence[int]) -> str:
    return ", ".join(f"{v:04d}" for v in versions) if versions else "none"


def run_migrate(_args: argparse.Namespace, config: EngineConfig) -> int:
    """Run ``migrate``: apply pending migrations and print, per database, the versions
    applied, skipped and already applied."""
    reports: list[tuple[str, MigrationReport]] = []

    async def run_migrations(_shutdown: Shutdown) -> None:
        async with (
            asyncio_loop(),
            open_urls(config.database, config.data_dir) as urls,
            open_database(
                urls, config.database, min_size=1, max_size=1, application_name="engine-migrate"
            ) as db,
        ):
            reports.extend(await migrate_databases(db, river_indexes=config.queue.river_indexes))

    if trio.run(serve_until_signal, run_migrations) is not None:
        print("engine: migration interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    for url, report in reports:
        print(f"database: {url}")
        print(f"  applied: {_format_versions(report.applied)}")
        print(f"  skipped: {_format_versions(report.skipped)}")
        print(f"  already applied: {_format_versions(report.already)}")
        if report.indexes_created:
            print(f"  River indexes built: {', '.join(report.indexes_created)}")
    return EXIT_OK
