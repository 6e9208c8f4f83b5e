"""``python -m engine bench chaos``: crash scenarios against real engine processes.

Each scenario runs on fresh databases with three worker processes
(:mod:`engine.bench.chaos_worker`: the full service, a simulated upstream of about 0.75 s per
task, and a ledger that records every upstream submission before the upstream accepts it). The
intervals are short (:data:`WORKER_SETTINGS`): heartbeat every 0.5 s, stale after 3 s, recovery
every 1 s, task leases of 3 s renewed every 1 s (a dead execution is detected by its lease as
soon as by its heartbeat). The bench process submits tasks open-loop at a steady rate (about
60 % of the 30 execution slots: 500 tasks at 25/s, quick 150 at 20/s), injects the fault a
third of the way through, keeps submitting, then waits (bounded: 60 s, quick 30 s) for every
task to be final.

``bench chaos`` runs every scenario twice: at those short intervals, then at the production
defaults (60 s leases renewed every 20 s, heartbeats every 5 s, stale after 45 s, a recovery round
every 15 s: :func:`production_settings`), where a dead worker's tasks wait out its stale window
before they move. The second pass's figures are prefixed ``production_``; its recovery target is
the stale window plus a scan interval (60 s) instead of 5 s, and the wait for the last tasks
grows by a lease and a stale window.

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
* ``scope_limits``: no fault; scope admissions and rate limits under contention. 1,000 tasks
  (quick 200) at 40/s, twice what the limits let through, over five models with concurrency
  limits 2, 3, 4, 5 and 6, two of them rate-limited (``sl-d`` 8 per 2 s, ``sl-e`` 5 per 1 s:
  both below what their slots could run), and three groups (``g-1`` limit 7, ``g-2`` limit 4,
  ``g-3`` unlimited with a rate limit of 20 per 1 s), written with ``Engine.set_model`` /
  ``set_group`` and read back from the catalogue. The wait for the last tasks is bounded at
  120 s (quick 60 s). Figures below.
* ``upstream_idempotent`` and ``upstream_once``: SIGKILL the worker with the most submissions
  in flight while an HTTP upstream (a fake on loopback, in the bench process) holds their
  answers for 2 s, on a model that sends an idempotency key and on one that does not; see
  :mod:`engine.bench.chaos_upstream` for their own figures and targets.
* ``pgbouncer_sigkill`` and ``pgbouncer_restart``: the workers reach the engine database only
  through a private PgBouncer in transaction pooling mode, with fewer server connections than
  they hold; SIGKILL a worker (LISTEN on a direct URL), or restart PgBouncer itself, cutting
  every connection the workers have (polling fallback, no LISTEN). See
  :mod:`engine.bench.chaos_pgbouncer`.

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
* ``seconds`` (instead of ``recovery_seconds`` in a scenario without a fault): from the first
  task's creation until the last one is final.
* per scenario: ``victim_running_tasks`` (tasks the killed worker was running),
  ``outage_seconds`` (how long ``pg_ctl restart`` took), ``backends_killed``,
  ``locked_tasks`` / ``blocked_claims`` (rows locked; jobs of locked tasks worked while the
  locks were held: ≥ 1 proves the lock-timeout path ran), ``locked_not_succeeded`` (locked
  tasks that did not end succeeded, target 0), ``hold_seconds``.

``scope_limits`` figures (the limits are those the catalogue holds):

* ``limit_exceeded_samples``: the bench samples ``engine_scope_lease`` every 20 ms (one
  statement, so one snapshot) on a connection of its own; each (sample, scope) where a scope
  holds more leases than its concurrency limit counts one. Target 0. ``samples`` is how many
  samples were taken; ``slots_exceeded_samples`` counts the same for leases plus reserved slots
  (admitted, not started: what admission itself counts against the limit), reported only;
  ``reserved_share`` is the share of the held slot-time that was reserved-not-started.
* ``limit_exceeded_events``: the same from the task events, between samples too. An execution
  runs from its ``task.started`` (unless the next event is ``task.waiting`` or
  ``task.rate_limited``: admission turned it away) to its final or requeue event; a sweep per
  model and group counts each time the running executions stayed above the limit for longer
  than 50 ms. Event times are stamped as admission commits and just after the release commits,
  in different trio tasks, so the intervals over-cover the slot: at a
  hand-over the next task's start can be stamped a few milliseconds before the previous one's
  end. Those boundary excesses are counted apart as ``limit_boundary_overlaps`` (reported
  only); a task running without its slot would overlap for most of its ~0.85 s run. Target 0.
  ``limit_exceeded_longest_seconds`` is the longest excess of either kind.
  ``peak_running_<scope>`` (the most executions at once for longer than 50 ms) and
  ``peak_leases_<scope>`` (sampled) next to ``concurrency_limit_<scope>`` show each limit was
  reached.
* ``rate_exceeded_windows``: from the ledger's submission times (what the upstream saw), per
  rate-limited scope of capacity ``C`` per interval ``I``: a token bucket lets at most
  ``C + floor(C * w / I)`` requests through in any window of length ``w``, ``2 C`` for
  ``w = I``. Every window ``[t, t + I]`` starting at a submission is checked; each over ``2 C``
  counts one. Target 0. So a reader can judge how tight that is: ``rate_window_max_<scope>``
  (most submissions in one such window, against ``rate_allowed_per_window_<scope>`` = 2 C),
  and ``rate_long_run_per_s_<scope>`` (submissions per second from the first to the last, the
  initial burst included) against ``rate_limit_per_s_<scope>`` (C / I). Ledger times follow the
  token by the prepare phase (50–150 ms), so they are what the upstream saw, not the bucket's
  own clock.
* ``admissions_waited`` (tasks that waited in line at least once), ``rate_limited_retries``
  (``task.rate_limited`` events): the limits bound.
"""

from __future__ import annotations

import functools
import logging
import math
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager, AsyncExitStack, asynccontextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Protocol

import attrs
import trio

from engine import embedded
from engine.bench.chaos_pgbouncer import (
    PGBOUNCER_TARGETS,
    evaluate_pgbouncer,
    pgbouncer_surroundings,
    restart_pgbouncer,
)
from engine.bench.chaos_upstream import (
    IDEMPOTENT_MODEL,
    ONCE_MODEL,
    SUBMIT_LATENCY,
    evaluate_upstream,
    kill_mid_submission,
    prepare_upstream,
    upstream_requests,
    upstream_surroundings,
)
from engine.bench.chaos_worker import LEDGER_DDL, LEDGER_TABLE, simulation_to_json
from engine.config import load_config
from engine.db.bridge import Connection, Record, connect
from engine.db.database import DatabaseUrls
from engine.db.resolve import scratch_database
from engine.errors import ConnectionLost, DatabaseError, UniqueViolation
from engine.providers.simulated import Latency, SimulationConfig
from engine.service.engine import Engine
from engine.service.root import open as open_engine
from engine.tasks.models import FINAL_STATUSES, Identity, RunMode, TaskRequest

__all__ = [
    "BENCH_APPLICATION",
    "CHAOS_SCENARIOS",
    "PRODUCTION_PREFIX",
    "SIMULATION",
    "TARGETS",
    "WORKER_SETTINGS",
    "BenchDatabases",
    "ChaosRun",
    "ChaosScenario",
    "ChaosSize",
    "FaultReport",
    "Monitor",
    "WorkerProcess",
    "production_settings",
    "run_chaos_bench",
    "run_chaos_scenario",
    "scenario_targets",
    "submitted_twice",
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

#: The prefix of the production pass's figures (``production_sigkill_worker_tasks_lost``).
PRODUCTION_PREFIX = "production_"


#: The intervals :data:`WORKER_SETTINGS` shortens; :func:`production_settings` gives them back.
_PRODUCTION_KEYS = (
    ("worker", "refresh_interval"),
    ("worker", "heartbeat_stale_factor"),
    ("recovery", "stale_after"),
    ("recovery", "interval"),
    ("tasks", "lease_ttl"),
    ("tasks", "lease_renew_interval"),
    ("worker", "stop_timeout"),
)


def production_settings() -> dict[str, str]:
    """The configuration defaults of every interval :data:`WORKER_SETTINGS` shortens: a
    production pass runs the workers with these on top."""
    defaults = load_config(env={})
    return {
        f"{section}.{name}": str(getattr(getattr(defaults, section), name))
        for section, name in _PRODUCTION_KEYS
    }


def _production_bound() -> float:
    """Recovery's bound at the production defaults: the stale window plus a scan interval."""
    defaults = load_config(env={})
    return defaults.recovery.stale_after + defaults.recovery.interval


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
class ChaosSize:
    """The load of a run."""

    tasks: int
    rate: float  # tasks per second
    final_wait: float  # seconds to wait for the last tasks after the arrivals end


_QUICK = ChaosSize(tasks=150, rate=20.0, final_wait=30.0)
_FULL = ChaosSize(tasks=500, rate=25.0, final_wait=60.0)


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
    #: A TOML configuration file every worker reads (``--config``), set by ``surroundings``.
    config_file: Path | None = None
    #: The engine database as the workers reach it (default :attr:`url`), set by
    #: ``surroundings`` (e.g. through a pooler).
    worker_url: str | None = None

    def alive(self) -> list[WorkerProcess]:
        """The workers not killed by the scenario."""
        return [w for w in self.workers if not w.killed]


#: An injector: called at the fault moment (arrivals keep running around it).
Injector = Callable[[ChaosRun], Awaitable[FaultReport]]


class Watcher(Protocol):
    """Runs alongside the load: started with ``nursery.start`` before the first arrival (it
    calls ``task_status.started()`` once watching), cancelled once every task is final."""

    def __call__(
        self, run: ChaosRun, *, task_status: trio.TaskStatus[None] = ...
    ) -> Awaitable[None]: ...


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

    ``scope_limits`` uses them so: ``prepare`` sets the limits, ``make_requests`` spreads the
    tasks over the models and groups, ``watch`` samples the held slots per scope, ``evaluate``
    reports ``limit_exceeded_samples`` and ``rate_exceeded_windows``; it has no ``inject``
    (``inject=None``), so it reports ``seconds`` instead of ``recovery_seconds``.
    """

    name: str
    #: None: no fault; the scenario reports ``seconds`` (submission of the first task until
    #: the last is final) instead of ``recovery_seconds``.
    inject: Injector | None
    settings: Mapping[str, str] = attrs.field(factory=dict)
    #: The workers' simulated upstream (default :data:`SIMULATION`, about 0.75 s a task).
    simulation: SimulationConfig = SIMULATION
    private_server: bool = False
    workers: int = _WORKERS
    #: The load (default: the common sizes, 150 tasks at 20/s quick, 500 at 25/s full).
    quick_size: ChaosSize = _QUICK
    full_size: ChaosSize = _FULL
    #: Entered before the workers start and left after they stopped: what the workers need
    #: around them (the HTTP scenarios' fake upstream, and ``run.config_file`` naming it).
    surroundings: Callable[[ChaosRun], AbstractAsyncContextManager[None]] | None = None
    prepare: Callable[[ChaosRun], Awaitable[None]] | None = None
    make_requests: Callable[[int], list[TaskRequest]] | None = None
    watch: Watcher | None = None
    evaluate: Callable[[ChaosRun], Awaitable[dict[str, float]]] | None = None
    targets: Mapping[str, tuple[str, float]] = attrs.field(factory=dict)


def _now() -> datetime:
    return datetime.now(UTC)


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


async def _spawn_worker(run: ChaosRun, index: int) -> WorkerProcess:
    settings = {**WORKER_SETTINGS, **run.scenario.settings}
    log_path = run.log_dir / f"{run.scenario.name}-worker-{index}.log"
    cmd = [
        sys.executable,
        "-m",
        "engine.bench.chaos_worker",
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


async def _completion_seconds(run: ChaosRun, measured_until: datetime) -> float:
    """The ``seconds`` figure: first submitted task created until the last one final (until
    ``measured_until`` if some never were)."""
    row = (
        await run.monitor.fetch(
            "SELECT min(created_at) AS first, max(finished_at) AS last,"
            " count(*) FILTER (WHERE finished_at IS NULL) AS open"
            " FROM engine_task WHERE id = ANY($1::uuid[])",
            run.submitted,
        )
    )[0]
    first: datetime | None = row["first"]
    if first is None:
        return 0.0
    end: datetime = measured_until if row["open"] or row["last"] is None else row["last"]
    return round((end - first).total_seconds(), 3)


async def submitted_twice(ledger_url: str) -> int:
    """Tasks with more than one row in the ledger at ``ledger_url``: seen twice upstream."""
    ledger = await connect(ledger_url, application_name=BENCH_APPLICATION)
    try:
        return int(
            await ledger.fetchval(
                f"SELECT count(*) FROM (SELECT task_id FROM {LEDGER_TABLE}"
                " GROUP BY task_id HAVING count(*) > 1) AS s"
            )
        )
    finally:
        await ledger.close()


async def _figures(
    run: ChaosRun, fault: FaultReport | None, measured_until: datetime
) -> dict[str, float]:
    counts = {
        r["status"]: int(r["n"])
        for r in await run.monitor.fetch(
            "SELECT status, count(*) AS n FROM engine_task WHERE id = ANY($1::uuid[])"
            " GROUP BY status",
            run.submitted,
        )
    }
    final = sum(n for status, n in counts.items() if status in _FINAL)
    twice = await submitted_twice(run.ledger_url)
    figures: dict[str, float] = {
        "tasks": float(len(run.submitted)),
        "tasks_lost": float(len(run.submitted) - final),
        "submitted_twice": float(twice),
    }
    if fault is None:
        figures["seconds"] = await _completion_seconds(run, measured_until)
    else:
        figures["recovery_seconds"] = await _recovery_seconds(run, fault.at, measured_until)
    figures["manual_review"] = float(counts.get("manual_review", 0))
    figures["tasks_failed"] = float(counts.get("failed", 0))
    if fault is not None:
        figures.update(fault.figures)
    return figures


@attrs.frozen
class BenchDatabases:
    """A run's databases and the bench's own view of them."""

    #: The engine database, and the ledger's (on the bench's server, away from the faults).
    url: str
    ledger_url: str
    monitor: Monitor
    #: A client-only engine on ``url`` (submits, reads), with :data:`_MODEL` in its catalogue.
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
        await client.set_model(_MODEL)
        yield BenchDatabases(url, ledger_url, monitor, client)


async def run_chaos_scenario(
    admin_url: str,
    scenario: ChaosScenario | str,
    *,
    quick: bool = False,
    log_dir: Path | None = None,
    production: bool = False,
) -> dict[str, float]:
    """Run one scenario on fresh databases of ``admin_url``'s server; its figures, unprefixed.
    ``production``: with the configuration's default intervals (60 s leases, stale after 45 s)
    instead of the short ones of :data:`WORKER_SETTINGS`.

    ``log_dir`` keeps the workers' logs (``<scenario>-worker-<n>.log``); by default they go to
    a temporary directory that is removed afterwards.
    """
    if isinstance(scenario, str):
        scenario = _BY_NAME[scenario]
    size = scenario.quick_size if quick else scenario.full_size
    if production:
        # The defaults under the scenario's own settings; the last tasks may wait out a whole
        # lease or stale window, so the wait for them grows by both.
        defaults = load_config(env={})
        scenario = attrs.evolve(
            scenario, settings={**production_settings(), **scenario.settings}
        )
        size = attrs.evolve(
            size,
            final_wait=size.final_wait + defaults.tasks.lease_ttl + defaults.recovery.stale_after,
        )
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
        dbs = await stack.enter_async_context(bench_databases(server_admin, admin_url))
        run = ChaosRun(
            scenario=scenario,
            quick=quick,
            url=dbs.url,
            server_admin_url=server_admin,
            ledger_url=dbs.ledger_url,
            monitor=dbs.monitor,
            client=dbs.client,
            log_dir=log_dir,
            server=server,
        )
        if scenario.surroundings is not None:
            await stack.enter_async_context(scenario.surroundings(run))
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
        fault: FaultReport | None = None
        async with trio.open_nursery() as watching:
            if scenario.watch is not None:
                await watching.start(scenario.watch, run)
            async with trio.open_nursery() as nursery:
                nursery.start_soon(_arrivals, run, requests, size.rate)
                if scenario.inject is not None:
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


async def kill_busiest(
    run: ChaosRun, *, counting: str = "", poll: float = 0.05
) -> tuple[WorkerProcess, int, datetime]:
    """SIGKILL the live worker running the most tasks (those matching the SQL condition
    ``counting`` too, if given), waiting up to 10 s for one; the victim, how many such tasks it
    ran, and when it was killed."""
    alive = {w.instance_id: w for w in run.alive()}
    with trio.fail_after(10):
        while True:
            rows = await run.monitor.fetch(
                "SELECT execution_owner, count(*) AS n FROM engine_task"
                " WHERE status = 'running' AND execution_owner = ANY($1::text[])"
                f"{' AND ' + counting if counting else ''}"
                " GROUP BY execution_owner ORDER BY n DESC LIMIT 1",
                list(alive),
            )
            if rows:
                break
            await trio.sleep(poll)
    victim = alive[rows[0]["execution_owner"]]
    at = _now()
    victim.proc.send_signal(signal.SIGKILL)
    victim.killed = True
    await victim.proc.wait()
    return victim, int(rows[0]["n"]), at


async def _sigkill_worker(run: ChaosRun) -> FaultReport:
    """SIGKILL the live worker with the most running tasks (waiting up to 10 s for one)."""
    _, running, at = await kill_busiest(run)
    return FaultReport(at, {"victim_running_tasks": float(running)})


async def _postgres_restart(run: ChaosRun) -> FaultReport:
    """``pg_ctl restart -m fast`` of the run's private server."""
    assert run.server is not None, "postgres_restart needs private_server=True"
    at = _now()
    start = trio.current_time()
    await trio.to_thread.run_sync(embedded.restart, run.server.data_dir)
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


# ---------------------------------------------------------------------------------------------
# scope_limits: concurrency and rate limits under contention (no fault)


@attrs.frozen
class _LimitedScope:
    """A model or group of the ``scope_limits`` catalogue and its share of the tasks."""

    kind: str  # "model" or "group"
    name: str
    share: float
    limit: int | None = None  # running tasks (None: unlimited)
    rate: tuple[int, float] | None = None  # at most rate[0] requests per rate[1] seconds

    @property
    def scope(self) -> str:
        return f"{self.kind}:{self.name}"


#: Shares roughly follow each model's throughput (about limit / 0.85 s a task, or its rate),
#: so that every model stays backlogged for most of the run. The rate limits bind: sl-d could
#: run about 6 tasks a second on its 5 slots, sl-e about 7 on its 6.
_SCOPE_MODELS = (
    _LimitedScope("model", "sl-a", 0.11, limit=2),
    _LimitedScope("model", "sl-b", 0.17, limit=3),
    _LimitedScope("model", "sl-c", 0.22, limit=4),
    _LimitedScope("model", "sl-d", 0.22, limit=5, rate=(8, 2.0)),
    _LimitedScope("model", "sl-e", 0.28, limit=6, rate=(5, 1.0)),
)
#: g-1 and g-2 get about 8 and 4 of the ~20 model slots by their share, so their limits bind
#: too; g-3's rate limit (20/s) is a second bucket on the same admission, not expected to bind.
_SCOPE_GROUPS = (
    _LimitedScope("group", "g-1", 0.4, limit=7),
    _LimitedScope("group", "g-2", 0.2, limit=4),
    _LimitedScope("group", "g-3", 0.4, rate=(20, 1.0)),
)
_SCOPE_SEED = 7
_SAMPLE_INTERVAL = 0.02  # seconds between two samples of the held slots

#: Every scope of the catalogue as admission reads it.
_CATALOGUE_SCOPES = """
SELECT 'model:' || name AS scope, concurrency_limit, rate_limit, rate_interval FROM engine_model
UNION ALL
SELECT 'group:' || key, concurrency_limit, rate_limit, rate_interval FROM engine_group
"""
#: Leases and reserved slots (admitted, not started) per scope, in one snapshot.
_HELD_SLOTS = """
SELECT scope, count(*) FILTER (WHERE lease) AS leases, count(*) AS slots
FROM (SELECT scope, true AS lease FROM engine_scope_lease
      UNION ALL
      SELECT unnest(scopes), false FROM engine_task_admission WHERE status = 'admitted') AS held
GROUP BY scope
"""
#: The history of the run's tasks, per task in order.
_RUN_EVENTS = """
SELECT e.task_id, e.type, e.at, t.model, t.group_key, t.finished_at
FROM engine_task_event e JOIN engine_task t ON t.id = e.task_id
WHERE e.task_id = ANY($1::uuid[])
ORDER BY e.task_id, e.at, e.id
"""
#: Events that end an execution that passed admission (its slot is released with them).
_RUN_ENDS = frozenset(
    {
        "task.succeeded",
        "task.failed",
        "task.cancelled",
        "task.manual_review",
        "task.requeued",
        "task.queued",
    }
)
#: Events right after ``task.started`` of an execution that did not pass admission.
_NOT_ADMITTED = frozenset({"task.waiting", "task.rate_limited"})


@attrs.define
class _ScopeWatch:
    """The limits of the run and what the sampler saw."""

    limits: dict[str, int]  # scope: concurrency limit
    rates: dict[str, tuple[int, float]]  # scope: (requests, per seconds)
    samples: int = 0
    leases_exceeded: int = 0
    slots_exceeded: int = 0
    peak_leases: dict[str, int] = attrs.field(factory=dict)
    peak_slots: dict[str, int] = attrs.field(factory=dict)
    #: Sums over the samples and limited scopes: slots held, and of those reserved for an
    #: admitted task that has not started yet.
    held_slots: int = 0
    reserved_slots: int = 0

    def record(self, rows: Sequence[Record]) -> None:
        """One sample: count each scope holding more than its limit."""
        self.samples += 1
        for row in rows:
            scope, leases, slots = row["scope"], int(row["leases"]), int(row["slots"])
            self.peak_leases[scope] = max(self.peak_leases.get(scope, 0), leases)
            self.peak_slots[scope] = max(self.peak_slots.get(scope, 0), slots)
            limit = self.limits.get(scope)
            if limit is None:
                continue
            self.held_slots += slots
            self.reserved_slots += slots - leases
            if leases > limit:
                self.leases_exceeded += 1
                log.warning(
                    "scope over its limit",
                    extra={"event": "chaos_scope_exceeded", "scope": scope, "leases": leases},
                )
            if slots > limit:
                self.slots_exceeded += 1


def _spread(count: int, shares: Sequence[float], rng: random.Random) -> list[int]:
    """``count`` indexes into ``shares``, each as often as its share (largest remainder),
    shuffled."""
    total = sum(shares)
    exact = [count * share / total for share in shares]
    counts = [int(x) for x in exact]
    by_remainder = sorted(range(len(shares)), key=lambda i: counts[i] - exact[i])
    for i in by_remainder[: count - sum(counts)]:
        counts[i] += 1
    out = [i for i, n in enumerate(counts) for _ in range(n)]
    rng.shuffle(out)
    return out


def _scope_requests(count: int) -> list[TaskRequest]:
    """``count`` tasks over the models and groups of :data:`_SCOPE_MODELS` and
    :data:`_SCOPE_GROUPS` by their shares, in a fixed random order."""
    rng = random.Random(_SCOPE_SEED)
    models = _spread(count, [m.share for m in _SCOPE_MODELS], rng)
    groups = _spread(count, [g.share for g in _SCOPE_GROUPS], rng)
    return [
        TaskRequest(
            model=_SCOPE_MODELS[m].name,
            payload={"n": n},
            identity=_IDENTITY,
            group_key=_SCOPE_GROUPS[g].name,
            run_mode=RunMode.SIMULATION,
        )
        for n, (m, g) in enumerate(zip(models, groups, strict=True))
    ]


async def _scope_prepare(run: ChaosRun) -> None:
    """Write the limits with ``Engine.set_model`` / ``set_group`` and read them back as
    admission reads them (the figures are judged against what the catalogue holds)."""
    for m in _SCOPE_MODELS:
        await run.client.set_model(
            m.name,
            concurrency_limit=m.limit,
            rate_limit=None if m.rate is None else m.rate[0],
            rate_interval=1.0 if m.rate is None else m.rate[1],
        )
    for g in _SCOPE_GROUPS:
        await run.client.set_group(
            g.name,
            concurrency_limit=g.limit,
            rate_limit=None if g.rate is None else g.rate[0],
            rate_interval=1.0 if g.rate is None else g.rate[1],
        )
    stored = {r["scope"]: r for r in await run.monitor.fetch(_CATALOGUE_SCOPES)}
    watch = _ScopeWatch(limits={}, rates={})
    for wanted in (*_SCOPE_MODELS, *_SCOPE_GROUPS):
        row = stored.get(wanted.scope)
        rate = (
            None
            if row is None or not row["rate_limit"]
            else (row["rate_limit"], row["rate_interval"])
        )
        if row is None or row["concurrency_limit"] != wanted.limit or rate != wanted.rate:
            raise RuntimeError(f"the catalogue does not hold the limits of {wanted}: {row}")
        if wanted.limit is not None:
            watch.limits[wanted.scope] = wanted.limit
        if wanted.rate is not None:
            watch.rates[wanted.scope] = wanted.rate
    run.notes["scope_watch"] = watch


async def _scope_watch(
    run: ChaosRun, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
) -> None:
    """Sample the held slots per scope every :data:`_SAMPLE_INTERVAL` on a connection of its
    own, until cancelled."""
    watch: _ScopeWatch = run.notes["scope_watch"]
    monitor = Monitor(run.url)
    try:
        watch.record(await monitor.fetch(_HELD_SLOTS))
        task_status.started()
        next_at = trio.current_time()
        while True:
            next_at = max(next_at + _SAMPLE_INTERVAL, trio.current_time())
            await trio.sleep_until(next_at)
            watch.record(await monitor.fetch(_HELD_SLOTS))
    finally:
        with trio.CancelScope(shield=True):
            await monitor.close()


@attrs.frozen
class _Execution:
    """An execution that passed admission: from its ``task.started`` to the event that ended
    it."""

    model: str
    group_key: str | None
    start: datetime
    end: datetime


def _executions(rows: Sequence[Record], measured_until: datetime) -> list[_Execution]:
    """The admitted executions in ``rows`` (:data:`_RUN_EVENTS`).

    ``task.started`` is written once admission let the run through (a run turned away writes
    ``task.waiting`` or ``task.rate_limited`` instead; older runs wrote ``task.started`` first,
    so an execution whose next event is one of those never held a slot either). Any other
    ends with its final (or requeue) event, written just after the release commits,
    or with the next ``task.started`` of the task, or with the task's ``finished_at`` (else
    ``measured_until``). So each interval covers the time the slot was held, a little more
    at both ends: counting them can over-report an excess at a boundary, never hide one."""
    out: list[_Execution] = []
    current: Record | None = None  # the task.started row of the open execution

    def close(end: datetime) -> None:
        assert current is not None
        out.append(_Execution(current["model"], current["group_key"], current["at"], end))

    for row in rows:
        if current is not None and row["task_id"] != current["task_id"]:
            close(current["finished_at"] or measured_until)
            current = None
        kind = row["type"]
        if kind == "task.started":
            if current is not None:
                close(row["at"])
            current = row
        elif current is not None and kind in _NOT_ADMITTED:
            current = None
        elif current is not None and kind in _RUN_ENDS:
            close(row["at"])
            current = None
    if current is not None:
        close(current["finished_at"] or measured_until)
    return out


#: How long an excess seen in the task events may last and still be the events' own
#: over-cover at a hand-over (see the module docstring): the next task's ``task.started`` is
#: stamped as its admission commits, the previous task's final event after its release commits, and
#: the two run in different trio tasks. The hand-over excesses seen so far lasted under a
#: millisecond; a task that ran without its slot would overlap for most of its ~0.85 s run.
_BOUNDARY_SLACK = 0.05


@attrs.frozen
class _Sweep:
    """What :func:`_running_over_limit` found."""

    #: Times the running executions stayed above a scope's limit for longer than the slack.
    excesses: int
    #: Shorter excesses: hand-overs the event stamps over-cover.
    boundary_overlaps: int
    #: The most executions a scope ran at once for longer than the slack.
    peaks: dict[str, int]
    #: The longest excess, in seconds (of either kind).
    longest: float


def _running_over_limit(executions: Sequence[_Execution], limits: Mapping[str, int]) -> _Sweep:
    """Sweep the executions per limited scope for times the running count stayed above the
    limit (see :class:`_Sweep`)."""
    points: dict[str, list[tuple[datetime, int]]] = {}
    for e in executions:
        scopes = [f"model:{e.model}"] + ([] if e.group_key is None else [f"group:{e.group_key}"])
        for scope in scopes:
            if scope in limits:
                points.setdefault(scope, []).extend([(e.start, 1), (e.end, -1)])
    excesses = overlaps = 0
    longest = 0.0
    peaks: dict[str, int] = {}
    for scope, changes in points.items():
        changes.sort()  # at the same instant an end (-1) comes before a start (+1)
        running = 0
        over_since: datetime | None = None
        for index, (at, delta) in enumerate(changes):
            running += delta
            if index + 1 < len(changes):
                held = (changes[index + 1][0] - at).total_seconds()
                if held > _BOUNDARY_SLACK:
                    peaks[scope] = max(peaks.get(scope, 0), running)
            if running > limits[scope] and over_since is None:
                over_since = at
            elif running <= limits[scope] and over_since is not None:
                lasted = (at - over_since).total_seconds()
                longest = max(longest, lasted)
                if lasted > _BOUNDARY_SLACK:
                    excesses += 1
                    log.warning(
                        "running tasks over the scope's limit",
                        extra={"event": "chaos_running_exceeded", "scope": scope, "at": at},
                    )
                else:
                    overlaps += 1
                over_since = None
    return _Sweep(excesses, overlaps, peaks, longest)


def _rate_windows(times: Sequence[datetime], capacity: int, interval: float) -> tuple[int, int]:
    """Check submission ``times`` against a token bucket of ``capacity`` tokens refilled at
    ``capacity`` per ``interval`` seconds.

    Such a bucket lets at most ``C + floor(C * w / I)`` requests through in any window of
    length ``w`` (full at its start, refilled during it); for ``w = I`` that is ``2 C``. Every
    window ``[t, t + I]`` starting at a submission is checked (the fullest window starts at
    one). Returns the windows over the bound and the largest count in one window."""
    stamps = sorted(t.timestamp() for t in times)
    allowed = capacity + math.floor(capacity * interval / interval)
    over = largest = 0
    j = 0
    for i, start in enumerate(stamps):
        while j < len(stamps) and stamps[j] <= start + interval:
            j += 1
        largest = max(largest, j - i)
        if j - i > allowed:
            over += 1
    return over, largest


def _long_run_rate(times: Sequence[datetime]) -> float:
    """Submissions per second from the first to the last one."""
    if len(times) < 2:
        return 0.0
    span = (max(times) - min(times)).total_seconds()
    return (len(times) - 1) / span if span > 0 else 0.0


def _figure_key(scope: str) -> str:
    return scope.replace(":", "_").replace("-", "_")


async def _scope_evaluate(run: ChaosRun) -> dict[str, float]:
    """The ``scope_limits`` figures (see the module docstring)."""
    watch: _ScopeWatch = run.notes["scope_watch"]
    rows = await run.monitor.fetch(_RUN_EVENTS, run.submitted)
    executions = _executions(rows, _now())
    sweep = _running_over_limit(executions, watch.limits)
    figures: dict[str, float] = {
        "samples": float(watch.samples),
        "limit_exceeded_samples": float(watch.leases_exceeded),
        "slots_exceeded_samples": float(watch.slots_exceeded),
        "limit_exceeded_events": float(sweep.excesses),
        "limit_boundary_overlaps": float(sweep.boundary_overlaps),
        "limit_exceeded_longest_seconds": round(sweep.longest, 3),
        "reserved_share": round(watch.reserved_slots / max(1, watch.held_slots), 3),
        "admissions_waited": float(
            len({r["task_id"] for r in rows if r["type"] == "task.waiting"})
        ),
        "rate_limited_retries": float(sum(r["type"] == "task.rate_limited" for r in rows)),
    }
    for scope, limit in watch.limits.items():
        key = _figure_key(scope)
        figures[f"concurrency_limit_{key}"] = float(limit)
        figures[f"peak_leases_{key}"] = float(watch.peak_leases.get(scope, 0))
        figures[f"peak_running_{key}"] = float(sweep.peaks.get(scope, 0))
    ledger = await connect(run.ledger_url, application_name=BENCH_APPLICATION)
    try:
        submissions = await ledger.fetch(f"SELECT task_id, at FROM {LEDGER_TABLE}")
    finally:
        await ledger.close()
    scopes_of = {
        r["id"]: (f"model:{r['model']}", f"group:{r['group_key']}")
        for r in await run.monitor.fetch(
            "SELECT id, model, group_key FROM engine_task WHERE id = ANY($1::uuid[])",
            run.submitted,
        )
    }
    over_total = 0
    for scope, (capacity, interval) in watch.rates.items():
        times = [r["at"] for r in submissions if scope in scopes_of.get(r["task_id"], ())]
        over, largest = _rate_windows(times, capacity, interval)
        over_total += over
        key = _figure_key(scope)
        figures[f"rate_allowed_per_window_{key}"] = float(2 * capacity)
        figures[f"rate_window_max_{key}"] = float(largest)
        figures[f"rate_limit_per_s_{key}"] = round(capacity / interval, 3)
        figures[f"rate_long_run_per_s_{key}"] = round(_long_run_rate(times), 3)
    figures["rate_exceeded_windows"] = float(over_total)
    return figures


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
    ChaosScenario(
        "scope_limits",
        None,  # no fault: the limits under contention are the test
        prepare=_scope_prepare,
        make_requests=_scope_requests,
        watch=_scope_watch,
        evaluate=_scope_evaluate,
        # Arrivals at twice the ~20 tasks/s the limits allow, so every scope backs up.
        quick_size=ChaosSize(tasks=200, rate=40.0, final_wait=60.0),
        full_size=ChaosSize(tasks=1000, rate=40.0, final_wait=120.0),
        targets={
            "tasks_failed": ("<=", 0.0),
            "limit_exceeded_samples": ("<=", 0.0),
            "limit_exceeded_events": ("<=", 0.0),
            "rate_exceeded_windows": ("<=", 0.0),
        },
    ),
    # Real upstreams (engine/bench/chaos_upstream.py): a kill while the upstream holds the
    # submissions, with and without an idempotency key.
    *(
        ChaosScenario(
            name,
            kill_mid_submission,
            surroundings=upstream_surroundings,
            prepare=prepare_upstream,
            make_requests=upstream_requests(model),
            evaluate=evaluate_upstream,
            quick_size=ChaosSize(tasks=120, rate=20.0, final_wait=45.0),
            full_size=ChaosSize(tasks=400, rate=25.0, final_wait=90.0),
            targets={
                "in_flight_at_kill": (">=", 1.0),
                "accepted_twice": ("<=", 0.0),
                # Work flows again once a resumed task completes, which takes one upstream
                # answer (SUBMIT_LATENCY) after its claim.
                "recovery_seconds": ("<=", 5.0 + SUBMIT_LATENCY),
                **extra,
            },
        )
        for name, model, extra in (
            ("upstream_idempotent", IDEMPOTENT_MODEL, {"manual_review": ("<=", 0.0)}),
            ("upstream_once", ONCE_MODEL, {"manual_review_beyond_in_flight": ("<=", 0.0)}),
        )
    ),
    # Through PgBouncer in transaction pooling mode (engine/bench/chaos_pgbouncer.py).
    *(
        ChaosScenario(
            name,
            inject,
            surroundings=pgbouncer_surroundings,
            evaluate=evaluate_pgbouncer,
            targets=PGBOUNCER_TARGETS,
        )
        for name, inject in (
            ("pgbouncer_sigkill", _sigkill_worker),
            ("pgbouncer_restart", restart_pgbouncer),
        )
    ),
]

_BY_NAME = {s.name: s for s in CHAOS_SCENARIOS}

#: Targets of every scenario, by the scenario's own figure names.
_COMMON_TARGETS: Mapping[str, tuple[str, float]] = {
    "tasks_lost": ("<=", 0.0),
    "submitted_twice": ("<=", 0.0),
    "recovery_seconds": ("<=", 5.0),
}


def scenario_targets(
    scenario: ChaosScenario, *, production: bool = False
) -> dict[str, tuple[str, float]]:
    """The scenario's targets, by its unprefixed figure names (no ``recovery_seconds`` without
    a fault). ``production``: recovery's bound is the production stale window plus a scan
    interval instead of the short intervals' 5 s (a scenario's own slack on top is kept)."""
    common = {
        k: v
        for k, v in _COMMON_TARGETS.items()
        if scenario.inject is not None or k != "recovery_seconds"
    }
    targets = {**common, **scenario.targets}
    if production and "recovery_seconds" in targets:
        op, bound = targets["recovery_seconds"]
        short = _COMMON_TARGETS["recovery_seconds"][1]
        targets["recovery_seconds"] = (op, bound - short + _production_bound())
    return targets


def _all_targets() -> dict[str, tuple[str, float]]:
    return {
        f"{prefix}{s.name}_{key}": target
        for prefix, production in (("", False), (PRODUCTION_PREFIX, True))
        for s in CHAOS_SCENARIOS
        for key, target in scenario_targets(s, production=production).items()
    }


#: Every scenario's targets, by prefixed figure name (what ``bench chaos`` checks).
TARGETS: dict[str, tuple[str, float]] = _all_targets()


async def run_chaos_bench(
    admin_url: str, *, quick: bool = False, log_dir: Path | None = None
) -> dict[str, float]:
    """Run every scenario of :data:`CHAOS_SCENARIOS` on ``admin_url``'s server twice: at the
    short intervals, then at the production defaults; their figures, each prefixed with the
    scenario's name (and :data:`PRODUCTION_PREFIX` for the second pass)."""
    results: dict[str, float] = {}
    for prefix, production in (("", False), (PRODUCTION_PREFIX, True)):
        for scenario in CHAOS_SCENARIOS:
            figures = await run_chaos_scenario(
                admin_url, scenario, quick=quick, log_dir=log_dir, production=production
            )
            results.update({f"{prefix}{scenario.name}_{k}": v for k, v in figures.items()})
    return results
