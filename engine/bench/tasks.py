"""``python -m engine bench tasks``: simulated tasks end to end, against the raw queue.

* ``tasks_per_s``: 10,000 simulated tasks with zero latency, submitted (in batches of 1,000)
  and then drained by one engine with 600 workers, from its start until the last is final
  (zero-latency tasks are bound by round trips: more at once make each batched statement
  carry more).
* ``tasks_not_succeeded``: how many of them ended otherwise (0 expected: the simulated provider
  fails nothing by default).
* ``submit_per_s``: the submission rate of those batches.
* ``queue_jobs_per_s`` / ``ratio_to_queue``: the queue's own burn-down in the same run (the
  ratio is printed, with no target).
* ``round_trips_per_task``: statements this process sent during the drain, per task.
* ``scheduler_ticks_per_task``: trio task steps during a drain, per task
  (:mod:`engine.bench.ticks`): the same from run to run where the rates are not. Counted in a
  second drain of the same size, untimed: the counting instrument runs at every step and would
  cost the timed drain ~2 % of its Python.
* ``python_cpu_ms_per_task``: this process's CPU time over the drain, per task.
* ``postgres_cpu_ms_per_task``: the whole server's CPU time over the drain, per task (its
  postmaster, reaped and live children: :mod:`engine.bench.cpu`). Only when the server runs on
  this host and ``/proc`` shows its processes to this user; otherwise the figure is left out.
  Both share the host's cores, so both bound ``tasks_per_s``.
* ``submit_one_p50_ms`` / ``submit_one_p99_ms``: single ``Engine.submit`` calls (one task and
  its job), interleaved on the same pool with ``plain_insert_p50_ms`` / ``plain_insert_p99_ms``,
  a plain one-row INSERT with its commit into a scratch table with a similar row, and
  ``queue_insert_p50_ms``, a single ``QueueClient.insert``; ``submit_to_plain_ratio`` and
  ``queue_to_plain_ratio`` compare the medians.
"""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable
from contextlib import nullcontext
from typing import Any

import attrs
import trio

from engine.bench.common import BenchDatabase, percentile
from engine.bench.cpu import CpuSample, postmaster_of, sample_cpu
from engine.bench.queue import burn_down
from engine.bench.ticks import counting_ticks
from engine.config import load_config
from engine.db.bridge import Counters
from engine.db.database import DatabaseUrls
from engine.domain.tasks import Identity, RunMode, TaskRequest
from engine.providers.simulated import SimulatedProvider
from engine.service.root import open as open_engine

__all__ = ["TARGETS", "TaskDrain", "run_tasks_bench"]

TARGETS: dict[str, tuple[str, float]] = {
    "tasks_per_s": (">=", 3000.0),
    # The simulated provider has no failures by default: any task not succeeded is a bug.
    "tasks_not_succeeded": ("<=", 0),
    # One submission is one statement: it should cost little more than the cheapest write.
    "submit_to_plain_ratio": ("<=", 1.3),
    "queue_to_plain_ratio": ("<=", 1.3),
}

_IDENTITY = Identity(tenant_id="bench", user_id="bench")
_FINAL = ("succeeded", "failed", "cancelled", "manual_review")


@attrs.frozen
class TaskDrain:
    """What ``_tasks`` measured: the drain's rate, the submission's, statements and CPU per
    task, and how many tasks did not succeed."""

    tasks_per_s: float
    submit_per_s: float
    round_trips_per_task: float
    not_succeeded: int
    cpu: CpuSample
    #: None unless the drain counted them (then its rate is not the figure to report).
    ticks_per_task: float | None


async def _tasks(url: str, count: int, max_workers: int, *, count_ticks: bool = False) -> TaskDrain:
    config = load_config(
        env={},
        overrides={
            "database.migrate_on_start": "false",
            "worker.capacity": "fixed",
            "worker.hard_limit": str(max_workers),
        },
    )
    urls = DatabaseUrls.single(url)
    requests = [
        TaskRequest(
            model="bench-model", payload={"n": n}, identity=_IDENTITY, run_mode=RunMode.SIMULATION
        )
        for n in range(count)
    ]
    async with open_engine(config, urls=urls, control=False) as client:
        await client.set_model("bench-model")
        started = trio.current_time()
        for start in range(0, count, 1000):
            await client.submit(requests[start : start + 1000])
        submit_rate = count / (trio.current_time() - started)
    async with open_engine(config, urls=urls, simulated=SimulatedProvider()) as eng:
        postmaster = postmaster_of(await eng.db.tasks.fetchval("SELECT pg_backend_pid()"))
        before = Counters.statements
        cpu_before = sample_cpu(postmaster)
        started = trio.current_time()
        with counting_ticks() if count_ticks else nullcontext() as ticks:
            await eng.wait(requests[-1].id)
            # Every task final, whatever its outcome (a failed one must not hang the run); the
            # caller reports how many did not succeed.
            while True:
                counts = await eng.counts()
                if sum(counts.get(s, 0) for s in _FINAL) >= count:
                    break
                await trio.sleep(0.01)
        elapsed = trio.current_time() - started
        cpu = sample_cpu(postmaster) - cpu_before
        trips = (Counters.statements - before) / count
    return TaskDrain(
        count / elapsed,
        submit_rate,
        trips,
        count - counts.get("succeeded", 0),
        cpu,
        None if ticks is None else ticks.total / count,
    )


# A row like a task's: a uuid key, a JSON payload, a few text columns.
_PLAIN_TABLE = (
    "CREATE TABLE bench_plain_insert (id uuid PRIMARY KEY, model text NOT NULL,"
    " tenant_id text NOT NULL, user_id text NOT NULL, run_mode text NOT NULL,"
    " payload jsonb NOT NULL, created_at timestamptz NOT NULL DEFAULT now())"
)
_PLAIN_INSERT = (
    "INSERT INTO bench_plain_insert (id, model, tenant_id, user_id, run_mode, payload)"
    " VALUES ($1, $2, $3, $4, $5, $6)"
)


async def _single_writes(url: str, samples: int, warmup: int) -> dict[str, list[float]]:
    """Milliseconds of single submits, plain inserts and queue inserts, interleaved on one pool
    (each round in a rotated order), after ``warmup`` rounds."""
    config = load_config(env={}, overrides={"database.migrate_on_start": "false"})
    times: dict[str, list[float]] = {"submit": [], "plain": [], "queue": []}
    async with open_engine(config, urls=DatabaseUrls.single(url), control=False) as client:
        await client.set_model("bench-model")
        pool = client.db.tasks
        await pool.execute(_PLAIN_TABLE)

        async def submit(payload: dict[str, Any]) -> None:
            request = TaskRequest(
                model="bench-model", payload=payload, identity=_IDENTITY, run_mode=RunMode.LIVE
            )
            await client.submit(request)

        async def plain(payload: dict[str, Any]) -> None:
            await pool.execute(
                _PLAIN_INSERT, uuid.uuid4(), "bench-model", "bench", "bench", "live", payload
            )

        async def queue(payload: dict[str, Any]) -> None:
            await client.queue.insert(payload, kind="bench_single")

        steps: list[tuple[str, Callable[[dict[str, Any]], Awaitable[None]]]] = [
            ("submit", submit),
            ("plain", plain),
            ("queue", queue),
        ]
        for n in range(warmup + samples):
            payload = {"prompt": "a cat", "n": n}
            # Rotated each round, so neither write always follows the other.
            for name, step in steps[n % 3 :] + steps[: n % 3]:
                started = trio.current_time()
                await step(payload)
                if n >= warmup:
                    times[name].append((trio.current_time() - started) * 1000)
    return times


async def run_tasks_bench(admin_url: str, *, quick: bool = False) -> dict[str, float]:
    """Run the task figures on fresh databases on ``admin_url``'s server."""
    count = 1000 if quick else 10_000
    results: dict[str, float] = {}
    async with BenchDatabase(admin_url) as db:
        single = await _single_writes(db.urls.tasks, 60 if quick else 600, 20 if quick else 100)
    plain_p50 = percentile(single["plain"], 50)
    results["submit_one_p50_ms"] = round(percentile(single["submit"], 50), 3)
    results["submit_one_p99_ms"] = round(percentile(single["submit"], 99), 3)
    results["plain_insert_p50_ms"] = round(plain_p50, 3)
    results["plain_insert_p99_ms"] = round(percentile(single["plain"], 99), 3)
    results["submit_to_plain_ratio"] = round(percentile(single["submit"], 50) / plain_p50, 3)
    results["queue_insert_p50_ms"] = round(percentile(single["queue"], 50), 3)
    results["queue_to_plain_ratio"] = round(percentile(single["queue"], 50) / plain_p50, 3)
    async with BenchDatabase(admin_url) as db:
        drain = await _tasks(db.urls.tasks, count, 600)
    rate = drain.tasks_per_s
    results["tasks_per_s"] = round(rate, 1)
    results["tasks_not_succeeded"] = drain.not_succeeded
    results["submit_per_s"] = round(drain.submit_per_s, 1)
    results["round_trips_per_task"] = round(drain.round_trips_per_task, 3)
    results["python_cpu_ms_per_task"] = round(drain.cpu.python * 1000 / count, 3)
    if drain.cpu.postgres is not None:
        results["postgres_cpu_ms_per_task"] = round(drain.cpu.postgres * 1000 / count, 3)
    async with BenchDatabase(admin_url) as db:
        counted = await _tasks(db.urls.tasks, count, 600, count_ticks=True)
    assert counted.ticks_per_task is not None
    results["scheduler_ticks_per_task"] = round(counted.ticks_per_task, 2)
    async with BenchDatabase(admin_url) as db:
        queue_rate = (await burn_down(db, count, 32)).jobs_per_s
    results["queue_jobs_per_s"] = round(queue_rate, 1)
    results["ratio_to_queue"] = round(rate / queue_rate, 3)
    return results
