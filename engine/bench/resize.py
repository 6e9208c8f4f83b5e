"""``python -m engine bench resize``: resize and takeover across three real engine processes.

The scenario (one fresh database, issue #5 item 7):

1. three ``python -m engine.bench.worker`` processes (the full service: refresher, generations,
   recovery, load sampler) with a short refresh interval (:data:`REFRESH_INTERVAL` = 0.5 s) and
   the default 6 refresh periods before an instance is stale (stale window 3 s); recovery every
   1 s with ``recovery.stale_after`` 3 s;
2. one model ``m`` with a limit of 10, set from this process through a client-only engine;
3. 600 simulated tasks (a single poll of 200 ms each; 200 in ``--quick``) submitted at once;
4. while they run the limit goes 10 → 3 → 20 (held 3 s, 3 s, 1.5 s; 1.5 s, 1.5 s, 1 s in
   ``--quick``), then one process is SIGKILLed as soon as it is running a task (waiting at
   most 2 s for one); the scenario waits until every task is final and the survivors hold
   the whole capacity, with deadlines; then the survivors get SIGTERM.

Meanwhile this process samples the registry (``instance_id, allocated`` of every row) every
50 ms, and the workers record (``--record``) every provider ``submit`` and every change of the
claim limit they apply. Figures:

``tasks_lost``
    submitted minus final (succeeded, failed, cancelled or manual_review) at the end.
``tasks_run_twice``
    tasks with more than one ``task.succeeded``/``task.failed`` event, or with more than one
    ``bench_submission`` row (the worker writes that row *before* the simulated upstream is
    called, so every attempt to reach the upstream is on record).
``over_allocation_samples``
    From the task events, each execution is an interval on its instance: its claim (the
    ``claimed_at`` of its ``task.started`` event, when it holds its slot) up to
    the same task's next event with a status other than ``running`` (a final one, or back to
    ``queued``: requeued, waiting for admission, rate limited) or its next ``task.started``
    (another execution took over); an execution of the killed process ends at the kill at the
    latest. At every registry sample instant *t* and for every instance *i*, ``running_i(t)``
    is the number of its intervals containing *t* and ``allocated_i(t)`` the value sampled.
    A resize never cancels work: executions that started while the allocation was
    larger may finish after it shrank. So a sample counts as over-allocated when
    ``running_i(t) > max(allocated_i(t), carried_i(t))``, where ``carried_i(t)`` counts the
    running executions that started before the last decrease of ``allocated_i`` (first seen at
    a sample instant *c*) plus a tolerance of one sample period (50 ms: the sampling
    resolution, and the gap between a job's claim, when its slot is taken, and its
    ``task.started`` event). Equivalently: once the allocation shrank, the process must not
    start anything new until the carried-over executions are down to the new allocation. The
    killed process is checked up to its kill only (its stale row keeps an allocation until the
    survivors drop it). ``over_allocation_samples_raw`` is the plain count of
    ``running > allocated`` (informational: it includes the carried-over executions), and
    ``carryover_max_seconds`` the longest time after a decrease until ``running <= allocated``
    again (about one task's duration at most when nothing new starts).
``converge_seconds``
    For each limit change: from the moment ``set_model`` returned to the first registry sample
    where the live instances' ``allocated`` are the even split of the new limit (⌊L/n⌋ each,
    L mod n of them one more) and sum to L. The maximum over the changes. If a change does not
    converge before the next one, the time it was held is reported (a lower bound that misses).
``takeover_seconds``
    From the SIGKILL to the first registry sample where the two survivors' ``allocated`` are
    the even split of the whole limit (and the dead row holds 0).
``over_claim_limit_samples``
    The same rule with the claim limit each process *applied* (``bench_claim_limit``, see
    below) in place of the registry's ``allocated``: it does not depend on when the registry
    row changed, only on what the process enforced.
``converge_applied_seconds`` / ``takeover_applied_seconds``
    The same, but with the claim limits the processes actually *apply* (``bench_claim_limit``,
    polled every 5 ms in each worker) instead of the registry: when the new split is in force,
    not only decided.

Also reported: ``tasks_remaining_at_kill`` and ``tasks_interrupted_by_kill`` (tasks running
on the victim at the kill, from ``engine_task.execution_owner``: recovery must bring them back),
``tasks_manual_review`` (a kill between the upstream submission and its record parks a task
there rather than risk a second submission), ``upstream_submissions`` and ``seconds``
(submission to the last task final), ``survivors_exit_nonzero`` (survivors that did not exit
with status 0 after their SIGTERM: the graceful path of the worker entry point).

Targets (issue #5): the first three 0; converge ≤ 2 refresh intervals (1 s); takeover ≤ the
stale window + one refresh interval (3.5 s).
"""

from __future__ import annotations

import math
import tempfile
from collections import defaultdict
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Final

import attrs
import trio

from engine.bench.common import BenchDatabase, check_targets
from engine.bench.resize_analysis import (
    SAMPLE_PERIOD,
    RegistrySample,
    applied_at,
    applied_converge_time,
    converge_time,
    even_split,
    executions_from_events,
    over_allocation,
)
from engine.bench.worker import (
    BENCH_TABLES_SQL,
    WorkerProcess,
    kill_processes,
    spawn_worker,
    stop_workers,
)
from engine.config import load_config
from engine.db.bridge import Pool
from engine.db.database import DatabaseUrls
from engine.domain.tasks import Identity, RunMode, TaskRequest
from engine.providers.simulated import Latency, SimulationConfig
from engine.service.engine import Engine
from engine.service.root import open as open_engine

__all__ = ["REFRESH_INTERVAL", "STALE_WINDOW", "TARGETS", "run_resize_bench"]

#: ``worker.refresh_interval`` of the workers, seconds.
REFRESH_INTERVAL: Final = 0.5
#: ``worker.heartbeat_stale_factor`` (its default, 6 periods).
STALE_FACTOR: Final = 6
#: Seconds without a heartbeat before an instance leaves the split.
STALE_WINDOW: Final = REFRESH_INTERVAL * STALE_FACTOR

TARGETS: dict[str, tuple[str, float]] = {
    "tasks_lost": ("<=", 0.0),
    "tasks_run_twice": ("<=", 0.0),
    "over_allocation_samples": ("<=", 0.0),
    "converge_seconds": ("<=", 2 * REFRESH_INTERVAL),
    "takeover_seconds": ("<=", STALE_WINDOW + REFRESH_INTERVAL),
}

MODEL: Final = "m"
WORKERS: Final = 3
#: The limits in order: the first is set before the tasks, the others while they run.
LIMITS: Final = (10, 3, 20)
TASK_SECONDS: Final = 0.2

WORKER_SETTINGS: Final[dict[str, str]] = {
    "worker.refresh_interval": str(REFRESH_INTERVAL),
    "worker.heartbeat_stale_factor": str(STALE_FACTOR),
    "worker.hard_limit": "100",
    "recovery.stale_after": str(STALE_WINDOW),
    "recovery.interval": "1",
    "metrics.enabled": "false",
    "tasks.demo_catalogue": "false",
    "database.migrate_on_start": "false",
}

#: Each task spends ~200 ms "upstream": one poll that takes 200 ms.
SIMULATION: Final = SimulationConfig(poll=Latency("fixed", TASK_SECONDS), polls=1)

_IDENTITY: Final = Identity(tenant_id="bench", user_id="bench")
_FINAL: Final = ("succeeded", "failed", "cancelled", "manual_review")


@attrs.frozen
class _Plan:
    tasks: int
    holds: tuple[float, float, float]
    """Seconds each limit is held; after the last one a process is killed."""
    finish_timeout: float
    overall_timeout: float


_FULL: Final = _Plan(tasks=600, holds=(3.0, 3.0, 1.5), finish_timeout=45.0, overall_timeout=110.0)
_QUICK: Final = _Plan(tasks=200, holds=(1.5, 1.5, 1.0), finish_timeout=30.0, overall_timeout=55.0)


def _now() -> float:
    return datetime.now(UTC).timestamp()


class _RegistrySampler:
    """Samples ``engine_worker_instance`` every :data:`SAMPLE_PERIOD` until cancelled."""

    def __init__(self, pool: Pool) -> None:
        self.pool = pool
        self.samples: list[RegistrySample] = []

    async def run(self) -> None:
        deadline = trio.current_time()
        while True:
            before = _now()
            rows = await self.pool.fetch(
                "SELECT instance_id, allocated FROM engine_worker_instance"
            )
            after = _now()
            self.samples.append(
                RegistrySample(
                    (before + after) / 2, {r["instance_id"]: int(r["allocated"]) for r in rows}
                )
            )
            deadline = max(deadline + SAMPLE_PERIOD, trio.current_time())
            await trio.sleep_until(deadline)


async def _final_count(client: Engine) -> int:
    counts = await client.counts()
    return sum(counts.get(status, 0) for status in _FINAL)


async def _running_on(pool: Pool, instance_id: str) -> int:
    return int(
        await pool.fetchval(
            "SELECT count(*) FROM engine_task WHERE status = 'running' AND execution_owner = $1",
            instance_id,
        )
    )


async def _wait_running(pool: Pool, instance_id: str) -> None:
    while True:  # database state: poll it
        if await _running_on(pool, instance_id):
            return
        await trio.sleep(0.01)


async def _wait_all_final(client: Engine, tasks: int) -> None:
    # Database state has no event to await: poll it.
    while True:
        if await _final_count(client) >= tasks:
            return
        await trio.sleep(0.1)


async def _wait_until_split(
    sampler: _RegistrySampler, limit: int, live: Sequence[str], timeout: float
) -> None:
    with trio.fail_after(timeout):
        while True:
            if sampler.samples:
                last = sampler.samples[-1]
                got = sorted((last.allocated.get(i, 0) for i in live), reverse=True)
                if got == even_split(limit, len(live)):
                    return
            await trio.sleep(SAMPLE_PERIOD)


async def _run(admin_url: str, plan: _Plan, log_dir: Path) -> dict[str, float]:
    results: dict[str, float] = {}
    async with BenchDatabase(admin_url, max_size=4) as db:
        url = db.urls.tasks
        await db.tasks.execute(BENCH_TABLES_SQL)
        config = load_config(env={}, overrides={**WORKER_SETTINGS, "worker.mode": "client"})
        async with open_engine(config, urls=DatabaseUrls.single(url), control=False) as client:
            await client.set_model(MODEL, concurrency_limit=LIMITS[0])
            workers: list[WorkerProcess] = []
            try:
                async with trio.open_nursery() as nursery:
                    for n in range(WORKERS):
                        nursery.start_soon(_spawn_into, workers, url, log_dir / f"worker-{n}.log")
                ids = [w.instance_id for w in workers]
                sampler = _RegistrySampler(db.coordination)
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(sampler.run)
                    await _wait_until_split(sampler, LIMITS[0], ids, timeout=10)
                    results.update(await _timeline(client, db.tasks, sampler, workers, plan))
                    nursery.cancel_scope.cancel(reason="scenario done")
                survivors = [w for w in workers if w.alive]
                codes = await stop_workers(survivors)
                # A graceful stop (SIGTERM) must end each survivor with status 0.
                results["survivors_exit_nonzero"] = float(sum(1 for c in codes if c != 0))
            finally:
                await kill_processes([w.process for w in workers])
    return results


async def _spawn_into(workers: list[WorkerProcess], url: str, log_path: Path) -> None:
    workers.append(
        await spawn_worker(url, WORKER_SETTINGS, SIMULATION, log_path=log_path, record=True)
    )


async def _timeline(
    client: Engine,
    tasks_pool: Pool,
    sampler: _RegistrySampler,
    workers: list[WorkerProcess],
    plan: _Plan,
) -> dict[str, float]:
    ids = [w.instance_id for w in workers]
    requests = [
        TaskRequest(model=MODEL, payload={"n": n}, identity=_IDENTITY, run_mode=RunMode.SIMULATION)
        for n in range(plan.tasks)
    ]
    started = _now()
    await client.submit(requests)
    await trio.sleep(plan.holds[0])
    changes: list[tuple[float, int]] = []
    for limit, hold in zip(LIMITS[1:], plan.holds[1:], strict=True):
        await client.set_model(MODEL, concurrency_limit=limit)
        changes.append((_now(), limit))
        await trio.sleep(hold)
    victim = workers[0]
    # Kill it in the middle of work: wait (briefly) until it runs something.
    with trio.move_on_after(2.0):
        await _wait_running(tasks_pool, victim.instance_id)
    victim.process.kill()
    killed_at = _now()
    await victim.process.wait()
    remaining_at_kill = plan.tasks - await _final_count(client)
    interrupted = await _running_on(tasks_pool, victim.instance_id)
    survivors = [w.instance_id for w in workers if w is not victim]
    final_limit = LIMITS[-1]
    with trio.move_on_after(plan.finish_timeout):
        await _wait_all_final(client, plan.tasks)
    finished_at = _now()
    # Takeover needs the stale window to pass even when the tasks are done.
    with trio.move_on_after(STALE_WINDOW + 10 * REFRESH_INTERVAL):
        await _wait_until_split(sampler, final_limit, survivors, timeout=math.inf)
    await trio.sleep(0.5)  # the last events are written in 50 ms batches
    horizon = _now()

    counts = await client.counts()
    final = sum(counts.get(status, 0) for status in _FINAL)
    twice = await tasks_pool.fetchval(
        """
        SELECT count(*) FROM (
            SELECT task_id FROM engine_task_event
            WHERE type IN ('task.succeeded', 'task.failed')
            GROUP BY task_id HAVING count(*) > 1
            UNION
            SELECT task_id FROM bench_submission GROUP BY task_id HAVING count(*) > 1
        ) AS t
        """
    )
    events = [
        (r["task_id"], r["type"], r["status"], r["instance_id"], r["at"].timestamp())
        for r in await tasks_pool.fetch(
            # An execution holds its slot from its claim, which for a limited task comes a
            # moment before admission and its task.started event (claimed_at in the payload).
            """
            SELECT task_id, type, status, instance_id,
                   CASE WHEN type = 'task.started' AND payload ->> 'claimed_at' IS NOT NULL
                        THEN least(at, (payload ->> 'claimed_at')::timestamptz)
                        ELSE at END AS at
            FROM engine_task_event ORDER BY 5, id
            """
        )
    ]
    executions = executions_from_events(
        events, killed={victim.instance_id: killed_at}, horizon=horizon
    )
    samples = list(sampler.samples)
    over = over_allocation(
        samples, executions, instances=ids, alive_until={victim.instance_id: killed_at}
    )

    claim_rows = await tasks_pool.fetch(
        "SELECT instance_id, at, claim_limit FROM bench_claim_limit ORDER BY at"
    )
    applied: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for row in claim_rows:
        applied[row["instance_id"]].append((row["at"].timestamp(), float(row["claim_limit"])))

    # The same check against the claim limits the processes applied, at the same instants.
    applied_samples = [
        RegistrySample(sample.at, applied_at(applied, sample.at)) for sample in samples
    ]
    over_applied = over_allocation(
        applied_samples, executions, instances=ids, alive_until={victim.instance_id: killed_at}
    )

    converge: list[float] = []
    converge_applied: list[float] = []
    bounds = [*(at for at, _ in changes[1:]), killed_at]
    for (at, limit), until in zip(changes, bounds, strict=True):
        found = converge_time(samples, since=at, until=until, limit=limit, live=ids)
        converge.append(until - at if found is None else found)
        found = applied_converge_time(applied, since=at, until=until, limit=limit, live=ids)
        converge_applied.append(until - at if found is None else found)
    takeover = converge_time(
        samples,
        since=killed_at,
        until=math.inf,
        limit=final_limit,
        live=survivors,
        dead=[victim.instance_id],
    )
    takeover_applied = applied_converge_time(
        applied, since=killed_at, until=math.inf, limit=final_limit, live=survivors
    )
    submissions = await tasks_pool.fetchval("SELECT count(*) FROM bench_submission")
    elapsed = finished_at - started

    return {
        "tasks": float(plan.tasks),
        "tasks_lost": float(plan.tasks - final),
        "tasks_run_twice": float(twice),
        "over_allocation_samples": float(over.samples),
        "over_allocation_samples_raw": float(over.raw_samples),
        "over_claim_limit_samples": float(over_applied.samples),
        "carryover_max_seconds": over.carryover_max_seconds,
        "converge_seconds": round(max(converge), 3),
        "converge_applied_seconds": round(max(converge_applied), 3),
        "takeover_seconds": round(takeover if takeover is not None else math.inf, 3),
        "takeover_applied_seconds": round(
            takeover_applied if takeover_applied is not None else math.inf, 3
        ),
        "tasks_succeeded": float(counts.get("succeeded", 0)),
        "tasks_manual_review": float(counts.get("manual_review", 0)),
        "tasks_failed": float(counts.get("failed", 0)),
        "tasks_remaining_at_kill": float(remaining_at_kill),
        "tasks_interrupted_by_kill": float(interrupted),
        "upstream_submissions": float(submissions),
        "registry_samples": float(len(samples)),
        "seconds": round(elapsed, 3),
    }


async def run_resize_bench(admin_url: str, *, quick: bool = False) -> dict[str, float]:
    """Run the resize scenario on a fresh database on ``admin_url``'s server (see the module
    docstring); every worker process is stopped on the way out, whatever happens.

    Raises:
        trio.TooSlowError: the whole scenario took longer than its bound (110 s, quick 55 s).
    """
    plan = _QUICK if quick else _FULL
    with tempfile.TemporaryDirectory(prefix="engine-bench-resize-") as tmp:
        log_dir = Path(tmp)
        try:
            with trio.fail_after(plan.overall_timeout):
                results = await _run(admin_url, plan, log_dir)
        except BaseException:
            _print_logs(log_dir)
            raise
        if not all(check_targets(results, TARGETS).values()):
            _print_logs(log_dir)
        return results


def _print_logs(log_dir: Path) -> None:
    """On a failure or a missed target, show the end of each worker's log (warnings and
    errors; the directory is about to go)."""
    for path in sorted(log_dir.glob("*.log")):
        lines = path.read_text(errors="replace").splitlines()[-30:]
        if lines:
            print(f"--- {path.name} (last {len(lines)} lines)")
            print("\n".join(lines))
