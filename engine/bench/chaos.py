"""``python -m engine bench chaos``: crash scenarios against real engine processes (issue 7 §4).

Each scenario runs on fresh databases with three worker processes
(:mod:`engine.bench.chaos_worker`: the full service, a simulated upstream of about 0.75 s per
task, and a ledger that records every upstream submission before the upstream accepts it). The
intervals are short (:data:`WORKER_SETTINGS`): heartbeat every 0.5 s, stale after 3 s, recovery
every 1 s, task leases of 3 s renewed every 1 s (a dead execution is detected by its lease as
soon as by its heartbeat). The bench process submits tasks open-loop at a steady rate (about
60 % of the 30 execution slots: 500 tasks at 25/s, quick 150 at 20/s), injects the fault a
third of the way through, keeps submitting, then waits (bounded: 60 s, quick 30 s) for every
task to be final.

Scenarios (:data:`CHAOS_SCENARIOS`):

* ``sigkill_worker``: SIGKILL the worker running the most tasks.
* ``postgres_restart``: ``pg_ctl restart -m fast`` of the database server; the engine database
  lives on a private embedded server for this one, so restarting it hurts nobody else.
* ``backend_kill``: ``pg_terminate_backend`` of every ``engine%`` connection to the engine
  database (workers and the bench's own submitting client; restricted to that database so
  other users of the server are spared).
* ``lock_timeout``: workers run with ``database.lock_timeout = 0.2``; the bench submits a batch
  due one second later and holds ``SELECT … FOR UPDATE`` on those queued rows for 3 s, so the
  workers' claims hit SQLSTATE 55P03. The tasks must come back and complete after the release,
  and none may fail.
* ``scope_limits`` (scope admissions and rate limits) is not here yet; it is added to
  :data:`CHAOS_SCENARIOS`, and :data:`TARGETS` follows; :class:`ChaosScenario` shows how.

Figures, each prefixed with the scenario name (``sigkill_worker_tasks_lost``…):

* ``tasks``: tasks submitted (committed) by the bench.
* ``tasks_lost``: submitted tasks not in a final status (succeeded, failed, cancelled,
  manual_review) when the bounded wait ends. Target 0.
* ``submitted_twice``: tasks with more than one row in the ledger (the upstream saw them twice,
  or may have). Target 0.
* ``recovery_seconds``: from the fault ``F`` (for ``lock_timeout``: the release of the locks)
  until all work moves again, i.e. the later of

  - every task that existed and was not final at ``F`` has either been claimed by a new
    execution after ``F`` (its first ``task.started`` event after ``F``) or reached a final
    status after ``F``, and
  - a task claimed after ``F`` has completed (work flows end to end).

  "Existed and was not final at ``F``" is ``created_at <= F`` and no ``finished_at`` before
  ``F``, read from the rows afterwards, so it needs no racy snapshot; event times are the
  workers' clocks, ``F`` the bench's, all on one host. A task that never moves makes it the
  length of the whole wait (so the target is missed). Target ≤ 5 s.
* ``manual_review``: tasks in manual review; expected only for submissions that were in flight
  (sent, answer not recorded) at the fault. They are final, not lost.
* ``tasks_failed``: tasks that failed. The simulated upstream never fails, so each is a wrong
  outcome caused by the fault (target 0 for ``lock_timeout``; reported for the others).
* per scenario: ``victim_running_tasks`` (tasks the killed worker was running),
  ``outage_seconds`` (how long ``pg_ctl restart`` took), ``backends_killed``,
  ``locked_tasks`` / ``blocked_claims`` (rows locked; jobs of locked tasks worked while the
  locks were held: ≥ 1 proves the lock-timeout path ran), ``locked_not_succeeded`` (locked
  tasks that did not end succeeded, target 0), ``hold_seconds``.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import attrs
import trio

from engine.bench.chaos_worker import LEDGER_DDL, LEDGER_TABLE, simulation_to_json
from engine.config import load_config
from engine.db import embedded
from engine.db.bridge import Connection, Record, connect
from engine.db.database import DatabaseUrls
from engine.db.dsn import replace_database
from engine.db.migrate import migrate
from engine.errors import ConnectionLost, DatabaseError, UniqueViolation
from engine.providers.simulated import Latency, SimulationConfig
from engine.service.engine import Engine, open_engine
from engine.tasks.models import FINAL_STATUSES, Identity, RunMode, TaskRequest

__all__ = [
    "BENCH_APPLICATION",
    "CHAOS_SCENARIOS",
    "SIMULATION",
    "TARGETS",
    "WORKER_SETTINGS",
    "ChaosRun",
    "ChaosScenario",
    "FaultReport",
    "Monitor",
    "WorkerProcess",
    "restart_server",
    "run_chaos_bench",
    "run_chaos_scenario",
    "scenario_targets",
]

log = logging.getLogger(__name__)

#: The bench's own connections; not ``engine%``, so ``backend_kill`` spares them.
BENCH_APPLICATION = "chaos-bench"

#: Worker settings of every scenario: a heartbeat every 0.5 s, stale after 3 s (6 refreshes,
#: and recovery's own threshold), a recovery round every second, 4 s task leases.
WORKER_SETTINGS: Mapping[str, str] = {
    "worker.refresh_interval": "0.5",
    "worker.heartbeat_stale_factor": "6",
    "recovery.stale_after": "3",
    "recovery.interval": "1",
    "tasks.lease_ttl": "3",
    "tasks.lease_renew_interval": "1",
    "metrics.enabled": "false",
    "tasks.demo_catalogue": "false",
    "database.migrate_on_start": "false",
    "worker.hard_limit": "30",
    "worker.stop_timeout": "2",
}

#: The simulated upstream: ~0.1 s prepare, ~0.08 s submit, 3 polls 0.2 s apart, ~0.1 s
#: finalize (about 0.75 s a task); it never fails and never loses an answer, so every failed
#: or manual-review task is the fault's doing.
SIMULATION = SimulationConfig(
    prepare=Latency("uniform", 0.05, 0.15),
    submit=Latency("uniform", 0.05, 0.1),
    poll=Latency("fixed", 0.02),
    finalize=Latency("uniform", 0.05, 0.15),
    polls=3,
    poll_interval=0.2,
)

_MODEL = "chaos-sim"
_IDENTITY = Identity(tenant_id="chaos", user_id="chaos")
_FINAL = sorted(s.value for s in FINAL_STATUSES)
_WORKERS = 3
_BATCH_INTERVAL = 0.1  # seconds between two submission batches
_FAULT_AT = 0.35  # the fault comes when this fraction of the arrivals has been submitted
_READY_TIMEOUT = 60.0
_STOP_TIMEOUT = 15.0


@attrs.frozen
class _Size:
    tasks: int
    rate: float  # tasks per second
    final_wait: float  # seconds to wait for the last tasks after the arrivals end


_QUICK = _Size(tasks=150, rate=20.0, final_wait=30.0)
_FULL = _Size(tasks=500, rate=25.0, final_wait=60.0)


# ---------------------------------------------------------------------------------------------
# The harness


@attrs.frozen
class FaultReport:
    """What an injector did: the instant recovery is measured from, and its own figures."""

    at: datetime
    figures: dict[str, float] = attrs.field(factory=dict)


@attrs.define
class WorkerProcess:
    """One worker process of a run."""

    proc: trio.Process
    instance_id: str
    log_path: Path
    killed: bool = False


class Monitor:
    """The bench's view of the engine database: one connection that reconnects and retries
    while the server is away (``postgres_restart``)."""

    def __init__(self, url: str, *, patience: float = 60.0) -> None:
        self.url = url
        self.patience = patience
        self._conn: Connection | None = None

    async def _connection(self) -> Connection:
        if self._conn is None or self._conn.is_closed():
            self._conn = await connect(self.url, application_name=BENCH_APPLICATION)
        return self._conn

    async def fetch(self, query: str, *args: Any) -> list[Record]:
        """Rows of ``query``; a lost connection is retried for up to ``patience`` seconds."""
        with trio.fail_after(self.patience):
            while True:
                try:
                    conn = await self._connection()
                    return await conn.fetch(query, *args)
                except ConnectionLost:
                    await self.close()
                    await trio.sleep(0.1)

    async def fetchval(self, query: str, *args: Any) -> Any:
        """The first value of ``query``'s first row (None without rows)."""
        rows = await self.fetch(query, *args)
        return rows[0][0] if rows else None

    async def close(self) -> None:
        """Close the connection (the next query reconnects)."""
        if self._conn is not None:
            conn, self._conn = self._conn, None
            await conn.close()


@attrs.define
class ChaosRun:
    """Everything the hooks of a scenario may use during one run."""

    scenario: ChaosScenario
    quick: bool
    #: The engine database, and an admin URL of its server.
    url: str
    server_admin_url: str
    #: The ledger database (always on the bench's server, away from the faults).
    ledger_url: str
    monitor: Monitor
    client: Engine
    log_dir: Path
    #: The private embedded server of the run, if the scenario asked for one.
    server: embedded.EmbeddedServer | None = None
    workers: list[WorkerProcess] = attrs.field(factory=list)
    #: Ids of the tasks the bench submitted (committed), in order.
    submitted: list[uuid.UUID] = attrs.field(factory=list)
    #: Free-form state a scenario's hooks share (e.g. the ids ``inject`` locked).
    notes: dict[str, Any] = attrs.field(factory=dict)

    def alive(self) -> list[WorkerProcess]:
        """The workers not killed by the scenario."""
        return [w for w in self.workers if not w.killed]


#: An injector: called at the fault moment (arrivals keep running around it).
Injector = Callable[[ChaosRun], Awaitable[FaultReport]]


@attrs.frozen
class ChaosScenario:
    """A crash scenario; add one to :data:`CHAOS_SCENARIOS` to run it.

    A run, and where each hook comes in::

        fresh databases, 3 workers up         settings: on top of WORKER_SETTINGS
        prepare(run)                          e.g. models with limits and rate limits
        load starts: make_requests(count),    open-loop; watch(run) runs alongside the
          submitted at the scenario's rate    load (e.g. sampling) until every task is final
        inject(run) a third of the way in     the fault; returns FaultReport(at, figures)
        bounded wait for every task final
        evaluate(run)                         figures of its own, from what it recorded

    ``notes`` on :class:`ChaosRun` carries state between the hooks. Figures of ``inject`` and
    ``evaluate`` are prefixed with the scenario name like the common ones; ``targets`` are the
    scenario's own targets by unprefixed name. ``private_server`` puts the engine database on
    a private embedded server (``run.server``).

    The ``scope_limits`` scenario of issue 7 (1,000 tasks over 5 models with concurrency limits
    and a rate limit) fits as: ``prepare`` sets the limits, ``make_requests`` spreads the tasks
    over the models, ``inject`` is a fault under those limits (e.g. :func:`_sigkill_worker`:
    the dead worker's scope slots must come back), ``watch`` samples running executions per
    scope and ``evaluate`` reports ``limit_exceeded_samples`` and ``rate_exceeded_windows``
    with targets ``("<=", 0.0)``.
    """

    name: str
    inject: Injector
    settings: Mapping[str, str] = attrs.field(factory=dict)
    private_server: bool = False
    workers: int = _WORKERS
    prepare: Callable[[ChaosRun], Awaitable[None]] | None = None
    make_requests: Callable[[int], list[TaskRequest]] | None = None
    watch: Callable[[ChaosRun], Awaitable[None]] | None = None
    evaluate: Callable[[ChaosRun], Awaitable[dict[str, float]]] | None = None
    targets: Mapping[str, tuple[str, float]] = attrs.field(factory=dict)


def _now() -> datetime:
    return datetime.now(UTC)


@asynccontextmanager
async def _fresh_database(admin_url: str, *, migrated: bool) -> AsyncIterator[str]:
    """A new database on ``admin_url``'s server (migrated if asked); dropped on exit."""
    name = f"engine_chaos_{uuid.uuid4().hex[:10]}"
    admin = await connect(admin_url, application_name=BENCH_APPLICATION)
    try:
        await admin.execute(f'CREATE DATABASE "{name}"')
    finally:
        await admin.close()
    url = replace_database(admin_url, name)
    try:
        if migrated:
            conn = await connect(url, application_name=BENCH_APPLICATION)
            try:
                await migrate(conn)
            finally:
                await conn.close()
        yield url
    finally:
        with trio.CancelScope(shield=True), trio.move_on_after(30):
            admin = await connect(admin_url, application_name=BENCH_APPLICATION)
            try:
                await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            finally:
                await admin.close()


def _server_dir() -> Path:
    path = Path(tempfile.mkdtemp(prefix="engine-chaos-pg-"))
    path.chmod(0o755)  # the server user must be able to enter it when we run as root
    return path


@asynccontextmanager
async def _private_server() -> AsyncIterator[embedded.EmbeddedServer]:
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


def restart_server(server: embedded.EmbeddedServer) -> None:
    """``pg_ctl restart -m fast`` of an embedded server, as the user owning its cluster.

    Blocking; the server's start options are kept (pg_ctl reuses ``postmaster.opts``).
    """
    data_dir = server.data_dir
    pgdata = data_dir / "pgdata"
    state = json.loads((data_dir / "engine-pg.json").read_text())
    exec_bindir = state.get("exec_bindir")
    bindir = Path(exec_bindir) if exec_bindir else embedded.find_bindir(data_dir)
    cmd = [
        str(bindir / "pg_ctl"),
        "-D", str(pgdata),
        "-m", "fast",
        "-w", "-t", "60",
        "-l", str(data_dir / "server.log"),
        "restart",
    ]  # fmt: skip
    env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
    if os.geteuid() == 0:
        owner = pgdata.stat()
        result = subprocess.run(
            cmd,
            cwd="/",
            env=env,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
            user=owner.st_uid,
            group=owner.st_gid,
            extra_groups=[],
        )
    else:
        result = subprocess.run(
            cmd,
            cwd="/",
            env=env,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
    if result.returncode != 0:
        raise RuntimeError(
            f"pg_ctl restart failed (exit {result.returncode}): "
            f"{(result.stdout + result.stderr).strip()}"
        )


async def _spawn_worker(run: ChaosRun, index: int) -> WorkerProcess:
    settings = {**WORKER_SETTINGS, **run.scenario.settings}
    log_path = run.log_dir / f"{run.scenario.name}-worker-{index}.log"
    cmd = [
        sys.executable,
        "-m",
        "engine.bench.chaos_worker",
        "--url",
        run.url,
        "--ledger-url",
        run.ledger_url,
        "--sim",
        simulation_to_json(SIMULATION),
    ]
    for key, value in settings.items():
        cmd += ["--set", f"{key}={value}"]
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


async def _stop_workers(run: ChaosRun) -> None:
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


def _default_requests(count: int) -> list[TaskRequest]:
    return [
        TaskRequest(
            model=_MODEL,
            payload={"n": n},
            identity=_IDENTITY,
            run_mode=RunMode.SIMULATION,
        )
        for n in range(count)
    ]


async def _submit(run: ChaosRun, batch: Sequence[TaskRequest], *, patience: float = 60.0) -> None:
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


async def _arrivals(run: ChaosRun, requests: list[TaskRequest], rate: float) -> None:
    """Submit ``requests`` open-loop: a batch every 100 ms at ``rate`` tasks per second (a late
    batch does not delay the schedule of the next ones)."""
    per_batch = max(1, round(rate * _BATCH_INTERVAL))
    start = trio.current_time()
    for i, offset in enumerate(range(0, len(requests), per_batch)):
        await trio.sleep_until(start + i * _BATCH_INTERVAL)
        await _submit(run, requests[offset : offset + per_batch])


async def _wait_final(run: ChaosRun, deadline: float) -> None:
    """Wait until every submitted task is final, or until ``deadline`` (trio time)."""
    with trio.move_on_at(deadline):
        while True:
            left = await run.monitor.fetchval(
                "SELECT count(*) FROM engine_task WHERE id = ANY($1::uuid[])"
                " AND status <> ALL($2::text[])",
                run.submitted,
                _FINAL,
            )
            if left == 0:
                return
            await trio.sleep(0.2)


async def _recovery_seconds(run: ChaosRun, fault: datetime, measured_until: datetime) -> float:
    """The ``recovery_seconds`` figure (see the module docstring)."""
    rows = await run.monitor.fetch(
        """
        WITH interrupted AS (
            SELECT t.id, t.finished_at
            FROM engine_task t
            WHERE t.created_at <= $1 AND (t.finished_at IS NULL OR t.finished_at > $1)
        ),
        moved AS (
            SELECT i.id,
                   least(
                       (SELECT min(e.at) FROM engine_task_event e
                        WHERE e.task_id = i.id AND e.type = 'task.started' AND e.at > $1),
                       i.finished_at
                   ) AS at
            FROM interrupted i
        )
        SELECT count(*) AS interrupted,
               count(*) FILTER (WHERE at IS NULL) AS never_moved,
               max(at) AS last_moved
        FROM moved
        """,
        fault,
    )
    interrupted, never_moved = rows[0]["interrupted"], rows[0]["never_moved"]
    last_moved: datetime | None = rows[0]["last_moved"]
    flow = await run.monitor.fetchval(
        """
        SELECT min(t.finished_at)
        FROM engine_task t
        WHERE t.status = 'succeeded' AND t.finished_at > $1
          AND (SELECT max(e.at) FROM engine_task_event e
               WHERE e.task_id = t.id AND e.type = 'task.started') > $1
        """,
        fault,
    )
    log.debug(
        "recovery measured",
        extra={
            "event": "chaos_recovery",
            "interrupted": interrupted,
            "never_moved": never_moved,
            "last_moved": last_moved,
            "flow": flow,
        },
    )
    if never_moved or flow is None:
        return round((measured_until - fault).total_seconds(), 3)
    end: datetime = max(flow, last_moved) if last_moved is not None else flow
    return round(max(0.0, (end - fault).total_seconds()), 3)


async def _figures(run: ChaosRun, fault: FaultReport, measured_until: datetime) -> dict[str, float]:
    counts = {
        r["status"]: int(r["n"])
        for r in await run.monitor.fetch(
            "SELECT status, count(*) AS n FROM engine_task WHERE id = ANY($1::uuid[])"
            " GROUP BY status",
            run.submitted,
        )
    }
    final = sum(n for status, n in counts.items() if status in _FINAL)
    ledger = await connect(run.ledger_url, application_name=BENCH_APPLICATION)
    try:
        twice = await ledger.fetchval(
            f"SELECT count(*) FROM (SELECT task_id FROM {LEDGER_TABLE}"
            " GROUP BY task_id HAVING count(*) > 1) AS s"
        )
    finally:
        await ledger.close()
    figures: dict[str, float] = {
        "tasks": float(len(run.submitted)),
        "tasks_lost": float(len(run.submitted) - final),
        "submitted_twice": float(twice),
        "recovery_seconds": await _recovery_seconds(run, fault.at, measured_until),
        "manual_review": float(counts.get("manual_review", 0)),
        "tasks_failed": float(counts.get("failed", 0)),
    }
    figures.update(fault.figures)
    return figures


async def run_chaos_scenario(
    admin_url: str,
    scenario: ChaosScenario | str,
    *,
    quick: bool = False,
    log_dir: Path | None = None,
) -> dict[str, float]:
    """Run one scenario on fresh databases of ``admin_url``'s server; its figures, unprefixed.

    ``log_dir`` keeps the workers' logs (``<scenario>-worker-<n>.log``); by default they go to
    a temporary directory that is removed afterwards.
    """
    if isinstance(scenario, str):
        scenario = _BY_NAME[scenario]
    size = _QUICK if quick else _FULL
    async with AsyncExitStack() as stack:
        if log_dir is None:
            tmp = Path(tempfile.mkdtemp(prefix="engine-chaos-logs-"))
            stack.callback(shutil.rmtree, tmp, ignore_errors=True)
            log_dir = tmp
        log_dir.mkdir(parents=True, exist_ok=True)
        server: embedded.EmbeddedServer | None = None
        server_admin = admin_url
        if scenario.private_server:
            server = await stack.enter_async_context(_private_server())
            server_admin = server.dsn("postgres")
        url = await stack.enter_async_context(_fresh_database(server_admin, migrated=True))
        ledger_url = await stack.enter_async_context(_fresh_database(admin_url, migrated=False))
        ledger = await connect(ledger_url, application_name=BENCH_APPLICATION)
        try:
            await ledger.execute(LEDGER_DDL)
        finally:
            await ledger.close()
        monitor = Monitor(url)
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
            open_engine(client_config, urls=DatabaseUrls.single(url), execute=False)
        )
        await client.set_model(_MODEL)
        run = ChaosRun(
            scenario=scenario,
            quick=quick,
            url=url,
            server_admin_url=server_admin,
            ledger_url=ledger_url,
            monitor=monitor,
            client=client,
            log_dir=log_dir,
            server=server,
        )
        stack.push_async_callback(_stop_workers, run)
        async with trio.open_nursery() as nursery:
            for index in range(scenario.workers):
                nursery.start_soon(_spawn_worker, run, index)
        await _wait_allocated(run)
        _phase(scenario, "workers ready")
        if scenario.prepare is not None:
            await scenario.prepare(run)
        make = scenario.make_requests or _default_requests
        requests = make(size.tasks)
        fault_delay = _FAULT_AT * len(requests) / size.rate
        async with trio.open_nursery() as watching:
            if scenario.watch is not None:
                watching.start_soon(scenario.watch, run)
            async with trio.open_nursery() as nursery:
                nursery.start_soon(_arrivals, run, requests, size.rate)
                await trio.sleep(fault_delay)
                fault = await scenario.inject(run)
                _phase(scenario, "fault injected")
            await _wait_final(run, trio.current_time() + size.final_wait)
            watching.cancel_scope.cancel()
        measured_until = _now()
        _phase(scenario, "tasks final")
        figures = await _figures(run, fault, measured_until)
        if scenario.evaluate is not None:
            figures.update(await scenario.evaluate(run))
    _phase(scenario, "cleaned up")
    return figures


def _phase(scenario: ChaosScenario, what: str) -> None:
    log.debug(what, extra={"event": "chaos_phase", "scenario": scenario.name})


async def _wait_allocated(run: ChaosRun) -> None:
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


# ---------------------------------------------------------------------------------------------
# The faults


async def _sigkill_worker(run: ChaosRun) -> FaultReport:
    """SIGKILL the live worker with the most running tasks (waiting up to 10 s for one)."""
    alive = {w.instance_id: w for w in run.alive()}
    with trio.fail_after(10):
        while True:
            rows = await run.monitor.fetch(
                "SELECT execution_owner, count(*) AS n FROM engine_task"
                " WHERE status = 'running' AND execution_owner = ANY($1::text[])"
                " GROUP BY execution_owner ORDER BY n DESC LIMIT 1",
                list(alive),
            )
            if rows:
                break
            await trio.sleep(0.05)
    victim = alive[rows[0]["execution_owner"]]
    at = _now()
    victim.proc.send_signal(signal.SIGKILL)
    victim.killed = True
    await victim.proc.wait()
    return FaultReport(at, {"victim_running_tasks": float(rows[0]["n"])})


async def _postgres_restart(run: ChaosRun) -> FaultReport:
    """``pg_ctl restart -m fast`` of the run's private server."""
    assert run.server is not None, "postgres_restart needs private_server=True"
    at = _now()
    start = trio.current_time()
    await trio.to_thread.run_sync(restart_server, run.server)
    outage = trio.current_time() - start
    return FaultReport(at, {"outage_seconds": round(outage, 3)})


async def _backend_kill(run: ChaosRun) -> FaultReport:
    """Terminate every ``engine%`` connection to the engine database."""
    at = _now()
    killed = await run.monitor.fetchval(
        "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM pg_stat_activity"
        " WHERE application_name LIKE 'engine%' AND pid <> pg_backend_pid()"
        " AND datname = current_database()"
    )
    return FaultReport(at, {"backends_killed": float(killed)})


_LOCKED_BATCH = 20
_LOCK_DUE = 1.0  # the locked batch comes due this long after it is submitted
_LOCK_HOLD = 3.0  # and its rows stay locked this long after submission


async def _lock_timeout(run: ChaosRun) -> FaultReport:
    """Lock a batch of queued tasks while they come due; release after ``_LOCK_HOLD`` s."""
    due = _now() + timedelta(seconds=_LOCK_DUE)
    batch = [
        TaskRequest(
            model=_MODEL,
            payload={"locked": n},
            identity=_IDENTITY,
            run_mode=RunMode.SIMULATION,
            run_at=due,
        )
        for n in range(_LOCKED_BATCH)
    ]
    start = trio.current_time()
    holder = await connect(run.url, application_name=BENCH_APPLICATION)
    try:
        await _submit(run, batch)
        locked_at = _now()
        async with holder.transaction():
            rows = await holder.fetch(
                "SELECT id FROM engine_task WHERE id = ANY($1::uuid[]) AND status = 'queued'"
                " FOR UPDATE SKIP LOCKED",
                [r.id for r in batch],
            )
            await trio.sleep_until(start + _LOCK_HOLD)
            at = _now()
    finally:
        await holder.close()
    locked = [r["id"] for r in rows]
    run.notes["locked"] = locked
    blocked = await run.monitor.fetchval(
        "SELECT count(*) FROM river_job WHERE args ->> 'task_id' = ANY($1::text[])"
        " AND attempted_at >= $2 AND attempted_at <= $3",
        [str(i) for i in locked],
        locked_at,
        at,
    )
    return FaultReport(
        at,
        {
            "locked_tasks": float(len(locked)),
            "blocked_claims": float(blocked),
            "hold_seconds": round((at - locked_at).total_seconds(), 3),
        },
    )


async def _lock_timeout_outcome(run: ChaosRun) -> dict[str, float]:
    """``locked_not_succeeded``: locked tasks that did not end succeeded (requeued and run)."""
    locked: list[uuid.UUID] = run.notes.get("locked", [])
    succeeded = await run.monitor.fetchval(
        "SELECT count(*) FROM engine_task WHERE id = ANY($1::uuid[]) AND status = 'succeeded'",
        locked,
    )
    return {"locked_not_succeeded": float(len(locked) - succeeded)}


#: The scenarios ``bench chaos`` runs, in order. ``scope_limits`` joins them with the scope
#: admissions and rate limits (engine/admission): see :class:`ChaosScenario`.
CHAOS_SCENARIOS: list[ChaosScenario] = [
    ChaosScenario("sigkill_worker", _sigkill_worker),
    ChaosScenario("postgres_restart", _postgres_restart, private_server=True),
    ChaosScenario("backend_kill", _backend_kill),
    ChaosScenario(
        "lock_timeout",
        _lock_timeout,
        # Claims give up after 0.2 s on a locked row; the batch made due by the scheduler.
        settings={"database.lock_timeout": "0.2", "queue.scheduler_interval": "0.25"},
        evaluate=_lock_timeout_outcome,
        targets={
            "tasks_failed": ("<=", 0.0),
            "locked_not_succeeded": ("<=", 0.0),
            "blocked_claims": (">=", 1.0),
        },
    ),
]

_BY_NAME = {s.name: s for s in CHAOS_SCENARIOS}

#: Targets of every scenario, by the scenario's own figure names.
_COMMON_TARGETS: Mapping[str, tuple[str, float]] = {
    "tasks_lost": ("<=", 0.0),
    "submitted_twice": ("<=", 0.0),
    "recovery_seconds": ("<=", 5.0),
}


def scenario_targets(scenario: ChaosScenario) -> dict[str, tuple[str, float]]:
    """The scenario's targets, by its unprefixed figure names."""
    return {**_COMMON_TARGETS, **scenario.targets}


def _all_targets() -> dict[str, tuple[str, float]]:
    return {
        f"{s.name}_{key}": target
        for s in CHAOS_SCENARIOS
        for key, target in scenario_targets(s).items()
    }


#: Every scenario's targets, by prefixed figure name (what ``bench chaos`` checks).
TARGETS: dict[str, tuple[str, float]] = _all_targets()


async def run_chaos_bench(
    admin_url: str, *, quick: bool = False, log_dir: Path | None = None
) -> dict[str, float]:
    """Run every scenario of :data:`CHAOS_SCENARIOS` on ``admin_url``'s server; their figures,
    each prefixed with the scenario's name."""
    results: dict[str, float] = {}
    for scenario in CHAOS_SCENARIOS:
        figures = await run_chaos_scenario(admin_url, scenario, quick=quick, log_dir=log_dir)
        results.update({f"{scenario.name}_{k}": v for k, v in figures.items()})
    return results
