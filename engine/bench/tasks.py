"""``python -m engine bench tasks``: simulated tasks end to end, against the raw queue.

* ``tasks_per_s``: 10,000 simulated tasks with zero latency, submitted (in batches of 1,000)
  and then drained by one engine with 600 workers, from its start until the last is final
  (zero-latency tasks are bound by round trips: more at once make each batched statement
  carry more).
* ``tasks_not_succeeded``: how many of them ended otherwise (0 expected: the simulated provider
  fails nothing by default).
* ``submit_per_s``: the submission rate of those batches.
* ``queue_jobs_per_s`` / ``ratio_to_queue``: the queue's own burn-down in the same run.
* ``round_trips_per_task``: statements this process sent during the drain, per task.
"""

from __future__ import annotations

import trio

from engine.bench.common import BenchDatabase
from engine.bench.queue import burn_down
from engine.config import load_config
from engine.db.bridge import Counters
from engine.db.database import DatabaseUrls
from engine.domain.tasks import Identity, RunMode, TaskRequest
from engine.providers.simulated import SimulatedProvider
from engine.service.root import open as open_engine

__all__ = ["TARGETS", "run_tasks_bench"]

TARGETS: dict[str, tuple[str, float]] = {
    "tasks_per_s": (">=", 2000.0),
    # The simulated provider has no failures by default: any task not succeeded is a bug.
    "tasks_not_succeeded": ("<=", 0),
    "ratio_to_queue": (">=", 0.3),
}

_IDENTITY = Identity(tenant_id="bench", user_id="bench")
_FINAL = ("succeeded", "failed", "cancelled", "manual_review")


async def _tasks(url: str, count: int, max_workers: int) -> tuple[float, float, float, int]:
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
        before = Counters.statements
        started = trio.current_time()
        await eng.wait(requests[-1].id)
        # Every task final, whatever its outcome (a failed one must not hang the run); the
        # caller reports how many did not succeed.
        while True:
            counts = await eng.counts()
            if sum(counts.get(s, 0) for s in _FINAL) >= count:
                break
            await trio.sleep(0.01)
        elapsed = trio.current_time() - started
        trips = (Counters.statements - before) / count
    return count / elapsed, submit_rate, trips, count - counts.get("succeeded", 0)


async def run_tasks_bench(admin_url: str, *, quick: bool = False) -> dict[str, float]:
    """Run the task figures on fresh databases on ``admin_url``'s server."""
    count = 1000 if quick else 10_000
    results: dict[str, float] = {}
    async with BenchDatabase(admin_url) as db:
        rate, submit_rate, trips, not_succeeded = await _tasks(db.urls.tasks, count, 600)
    results["tasks_per_s"] = round(rate, 1)
    results["tasks_not_succeeded"] = not_succeeded
    results["submit_per_s"] = round(submit_rate, 1)
    results["round_trips_per_task"] = round(trips, 3)
    async with BenchDatabase(admin_url) as db:
        queue_rate = (await burn_down(db, count, 32)).jobs_per_s
    results["queue_jobs_per_s"] = round(queue_rate, 1)
    results["ratio_to_queue"] = round(rate / queue_rate, 3)
    return results
