"""What a chaos scenario is and what one run of it holds: :class:`ChaosScenario` and its
hooks, :class:`ChaosRun`, the load sizes, the workers' settings (short intervals, or the
production defaults), and :class:`Monitor`, the bench's own connection to the engine database.
"""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable, Mapping
from contextlib import AbstractAsyncContextManager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

import attrs
import trio

from engine.config import load_config
from engine.db.bridge import Connection, Record, connect
from engine.domain.tasks import FINAL_STATUSES, Identity, TaskRequest
from engine.embedded import EmbeddedServer
from engine.errors import ConnectionLost
from engine.providers.simulated import Latency, SimulationConfig
from engine.service.engine import Engine

__all__ = [
    "BENCH_APPLICATION",
    "FINAL",
    "IDENTITY",
    "MODEL",
    "PRODUCTION_PREFIX",
    "SIMULATION",
    "WORKER_SETTINGS",
    "ChaosRun",
    "ChaosScenario",
    "ChaosSize",
    "FaultReport",
    "Injector",
    "Monitor",
    "Watcher",
    "WorkerProcess",
    "production_bound",
    "production_settings",
    "utc_now",
]

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


def production_bound() -> float:
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

#: The model of the default tasks (in the bench client's catalogue), and their identity.
MODEL = "chaos-sim"
IDENTITY = Identity(tenant_id="chaos", user_id="chaos")
#: The final statuses, as the database writes them.
FINAL = sorted(s.value for s in FINAL_STATUSES)
_WORKERS = 3


@attrs.frozen
class ChaosSize:
    """The load of a run."""

    tasks: int
    rate: float  # tasks per second
    final_wait: float  # seconds to wait for the last tasks after the arrivals end


_QUICK = ChaosSize(tasks=150, rate=20.0, final_wait=30.0)
_FULL = ChaosSize(tasks=500, rate=25.0, final_wait=60.0)


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
    server: EmbeddedServer | None = None
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
    """A crash scenario; add one to
    :data:`~engine.bench.chaos.scenarios.CHAOS_SCENARIOS` to run it.

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


def utc_now() -> datetime:
    """The time now, in UTC (the bench's clock for fault instants)."""
    return datetime.now(UTC)
