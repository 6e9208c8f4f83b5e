"""The pieces of a chaos run: a throw-away private server, the worker processes (started,
waited for, stopped), submissions at a steady rate that ride out database outages, the waits for
every task to be final, and the bench's fresh databases. ``bench soak`` builds its run from
them too.
"""

from __future__ import annotations

import functools
import logging
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path

import attrs
import trio

from engine import embedded
from engine.bench.chaos.run import (
    BENCH_APPLICATION,
    FINAL,
    IDENTITY,
    MODEL,
    WORKER_SETTINGS,
    ChaosRun,
    ChaosScenario,
    Monitor,
    WorkerProcess,
)
from engine.bench.chaos.worker import LEDGER_DDL, simulation_to_json
from engine.config import load_config
from engine.db.bridge import connect
from engine.db.database import DatabaseUrls
from engine.db.resolve import scratch_database
from engine.domain.tasks import RunMode, TaskRequest
from engine.embedded import EmbeddedServer
from engine.errors import DatabaseError, UniqueViolation
from engine.service.engine import Engine
from engine.service.root import open as open_engine

__all__ = [
    "BenchDatabases",
    "arrivals",
    "bench_databases",
    "default_requests",
    "phase",
    "private_server",
    "spawn_worker",
    "stop_workers",
    "submit",
    "wait_allocated",
    "wait_final",
]

log = logging.getLogger("engine.bench.chaos")

_BATCH_INTERVAL = 0.1  # seconds between two submission batches
_READY_TIMEOUT = 60.0
_STOP_TIMEOUT = 15.0


def _server_dir() -> Path:
    path = Path(tempfile.mkdtemp(prefix="engine-chaos-pg-"))
    path.chmod(0o755)  # the server user must be able to enter it when we run as root
    return path


@asynccontextmanager
async def private_server() -> AsyncIterator[EmbeddedServer]:
    """A throw-away embedded server in a temporary directory, stopped and removed on exit."""
    data_dir = await trio.to_thread.run_sync(_server_dir)
    try:
        server = await trio.to_thread.run_sync(
            functools.partial(embedded.acquire, data_dir, unsafe_fast=True)
        )
        try:
            yield server
        finally:
            with trio.CancelScope(shield=True):
                await trio.to_thread.run_sync(server.release)
    finally:
        shutil.rmtree(data_dir, ignore_errors=True)


async def spawn_worker(run: ChaosRun, index: int) -> WorkerProcess:
    """Start worker ``index`` of ``run`` (``python -m engine.bench.chaos.worker``, its stderr in
    ``run.log_dir``) and wait until it says it is ready; it is added to ``run.workers``."""
    settings = {**WORKER_SETTINGS, **run.scenario.settings}
    log_path = run.log_dir / f"{run.scenario.name}-worker-{index}.log"
    cmd = [
        sys.executable,
        "-m",
        "engine.bench.chaos.worker",
        "--url",
        run.worker_url or run.url,
        "--ledger-url",
        run.ledger_url,
        "--sim",
        simulation_to_json(run.scenario.simulation),
    ]
    for key, value in settings.items():
        cmd += ["--set", f"{key}={value}"]
    if run.config_file is not None:
        cmd += ["--config", str(run.config_file)]
    with log_path.open("ab") as log_file:
        proc = await trio.lowlevel.open_process(cmd, stdout=subprocess.PIPE, stderr=log_file)
    assert proc.stdout is not None
    worker = WorkerProcess(proc, "", log_path)
    run.workers.append(worker)
    line = b""
    with trio.fail_after(_READY_TIMEOUT):
        while not line.endswith(b"\n"):
            chunk = await proc.stdout.receive_some(1)
            if not chunk:
                tail = log_path.read_text(errors="replace")[-2000:]
                raise RuntimeError(f"chaos worker {index} exited before it was ready:\n{tail}")
            line += chunk
    text = line.decode().strip()
    if not text.startswith("ready "):
        raise RuntimeError(f"chaos worker {index} said {text!r} instead of 'ready <id>'")
    worker.instance_id = text.removeprefix("ready ")
    return worker


async def stop_workers(run: ChaosRun) -> None:
    """SIGTERM every live worker, SIGKILL whoever is still there after a while."""
    with trio.CancelScope(shield=True):
        for worker in run.alive():
            if worker.proc.returncode is None:
                worker.proc.send_signal(signal.SIGTERM)
        with trio.move_on_after(_STOP_TIMEOUT):
            for worker in run.workers:
                await worker.proc.wait()
        for worker in run.workers:
            if worker.proc.returncode is None:
                worker.proc.kill()
                await worker.proc.wait()
            if worker.proc.stdout is not None:
                await worker.proc.stdout.aclose()


def default_requests(count: int) -> list[TaskRequest]:
    """``count`` simulated tasks of :data:`~engine.bench.chaos.run.MODEL`."""
    return [
        TaskRequest(
            model=MODEL,
            payload={"n": n},
            identity=IDENTITY,
            run_mode=RunMode.SIMULATION,
        )
        for n in range(count)
    ]


async def submit(run: ChaosRun, batch: Sequence[TaskRequest], *, patience: float = 60.0) -> None:
    """Submit ``batch`` (one transaction), retrying while the database is away; an attempt whose
    answer was lost but which committed shows up as a unique violation on the retry."""
    ids = [r.id for r in batch]
    with trio.fail_after(patience):
        while True:
            try:
                await run.client.submit(list(batch))
                break
            except UniqueViolation:
                found = await run.monitor.fetchval(
                    "SELECT count(*) FROM engine_task WHERE id = ANY($1::uuid[])", ids
                )
                if found == len(ids):
                    break
            except DatabaseError as exc:
                log.info("submission retried", extra={"event": "chaos_submit_retry", "error": exc})
            await trio.sleep(0.1)
    run.submitted.extend(ids)


async def arrivals(run: ChaosRun, requests: list[TaskRequest], rate: float) -> None:
    """Submit ``requests`` open-loop: a batch every 100 ms at ``rate`` tasks per second (a late
    batch does not delay the schedule of the next ones)."""
    per_batch = max(1, round(rate * _BATCH_INTERVAL))
    start = trio.current_time()
    for i, offset in enumerate(range(0, len(requests), per_batch)):
        await trio.sleep_until(start + i * _BATCH_INTERVAL)
        await submit(run, requests[offset : offset + per_batch])


async def wait_final(run: ChaosRun, deadline: float) -> None:
    """Wait until every submitted task is final, or until ``deadline`` (trio time)."""
    with trio.move_on_at(deadline):
        while True:
            left = await run.monitor.fetchval(
                "SELECT count(*) FROM engine_task WHERE id = ANY($1::uuid[])"
                " AND status <> ALL($2::text[])",
                run.submitted,
                FINAL,
            )
            if left == 0:
                return
            await trio.sleep(0.2)


@attrs.frozen
class BenchDatabases:
    """A run's databases and the bench's own view of them."""

    #: The engine database, and the ledger's (on the bench's server, away from the faults).
    url: str
    ledger_url: str
    monitor: Monitor
    #: A client-only engine on ``url`` (submits, reads), with :data:`MODEL` in its catalogue.
    client: Engine


@asynccontextmanager
async def bench_databases(
    engine_admin_url: str, ledger_admin_url: str, *, prefix: str = "engine_chaos_"
) -> AsyncIterator[BenchDatabases]:
    """A fresh, migrated engine database on ``engine_admin_url``'s server and a ledger database
    on ``ledger_admin_url``'s, with the bench's monitor and client on the engine database; all
    dropped on exit."""
    async with AsyncExitStack() as stack:
        url = await stack.enter_async_context(
            scratch_database(engine_admin_url, prefix, application_name=BENCH_APPLICATION)
        )
        ledger_url = await stack.enter_async_context(
            scratch_database(
                ledger_admin_url, prefix, migrated=False, application_name=BENCH_APPLICATION
            )
        )
        ledger = await connect(ledger_url, application_name=BENCH_APPLICATION)
        try:
            await ledger.execute(LEDGER_DDL)
        finally:
            await ledger.close()
        monitor = Monitor(url, patience=120.0)
        stack.push_async_callback(monitor.close)
        client_config = load_config(
            env={},
            overrides={
                "worker.mode": "client",
                "database.migrate_on_start": "false",
                "tasks.demo_catalogue": "false",
                "metrics.enabled": "false",
            },
        )
        client = await stack.enter_async_context(
            open_engine(client_config, urls=DatabaseUrls.single(url), control=False)
        )
        await client.set_model(MODEL)
        yield BenchDatabases(url, ledger_url, monitor, client)


def phase(scenario: ChaosScenario, what: str) -> None:
    """Log (at debug) that ``scenario`` reached ``what``."""
    log.debug(what, extra={"event": "chaos_phase", "scenario": scenario.name})


async def wait_allocated(run: ChaosRun) -> None:
    """Wait until every worker is registered with a share of the capacity."""
    with trio.fail_after(_READY_TIMEOUT):
        while True:
            ready = await run.monitor.fetchval(
                "SELECT count(*) FROM engine_worker_instance"
                " WHERE status = 'active' AND allocated > 0 AND instance_id = ANY($1::text[])",
                [w.instance_id for w in run.workers],
            )
            if ready == len(run.workers):
                return
            await trio.sleep(0.1)
