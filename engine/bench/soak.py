"""``python -m engine bench soak --minutes M``: steady load for M minutes at the production lease
settings, with a random fault every few tens of seconds.

Three worker processes (the chaos workers of :mod:`engine.bench.chaos.worker`: the full service,
a simulated upstream whose every submission is first written to a ledger) run on a private
embedded server, with the engine's default intervals: 60 s task leases renewed every 20 s,
heartbeats every 5 s, stale after 45 s, a recovery round every 15 s (whatever the defaults say,
read from the configuration). The bench submits about 2 tasks a second, each about 10 s long
(prepare 0.1 s, then 5 polls 2 s apart: mostly waiting upstream, so leases are renewed), and
every 20–60 s (uniformly at random, seeded) injects one fault, chosen at random (``--quick``: a
3-minute soak, each kind in turn):

* ``sigkill``: SIGKILL a worker (a new one starts in its place 5 s later);
* ``sigterm``: SIGTERM a worker (a graceful stop; a new one starts when it has exited);
* ``postgres_restart``: ``pg_ctl restart -m fast`` of the server;
* ``backend_kill``: ``pg_terminate_backend`` of every engine connection;
* ``partition``: one worker's every database connection is cut, and new ones refused, for
  20–50 s (it still reaches its upstream), then let through again. Each worker reaches the
  server through a TCP proxy of its own in the bench process, which is how it is cut off.

Worker 0 is never killed or stopped (it may be partitioned): it runs the whole soak, so its
resident memory over time is the growth figure.

Figures:

* ``tasks``, ``tasks_succeeded``: submitted (committed) and succeeded;
* ``tasks_lost``: not final when the final wait ends (bounded: a lease, a stale window and
  60 s after the last submission). Target 0;
* ``submitted_twice``: tasks with more than one ledger row. Target 0;
* ``tasks_stuck``: tasks seen ``running`` (sampled every 5 s) under an owner that had been
  dead (killed or stopped) for longer than recovery's bound, ``max(lease_ttl, stale_after) +
  interval + 10 s``. Target 0;
* ``manual_review_dead_owner``: tasks in manual review because their owner died between the
  upstream call and its answer (expected, rarely: a kill in that window);
  ``manual_review_live_owner``: the others (the simulated upstream never loses an answer, so
  each is a live owner giving up on a task). Target 0;
* ``tasks_failed``: failed tasks (the simulated upstream never fails);
* ``faults`` and ``faults_<kind>``: how many of each were injected;
* ``rss_start_mb``, ``rss_end_mb``, ``rss_growth_mb_per_hour``: worker 0's resident memory
  after the warm-up (the first tenth of the run, at least 60 s), at the end, and the slope of a
  least-squares line through its samples (every 10 s) after the warm-up, per hour.
"""

from __future__ import annotations

import logging
import random
import signal
import tempfile
import time
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import trio

from engine.bench.chaos.faults import backend_kill, postgres_restart
from engine.bench.chaos.harness import (
    bench_databases,
    private_server,
    spawn_worker,
    stop_workers,
    submit,
    wait_final,
)
from engine.bench.chaos.report import status_counts, submitted_twice
from engine.bench.chaos.run import (
    IDENTITY,
    MODEL,
    ChaosRun,
    ChaosScenario,
    WorkerProcess,
    production_settings,
)
from engine.bench.proxy import TcpProxy, tcp_proxy
from engine.config import load_config
from engine.domain.tasks import RunMode, TaskRequest
from engine.providers.simulated import Latency, SimulationConfig

__all__ = ["TARGETS", "run_soak_bench"]

log = logging.getLogger(__name__)

TARGETS: dict[str, tuple[str, float]] = {
    "tasks_lost": ("<=", 0.0),
    "submitted_twice": ("<=", 0.0),
    "tasks_stuck": ("<=", 0.0),
    "manual_review_live_owner": ("<=", 0.0),
}

_SIMULATION = SimulationConfig(
    prepare=Latency("fixed", 0.1), polls=5, poll_interval=2.0, finalize=Latency("fixed", 0.05)
)
_RATE = 2.0  # tasks per second
_FAULT_GAP = (20.0, 60.0)
_PARTITION = (20.0, 50.0)
_RESPAWN_DELAY = 5.0
_SAMPLE_EVERY = 5.0
_RSS_EVERY = 10.0
_FAULTS = ("sigkill", "sigterm", "postgres_restart", "backend_kill", "partition")
#: Dead-owner manual reviews: the two messages of "owner died between call and answer".
_DEAD_OWNER_MESSAGES = (
    "owner died after submitting upstream",
    "submitted upstream with no recorded outcome",
)


def _rss_mb(pid: int) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def _slope_per_hour(samples: list[tuple[float, float]]) -> float:
    """Least-squares slope of (seconds, MB) samples, in MB per hour."""
    if len(samples) < 2:
        return 0.0
    n = len(samples)
    mean_t = sum(t for t, _ in samples) / n
    mean_v = sum(v for _, v in samples) / n
    var = sum((t - mean_t) ** 2 for t, _ in samples)
    if var == 0:
        return 0.0
    cov = sum((t - mean_t) * (v - mean_v) for t, v in samples)
    return cov / var * 3600


class _Soak:
    """One soak run: the workers, their proxies, the faults and the samples."""

    def __init__(self, run: ChaosRun, seconds: float, seed: int) -> None:
        self.run = run
        self.seconds = seconds
        self.rng = random.Random(seed)
        self.proxies: dict[str, TcpProxy] = {}
        self.dead_since: dict[str, float] = {}  # instance id → monotonic time it died
        self.faults: dict[str, int] = {kind: 0 for kind in _FAULTS}
        self.stuck: set[Any] = set()
        self.rss: list[tuple[float, float]] = []
        self.witness: WorkerProcess | None = None
        self.nursery: trio.Nursery | None = None
        self.started = time.monotonic()
        self.worker_urls: list[str] = []
        self.bound = 0.0

    async def spawn(self, index: int) -> WorkerProcess:
        """Start worker ``index`` behind a proxy of its own."""
        assert self.nursery is not None
        proxy: TcpProxy = await self.nursery.start(self._serve_proxy, self.run.url)
        real = self.run.url
        self.run.url = proxy.url(real)  # spawn_worker hands run.url to the worker
        try:
            worker = await spawn_worker(self.run, index)
        finally:
            self.run.url = real
        self.proxies[worker.instance_id] = proxy
        return worker

    async def _serve_proxy(self, url: str, *, task_status: trio.TaskStatus[TcpProxy]) -> None:
        async with tcp_proxy(url) as proxy:
            task_status.started(proxy)
            await trio.sleep_forever()

    async def arrivals(self, until: float) -> None:
        """Submit ``_RATE`` tasks a second until ``until`` (monotonic)."""
        n = 0
        start = trio.current_time()
        while time.monotonic() < until:
            batch = [
                TaskRequest(
                    model=MODEL,
                    payload={"n": n + i},
                    identity=IDENTITY,
                    run_mode=RunMode.SIMULATION,
                )
                for i in range(max(1, round(_RATE)))
            ]
            n += len(batch)
            await submit(self.run, batch, patience=120.0)
            await trio.sleep_until(start + n / _RATE)

    async def faults_loop(self, until: float) -> None:
        """A random fault every 20–60 s until ``until``."""
        index = len(self.run.workers)
        while True:
            await trio.sleep(self.rng.uniform(*_FAULT_GAP))
            if time.monotonic() >= until:
                return
            done = sum(self.faults.values())
            # A quick soak takes each kind in turn, so a few minutes try every one of them.
            kind = _FAULTS[done % len(_FAULTS)] if self.run.quick else self.rng.choice(_FAULTS)
            self.faults[kind] += 1
            log.info("soak fault", extra={"event": "soak_fault", "kind": kind})
            if kind in ("sigkill", "sigterm"):
                victims = [w for w in self.run.alive() if w is not self.witness]
                if not victims:
                    continue
                victim = self.rng.choice(victims)
                victim.proc.send_signal(signal.SIGKILL if kind == "sigkill" else signal.SIGTERM)
                victim.killed = True
                self.dead_since[victim.instance_id] = time.monotonic()
                with trio.move_on_after(60):
                    await victim.proc.wait()
                await trio.sleep(_RESPAWN_DELAY)
                await self.spawn(index)
                index += 1
            elif kind == "postgres_restart":
                await postgres_restart(self.run)
            elif kind == "backend_kill":
                await backend_kill(self.run)
            else:
                worker = self.rng.choice(self.run.alive())
                proxy = self.proxies[worker.instance_id]
                proxy.cut()
                await trio.sleep(self.rng.uniform(*_PARTITION))
                proxy.heal()

    async def sample(self) -> None:
        """Every few seconds: tasks stuck under dead owners; the witness's memory."""
        next_rss = 0.0
        while True:
            now = time.monotonic()
            gone = [i for i, t in self.dead_since.items() if now - t > self.bound]
            if gone:
                rows = await self.run.monitor.fetch(
                    "SELECT id FROM engine_task WHERE status = 'running'"
                    " AND execution_owner = ANY($1::text[])",
                    gone,
                )
                self.stuck.update(r["id"] for r in rows)
            if now >= next_rss and self.witness is not None:
                rss = _rss_mb(self.witness.proc.pid)
                if rss is not None:
                    self.rss.append((now - self.started, rss))
                next_rss = now + _RSS_EVERY
            await trio.sleep(_SAMPLE_EVERY)


async def run_soak_bench(
    admin_url: str, *, quick: bool = False, minutes: float | None = None, seed: int = 1
) -> dict[str, float]:
    """Soak for ``minutes`` (default 60; quick: 3) on a private server; see the module
    docstring. ``admin_url``'s server holds the ledger, away from the faults."""
    seconds = 60.0 * (minutes if minutes is not None else (3.0 if quick else 60.0))
    settings = production_settings()
    scenario = ChaosScenario(
        "soak", None, settings=settings, simulation=_SIMULATION, private_server=True
    )
    defaults = load_config(env={})
    bound = max(defaults.tasks.lease_ttl, defaults.recovery.stale_after)
    bound += defaults.recovery.interval + 10.0
    async with AsyncExitStack() as stack:
        log_dir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="engine-soak-")))
        server = await stack.enter_async_context(private_server())
        dbs = await stack.enter_async_context(
            bench_databases(server.dsn("postgres"), admin_url, prefix="engine_soak_")
        )
        run = ChaosRun(
            scenario=scenario,
            quick=quick,
            url=dbs.url,
            server_admin_url=server.dsn("postgres"),
            ledger_url=dbs.ledger_url,
            monitor=dbs.monitor,
            client=dbs.client,
            log_dir=log_dir,
            server=server,
        )
        soak = _Soak(run, seconds, seed)
        soak.bound = bound
        stack.push_async_callback(stop_workers, run)
        async with trio.open_nursery() as proxies:
            soak.nursery = proxies
            soak.witness = await soak.spawn(0)
            for index in (1, 2):
                await soak.spawn(index)
            soak.started = time.monotonic()
            until = soak.started + seconds
            async with trio.open_nursery() as sampling:
                sampling.start_soon(soak.sample)
                async with trio.open_nursery() as load:
                    load.start_soon(soak.arrivals, until)
                    load.start_soon(soak.faults_loop, until)
                await wait_final(run, trio.current_time() + bound + 60.0)
                sampling.cancel_scope.cancel()
            figures = await _figures(soak)
            await stop_workers(run)
            proxies.cancel_scope.cancel()
    return figures


async def _figures(soak: _Soak) -> dict[str, float]:
    run = soak.run
    counts = await status_counts(run)
    final = sum(counts.get(s, 0) for s in ("succeeded", "failed", "cancelled", "manual_review"))
    reviews = await run.monitor.fetch(
        "SELECT error->>'message' AS message FROM engine_task"
        " WHERE id = ANY($1::uuid[]) AND status = 'manual_review'",
        run.submitted,
    )
    dead_owner = sum(1 for r in reviews if r["message"] in _DEAD_OWNER_MESSAGES)
    twice = await submitted_twice(run.ledger_url)
    warm = max(60.0, soak.seconds / 10)
    after = [(t, v) for t, v in soak.rss if t >= warm] or soak.rss
    figures: dict[str, float] = {
        "minutes": round(soak.seconds / 60, 2),
        "tasks": float(len(run.submitted)),
        "tasks_succeeded": float(counts.get("succeeded", 0)),
        "tasks_lost": float(len(run.submitted) - final),
        "submitted_twice": float(twice),
        "tasks_stuck": float(len(soak.stuck)),
        "manual_review_dead_owner": float(dead_owner),
        "manual_review_live_owner": float(len(reviews) - dead_owner),
        "tasks_failed": float(counts.get("failed", 0)),
        "faults": float(sum(soak.faults.values())),
        **{f"faults_{kind}": float(n) for kind, n in soak.faults.items()},
        "rss_start_mb": round(after[0][1], 1) if after else 0.0,
        "rss_end_mb": round(after[-1][1], 1) if after else 0.0,
        "rss_growth_mb_per_hour": round(_slope_per_hour(after), 2),
    }
    return figures
