"""``python -m engine bench queue``: how fast the queue drains, against a naive baseline.

Figures (each run on a database made for it and dropped after):

* ``burn_down_jobs_per_s``: 20,000 no-op jobs inserted with ``insert_many``, drained at
  ``max_workers`` 32, from the generation's start until the last completion is written.
* ``baseline_jobs_per_s`` / ``ratio_to_baseline``: a naive queue (one table, claim free slots
  with SKIP LOCKED, batched DELETE, nothing else) drained the same way on the same stack.
* ``latency_p50_ms`` … ``p99_ms``: 500 single inserts 10 ms apart into an idle worker,
  insert call → handler start.
* ``sleepy_seconds``: 2,000 jobs sleeping 50 ms each at ``max_workers`` 100 (ideal 1.0 s).
* ``commits_per_job``: Postgres commits during the burn-down, per job.

The machines these run on change speed by 10-20 % within minutes, so the two figures with
targets are taken from repeated runs: the burn-down and the baseline run twice each, in the
order burn-down, baseline, baseline, burn-down (a drift in the machine's speed weighs on both
alike), and each rate is the mean of its two runs (``…_1`` and ``…_2`` are the runs, in
order); the sleepy figure is the median of three runs (``sleepy_seconds_max`` the slowest).
"""

from __future__ import annotations

import math
import statistics
from typing import Any

import attrs
import trio
import trio.lowlevel

from engine.bench.common import BenchDatabase, percentile
from engine.db.database import Database
from engine.queue import Job, Workers, open_queue
from engine.queue.config import QueueConfig
from engine.queue.insert import insert_many, prepare

__all__ = ["TARGETS", "BurnDown", "burn_down", "run_queue_bench"]

#: Targets on the 2-core reference machine (issue #3); ``check_targets`` compares against them.
TARGETS: dict[str, tuple[str, float]] = {
    "ratio_to_baseline": (">=", 0.6),
    "latency_p50_ms": ("<=", 3.0),
    "latency_p99_ms": ("<=", 8.0),
    "sleepy_seconds": ("<=", 1.15),
}

_QCFG = QueueConfig()


async def _commits(db: Database) -> int:
    return int(
        await db.queue.fetchval(
            "SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()"
        )
    )


@attrs.frozen
class BurnDown:
    """One drain's figures."""

    jobs_per_s: float
    commits_per_job: float
    wal_bytes_per_job: float
    """WAL the server wrote during the drain, per job: what each claim and completion costs
    in row and index writes, steadier than the throughput between runs."""


async def burn_down(db: Database, jobs: int, max_workers: int) -> BurnDown:
    """Drain ``jobs`` no-op jobs at ``max_workers`` (inserted first, not timed)."""
    workers = Workers()

    async def noop(job: Job, args: dict[str, Any]) -> None:
        return None

    workers.register(dict, noop, kind="noop")
    await insert_many(db.queue, [prepare({"i": i}, kind="noop") for i in range(jobs)])
    # Stats are flushed by backends at transaction end; give them a moment to settle.
    await db.queue.execute("SELECT pg_stat_clear_snapshot()")
    before = await _commits(db)
    wal_before = await db.queue.fetchval("SELECT pg_current_wal_insert_lsn()")
    async with open_queue(db, _QCFG, workers=workers) as client:
        started = trio.current_time()
        await client.start_generation({"default": max_workers})
        # The queue's public drained signal: every job's outcome is written.
        await client.wait_drained("default")
        elapsed = trio.current_time() - started
    wal = await db.queue.fetchval(
        "SELECT pg_wal_lsn_diff(pg_current_wal_insert_lsn(), $1::pg_lsn)", wal_before
    )
    await db.queue.execute("SELECT pg_stat_clear_snapshot()")
    after = await _commits(db)
    return BurnDown(jobs / elapsed, (after - before) / jobs, float(wal) / jobs)


async def _baseline(db: Database, jobs: int, max_workers: int) -> float:
    """A naive queue on the same stack: claim with SKIP LOCKED, work, batched DELETE."""
    await db.queue.execute(
        "CREATE TABLE naive_job (id bigserial PRIMARY KEY, locked boolean NOT NULL DEFAULT false,"
        " args jsonb NOT NULL)"
    )
    await db.queue.execute(
        "INSERT INTO naive_job (args) SELECT jsonb_build_object('i', i)"
        " FROM generate_series(1, $1) AS i",
        jobs,
    )
    claim = (
        "UPDATE naive_job SET locked = true WHERE id IN (SELECT id FROM naive_job"
        " WHERE NOT locked ORDER BY id LIMIT $1 FOR UPDATE SKIP LOCKED) RETURNING id, args"
    )
    done: list[int] = []
    deleted = 0
    slots_free = trio.Event()
    running = 0
    started = trio.current_time()
    async with trio.open_nursery() as nursery, db.queue.acquire() as conn:

        async def work(job_id: int) -> None:
            nonlocal running
            await trio.lowlevel.checkpoint()
            done.append(job_id)
            running -= 1
            slots_free.set()

        async def deleter() -> None:
            nonlocal deleted
            async with db.queue.acquire() as dconn:
                while deleted < jobs:
                    await trio.sleep(0.05)
                    batch, done[:] = list(done), []
                    if batch:
                        await dconn.execute(
                            "DELETE FROM naive_job WHERE id = ANY($1::bigint[])", batch
                        )
                        deleted += len(batch)

        nursery.start_soon(deleter)
        claimed = 0
        while claimed < jobs:
            free = max_workers - running
            if free <= 0:
                slots_free = trio.Event()
                await slots_free.wait()
                continue
            rows = await conn.fetch(claim, free)
            claimed += len(rows)
            for row in rows:
                running += 1
                nursery.start_soon(work, row["id"])
    return jobs / (trio.current_time() - started)


async def _latency(db: Database, samples: int, gap: float) -> list[float]:
    workers = Workers()
    starts: dict[int, float] = {}
    arrived: dict[int, trio.Event] = {}

    async def handle(job: Job, args: dict[str, Any]) -> None:
        starts[job.args["n"]] = trio.current_time()
        arrived.setdefault(job.args["n"], trio.Event()).set()

    workers.register(dict, handle, kind="latency")
    out: list[float] = []
    async with open_queue(db, _QCFG, workers=workers) as client:
        await client.start_generation({"latency": 32})
        from engine.queue import InsertOpts

        opts = InsertOpts(queue="latency")
        for _ in range(20):  # warm up connections and statement caches
            await client.insert(prepare_args(-1), opts, kind="latency")
        await trio.sleep(0.2)
        for n in range(samples):
            t0 = trio.current_time()
            await client.insert(prepare_args(n), opts, kind="latency")
            with trio.fail_after(5):
                await arrived.setdefault(n, trio.Event()).wait()
            out.append((starts[n] - t0) * 1000)
            await trio.sleep_until(t0 + gap)
    return out


def prepare_args(n: int) -> dict[str, Any]:
    """The latency job's args (a mapping; kind given at insert)."""
    return {"n": n}


async def _sleepy(db: Database, jobs: int, sleep: float, max_workers: int) -> float:
    workers = Workers()
    finished = 0
    all_done = trio.Event()

    async def handle(job: Job, args: dict[str, Any]) -> None:
        nonlocal finished
        await trio.sleep(sleep)
        finished += 1
        if finished == jobs:
            all_done.set()

    workers.register(dict, handle, kind="sleepy")
    await insert_many(db.queue, [prepare({"i": i}, kind="sleepy") for i in range(jobs)])
    async with open_queue(db, _QCFG, workers=workers) as client:
        started = trio.current_time()
        await client.start_generation({"default": max_workers})
        await all_done.wait()
        return trio.current_time() - started


async def run_queue_bench(admin_url: str, *, quick: bool = False) -> dict[str, float]:
    """Run every queue figure on ``admin_url``'s server, each run on a fresh database."""
    scale = 10 if quick else 1
    jobs = 20_000 // scale
    results: dict[str, float] = {}
    drains: list[BurnDown] = []
    bases: list[float] = []
    for run in ("burn", "base", "base", "burn"):
        async with BenchDatabase(admin_url) as db:
            if run == "burn":
                drains.append(await burn_down(db, jobs, 32))
            else:
                bases.append(await _baseline(db, jobs, 32))
    rate = statistics.fmean(d.jobs_per_s for d in drains)
    base = statistics.fmean(bases)
    results["burn_down_jobs_per_s"] = round(rate, 1)
    results["commits_per_job"] = round(statistics.fmean(d.commits_per_job for d in drains), 3)
    results["baseline_jobs_per_s"] = round(base, 1)
    results["ratio_to_baseline"] = round(rate / base, 3)
    for n, d in enumerate(drains, 1):
        results[f"burn_down_jobs_per_s_{n}"] = round(d.jobs_per_s, 1)
    for n, b in enumerate(bases, 1):
        results[f"baseline_jobs_per_s_{n}"] = round(b, 1)
    async with BenchDatabase(admin_url) as db:
        lat = await _latency(db, 500 // scale, 0.010)
        results["latency_p50_ms"] = round(percentile(lat, 50), 3)
        results["latency_p95_ms"] = round(percentile(lat, 95), 3)
        results["latency_p99_ms"] = round(percentile(lat, 99), 3)
        results["latency_mean_ms"] = round(statistics.fmean(lat), 3)
    sleepy: list[float] = []
    for _ in range(3):
        async with BenchDatabase(admin_url) as db:
            sleepy.append(await _sleepy(db, 2000 // scale, 0.05, 100))
    results["sleepy_seconds"] = round(statistics.median(sleepy), 3)
    results["sleepy_seconds_max"] = round(max(sleepy), 3)
    assert all(math.isfinite(v) for v in results.values())
    return results
