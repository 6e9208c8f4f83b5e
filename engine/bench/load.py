"""``python -m engine bench load``: the load controller under a heavy and a hostile load.

Both parts run the full service (:func:`engine.service.root.serve`) *in this process*, so
the load controller (the open engine's ``load``) can be read directly, on one fresh database each,
with one unlimited model, so the claim limit is ``worker.hard_limit``.

**(a) heavy limit** (issue #6 item 5): 2,000 simulated tasks whose upstream wait is 2 s (one
poll that takes 2 s) and whose prepare and finalize phases each burn 20 ms of CPU
(``cpu_seconds = 0.02``), with ``load.heavy_limit = 4`` and a claim limit of 1,000
(``worker.hard_limit = 1000``), load mode ``legacy`` (the heavy limit is enforced in every
mode). The controller's :meth:`~engine.load.controller.LoadController.snapshot` is read every
10 ms:

``heavy_limit_exceeded``
    samples where ``preparing + finalizing > 4`` (must be 0);
``waiting_upstream_peak`` / ``heavy_peak`` / ``active_peak``
    the largest phase counts seen;
``seconds`` / ``tasks_per_s``
    from the submission to the last task final. The burns run on the event loop, so the run
    takes at least ``cpu_floor_seconds`` = 2,000 × 2 × 20 ms = 80 s whatever the concurrency:
    the scenario is CPU bound, and ``waiting_upstream_peak`` is bounded by how many tasks the
    CPU can start within one 2 s wait (2 s / 40 ms = 50 in the steady state, up to
    2 s / 20 ms = 100 in the first 2 s, when there is nothing to finalize yet), far below
    the claim limit;
``snoozes_per_task``
    job snoozes (``metadata.snoozes`` of the jobs) per task: here every one is a start the load
    controller refused because the heavy phases were full. The producer claims up to
    the claim limit, so ~1,000 jobs are in hand while 4 heavy slots turn over: each job is
    read, refused and snoozed every 250-750 ms until it gets a slot, and that churn costs CPU
    on the same event loop as the burns;
``prepare_phase_p50_ms``
    median ``task.started`` → ``task.submitted`` (the heavy ``preparing`` phase: admission,
    the 20 ms burn, the submission record, plus waiting for the event loop while other tasks
    burn). A heavy slot is held that long, and again while finalizing, so the rate is bounded
    by ``4 / (preparing time + finalizing time)`` tasks per second;
``process_cpu_seconds``
    this process's CPU time during the part (the service and the bench share it): compared
    with ``cpu_floor_seconds`` it shows what the rest costs, refusals included.

The snapshot is read every 10 ms of the trio clock, but a burn blocks the event loop for
20 ms, so samples land between burns (``snapshot_samples`` says how many there were). The
counters only change on the event loop, so every sample is a consistent state.

**(b) CPU hog** (adaptive mode): ``load.mode = adaptive``, ``load.sample_interval = 0.2``, a
claim limit of 20 (so the controller's +1-per-sample recovery takes seconds, not the 200 s it would
take from 1 back to 1,000), the default thresholds (CPU elevated at 0.80, critical at 0.95 of
the CPUs the process may use; 2 samples to escalate, 3 to recover; they are reported with the
figures), tasks as in (a). Once the controller has been calm (``normal``, safe capacity = claim
limit) for 2 s (waiting at most 20 s for that; ``baseline_quiet`` says whether it came), one
busy-loop process per CPU (``python -c "while True: pass"``) runs for 4 s, then is killed.

What the sampler can see: it measures this process's CPU time *and* its cgroup's CPU usage, and
takes the larger fraction. A hog in another process is invisible to the first; it is seen
through the second only if it runs in the same cgroup, which a child process does (children
inherit the parent's cgroup; in a container the whole container is one cgroup). Where this
process sits in the root CPU cgroup (cgroup v1 ``cpuacct`` at ``/``, as on the development
VM), the cgroup figure is the *whole machine's* CPU: the hog is seen, but so is every other
process on the host, the PostgreSQL server included. The scenario therefore reports what the
sampler saw (a second :class:`ProcessSampler` in this process, same interval): the mean CPU
fraction before (``cpu_fraction_baseline``), during (``cpu_fraction_hog``) and after
(``cpu_fraction_after``) the hog. On a busy shared host the baseline itself can be pressure,
and recovery waits for the host, not only for the hog.

``safe_capacity_min``
    the lowest safe capacity (the admission limit in adaptive mode) from the hog's start until
    recovery (the hysteresis outlasts the hog);
``detect_seconds``
    hog started → pressure state no longer ``normal``;
``recovered_seconds``
    hog stopped → pressure ``normal`` and safe capacity back to the claim limit (``inf`` if not
    within 20 s). By design at least ``recover_samples`` samples (back to ``normal``) plus one
    sample per unit to climb back: ``recovered_bound_seconds`` =
    ``(3 + 20 - safe_capacity_min) × 0.2 s``.
"""

from __future__ import annotations

import functools
import math
import os
import statistics
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Final

import attrs
import trio

from engine.bench.common import BenchDatabase, percentile
from engine.bench.worker import kill_processes
from engine.config import EngineConfig, load_config
from engine.db.database import DatabaseUrls
from engine.domain.tasks import Identity, RunMode, TaskRequest
from engine.load.controller import LoadSnapshot
from engine.load.pressure import PressureState
from engine.load.sampler import ProcessSampler
from engine.providers.simulated import Latency, SimulatedProvider, SimulationConfig
from engine.service.engine import Engine
from engine.service.root import serve

__all__ = ["TARGETS", "run_load_bench"]

HEAVY_LIMIT: Final = 4
CLAIM_LIMIT: Final = 1000
ADAPTIVE_CLAIM_LIMIT: Final = 20
UPSTREAM_SECONDS: Final = 2.0
CPU_SECONDS: Final = 0.02
SAMPLE_INTERVAL: Final = 0.2
SNAPSHOT_PERIOD: Final = 0.01
FETCH_POLL_INTERVAL: Final = 0.1

TARGETS: dict[str, tuple[str, float]] = {
    "heavy_limit_exceeded": ("<=", 0.0),
    # The hog must be seen as pressure at all (the safe capacity must leave the claim limit).
    "safe_capacity_min": ("<=", ADAPTIVE_CLAIM_LIMIT - 1.0),
}

MODEL: Final = "load-model"
SIMULATION: Final = SimulationConfig(
    poll=Latency("fixed", UPSTREAM_SECONDS), polls=1, cpu_seconds=CPU_SECONDS
)
_IDENTITY: Final = Identity(tenant_id="bench", user_id="bench")
_FINAL: Final = ("succeeded", "failed", "cancelled", "manual_review")

_COMMON: Final[dict[str, str]] = {
    "metrics.enabled": "false",
    "tasks.demo_catalogue": "false",
    "database.migrate_on_start": "false",
    "database.pool_max_size": "20",
    "load.heavy_limit": str(HEAVY_LIMIT),
    # A refused start snoozes its job 250-750 ms; the job becomes due again without a
    # notification, so the producer only finds it at its next poll. With the default 1 s poll
    # every refusal costs >= 1 s and part (a) runs at ~4 tasks/s (measured); 0.1 s keeps the
    # retry close to that delay.
    "queue.fetch_poll_interval": str(FETCH_POLL_INTERVAL),
}


@attrs.frozen
class _Plan:
    heavy_tasks: int
    heavy_timeout: float
    baseline: float
    """Seconds the controller must be calm (normal, full capacity) before the hog starts."""
    baseline_timeout: float
    hog_seconds: float
    hog_tasks: int
    recover_timeout: float
    overall_timeout: float


_FULL: Final = _Plan(
    heavy_tasks=2000,
    heavy_timeout=200.0,
    baseline=2.0,
    baseline_timeout=20.0,
    hog_seconds=4.0,
    hog_tasks=600,
    recover_timeout=20.0,
    overall_timeout=250.0,
)
_QUICK: Final = _Plan(
    heavy_tasks=200,
    heavy_timeout=30.0,
    baseline=1.0,
    baseline_timeout=8.0,
    hog_seconds=3.0,
    hog_tasks=300,
    recover_timeout=15.0,
    overall_timeout=60.0,
)


@asynccontextmanager
async def _service(config: EngineConfig, url: str) -> AsyncIterator[Engine]:
    """The full service in this process, with the load scenario's simulated upstream."""
    async with trio.open_nursery() as nursery:
        engine: Engine = await nursery.start(
            functools.partial(
                serve,
                config,
                urls=DatabaseUrls.single(url),
                simulated=SimulatedProvider(SIMULATION),
            )
        )
        try:
            yield engine
        finally:
            nursery.cancel_scope.cancel(reason="scenario done")


def _requests(count: int) -> list[TaskRequest]:
    return [
        TaskRequest(model=MODEL, payload={"n": n}, identity=_IDENTITY, run_mode=RunMode.SIMULATION)
        for n in range(count)
    ]


async def _final_count(engine: Engine) -> int:
    counts = await engine.counts()
    return sum(counts.get(status, 0) for status in _FINAL)


async def _wait_final(engine: Engine, count: int) -> None:
    while True:  # database state: poll it
        if await _final_count(engine) >= count:
            return
        await trio.sleep(0.1)


async def _watch(
    engine: Engine, period: float, on_snapshot: Callable[[LoadSnapshot], None]
) -> None:
    load = engine.load
    assert load is not None, "the service runs with a load controller in worker mode"
    deadline = trio.current_time()
    while True:
        on_snapshot(load.snapshot())
        deadline = max(deadline + period, trio.current_time())
        await trio.sleep_until(deadline)


# ---- (a) -----------------------------------------------------------------------------------


async def _heavy(admin_url: str, plan: _Plan) -> dict[str, float]:
    config = load_config(
        env={}, overrides={**_COMMON, "worker.hard_limit": str(CLAIM_LIMIT), "load.mode": "legacy"}
    )
    samples = exceeded = heavy_peak = waiting_peak = active_peak = 0
    claim_seen = 0

    def on_snapshot(snap: LoadSnapshot) -> None:
        nonlocal samples, exceeded, heavy_peak, waiting_peak, active_peak, claim_seen
        heavy = snap.preparing + snap.finalizing
        samples += 1
        exceeded += heavy > HEAVY_LIMIT
        heavy_peak = max(heavy_peak, heavy)
        waiting_peak = max(waiting_peak, snap.waiting_upstream)
        active_peak = max(active_peak, snap.active)
        claim_seen = max(claim_seen, snap.claim_limit)

    async with BenchDatabase(admin_url) as db, _service(config, db.urls.tasks) as engine:
        await engine.set_model(MODEL, concurrency_limit=None)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_watch, engine, SNAPSHOT_PERIOD, on_snapshot)
            started = trio.current_time()
            cpu_before = time.process_time()
            requests = _requests(plan.heavy_tasks)
            for first in range(0, len(requests), 500):
                await engine.submit(requests[first : first + 500])
            with trio.fail_after(plan.heavy_timeout):
                await _wait_final(engine, plan.heavy_tasks)
            elapsed = trio.current_time() - started
            cpu = time.process_time() - cpu_before
            nursery.cancel_scope.cancel(reason="part (a) done")
        counts = await engine.counts()
        snoozes = await db.queue.fetchval(
            "SELECT coalesce(sum((metadata ->> 'snoozes')::int), 0) FROM river_job"
        )
        prepare_spans = [
            float(r["seconds"])
            for r in await db.tasks.fetch(
                "SELECT extract(epoch FROM s.at - st.at) AS seconds"
                " FROM engine_task_event st JOIN engine_task_event s"
                " ON s.task_id = st.task_id AND s.type = 'task.submitted'"
                " WHERE st.type = 'task.started'"
            )
        ]
    return {
        "tasks": float(plan.heavy_tasks),
        "tasks_succeeded": float(counts.get("succeeded", 0)),
        "claim_limit": float(claim_seen),
        "heavy_limit": float(HEAVY_LIMIT),
        "heavy_limit_exceeded": float(exceeded),
        "heavy_peak": float(heavy_peak),
        "waiting_upstream_peak": float(waiting_peak),
        "active_peak": float(active_peak),
        "snapshot_samples": float(samples),
        "snoozes_per_task": round(int(snoozes) / plan.heavy_tasks, 2),
        "prepare_phase_p50_ms": round(percentile(prepare_spans, 50) * 1000, 1),
        "cpu_floor_seconds": round(plan.heavy_tasks * 2 * CPU_SECONDS, 3),
        "process_cpu_seconds": round(cpu, 3),
        "tasks_per_s": round(plan.heavy_tasks / elapsed, 1),
        "seconds": round(elapsed, 3),
    }


# ---- (b) -----------------------------------------------------------------------------------


def _cpu_count() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


async def _start_hogs(count: int) -> list[trio.Process]:
    hogs: list[trio.Process] = []
    try:
        for _ in range(count):
            hogs.append(
                await trio.lowlevel.open_process(
                    [sys.executable, "-c", "while True: pass"],
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
            )
    except BaseException:
        await kill_processes(hogs)
        raise
    return hogs


@attrs.define
class _Trace:
    """What part (b) saw, against the trio clock."""

    snapshots: list[tuple[float, LoadSnapshot]] = attrs.Factory(list)
    cpu: list[tuple[float, float]] = attrs.Factory(list)


async def _sample_cpu(trace: _Trace) -> None:
    sampler = ProcessSampler()
    while True:
        await trio.sleep(SAMPLE_INTERVAL)
        fraction = sampler.sample(0, 0).cpu_fraction
        if fraction is not None:
            trace.cpu.append((trio.current_time(), fraction))


def _mean_cpu(trace: _Trace, start: float, end: float) -> float:
    values = [f for at, f in trace.cpu if start <= at <= end]
    return round(statistics.fmean(values), 3) if values else math.nan


def _recovered(snap: LoadSnapshot) -> bool:
    return snap.pressure_state is PressureState.NORMAL and snap.safe_capacity >= snap.claim_limit


async def _until_quiet(trace: _Trace, seconds: float) -> None:
    """Return once the controller has been normal at full capacity for ``seconds``."""
    since: float | None = None
    while True:
        now = trio.current_time()
        snap = trace.snapshots[-1][1] if trace.snapshots else None
        if snap is not None and _recovered(snap):
            since = now if since is None else since
            if now - since >= seconds:
                return
        else:
            since = None
        await trio.sleep(0.05)


async def _until_recovered(trace: _Trace) -> None:
    while True:
        if trace.snapshots and _recovered(trace.snapshots[-1][1]):
            return
        await trio.sleep(0.05)


async def _hog(admin_url: str, plan: _Plan) -> dict[str, float]:
    config = load_config(
        env={},
        overrides={
            **_COMMON,
            "worker.hard_limit": str(ADAPTIVE_CLAIM_LIMIT),
            "load.mode": "adaptive",
            "load.sample_interval": str(SAMPLE_INTERVAL),
        },
    )
    load = config.load
    trace = _Trace()
    hogs: list[trio.Process] = []
    quiet = True
    recovered: float | None = None
    try:
        async with BenchDatabase(admin_url) as db, _service(config, db.urls.tasks) as engine:
            await engine.set_model(MODEL, concurrency_limit=None)
            async with trio.open_nursery() as nursery:
                nursery.start_soon(
                    _watch,
                    engine,
                    0.05,
                    lambda snap: trace.snapshots.append((trio.current_time(), snap)),
                )
                nursery.start_soon(_sample_cpu, trace)
                await engine.submit(_requests(plan.hog_tasks))
                t_begin = trio.current_time()
                # Start the hog from a calm state, if the host gives us one.
                with trio.move_on_after(plan.baseline_timeout) as waited:
                    await _until_quiet(trace, plan.baseline)
                quiet = not waited.cancelled_caught
                hogs = await _start_hogs(_cpu_count())
                t_hog = trio.current_time()
                await trio.sleep(plan.hog_seconds)
                await kill_processes(hogs)
                t_stop = trio.current_time()
                with trio.move_on_after(plan.recover_timeout):
                    await _until_recovered(trace)
                    recovered = trio.current_time() - t_stop
                t_end = trio.current_time()
                nursery.cancel_scope.cancel(reason="part (b) done")
    finally:
        await kill_processes(hogs)
    # The hog's effect outlasts it by the hysteresis: the minimum is taken up to the recovery.
    affected = [s for at, s in trace.snapshots if t_hog <= at <= t_end]
    baseline = [s for at, s in trace.snapshots if t_begin <= at < t_hog]
    detected = next(
        (
            at - t_hog
            for at, s in trace.snapshots
            if at >= t_hog and s.pressure_state is not PressureState.NORMAL
        ),
        None,
    )
    reasons = {s.pressure_reason for s in affected if s.pressure_reason}
    safe_min = min((s.safe_capacity for s in affected), default=ADAPTIVE_CLAIM_LIMIT)
    return {
        "adaptive_claim_limit": float(ADAPTIVE_CLAIM_LIMIT),
        "hogs": float(len(hogs)),
        "hog_seconds": plan.hog_seconds,
        "baseline_quiet": float(quiet),
        "baseline_seconds": round(t_hog - t_begin, 3),
        "safe_capacity_baseline_min": float(
            min((s.safe_capacity for s in baseline), default=ADAPTIVE_CLAIM_LIMIT)
        ),
        "safe_capacity_min": float(safe_min),
        "pressure_reason_cpu": float("cpu" in reasons),
        "detect_seconds": round(detected, 3) if detected is not None else math.inf,
        "recovered_seconds": round(recovered, 3) if recovered is not None else math.inf,
        # What the controller allows at best: back to normal, then +1 per sample.
        "recovered_bound_seconds": round(
            (load.recover_samples + ADAPTIVE_CLAIM_LIMIT - safe_min) * load.sample_interval, 3
        ),
        "cpu_fraction_baseline": _mean_cpu(trace, t_begin, t_hog),
        "cpu_fraction_hog": _mean_cpu(trace, t_hog + SAMPLE_INTERVAL, t_stop),
        "cpu_fraction_after": _mean_cpu(trace, t_stop + SAMPLE_INTERVAL, t_end),
        "threshold_cpu_elevated": load.cpu_elevated,
        "threshold_cpu_critical": load.cpu_critical,
        "escalate_samples": float(load.escalate_samples),
        "recover_samples": float(load.recover_samples),
        "sample_interval": load.sample_interval,
    }


async def run_load_bench(admin_url: str, *, quick: bool = False) -> dict[str, float]:
    """Run both parts (see the module docstring) on fresh databases on ``admin_url``'s server.

    Raises:
        trio.TooSlowError: it did not finish in time (250 s, quick 60 s; part (a) alone
            200 s, quick 30 s).
    """
    plan = _QUICK if quick else _FULL
    with trio.fail_after(plan.overall_timeout):
        results = await _heavy(admin_url, plan)
        results.update(await _hog(admin_url, plan))
    return results
