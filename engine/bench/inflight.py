"""``python -m engine bench inflight``: many tasks waiting upstream at once in one process.

The gateway holds thousands of tasks that wait 10–20 minutes each on an upstream, polling every
few seconds. This bench holds N tasks in ``waiting_upstream`` in one engine process (a fixed
capacity of N): an upstream that answers "still running" for longer than the measurement lasts,
polled every 5 s, with the production lease settings (60 s leases renewed every 20 s). Once all N
are waiting, it measures for a window (60 s; quick 20 s), then stops the engine, which hands every
task back to the queue.

Figures, for each N (``--tasks N`` for one; default 1,000 and 10,000; quick 1,000):

* ``in_flight_<N>``: tasks waiting upstream at once (a generation runs at most 100,000);
* ``rss_kb_per_task_<N>``: the process's resident memory once they wait, minus before the
  engine started, per task;
* ``cores_<N>``: CPU seconds of the process per second of the window (1.0: one core);
* ``statements_per_s_<N>``: statements the process sent per second in the window (lease
  renewals, polls' bookkeeping, events);
* ``poll_lateness_p99_s_<N>``: how much later than its interval each poll came, p99;
* ``drain_s_<N>``: from the stop until the engine is closed and every task is back in the queue;
* ``errors_<N>``: what went wrong, counted: log records at error level or above from the
  engine's start to its close, tasks failed or in manual review when the window ends, and tasks
  not back in ``queued`` once the engine is closed.

Targets: at N = 10,000 at most 0.5 core, 10 KB per task, poll lateness p99 at most 1 s; at
N = 50,000 (``--tasks 50000``) all 50,000 in flight and no errors.
"""

from __future__ import annotations

import logging
import math
import resource
import time
from array import array
from pathlib import Path
from typing import Any

import trio

from engine.bench.common import BenchDatabase, percentile
from engine.config import EngineConfig, load_config
from engine.db.bridge import Counters, connect
from engine.db.database import DatabaseUrls
from engine.domain.tasks import Identity, RunMode, Task, TaskRequest
from engine.providers.base import PollResult
from engine.queue.generation import MAX_WORKERS
from engine.service.root import open as open_engine

__all__ = ["TARGETS", "HoldingProvider", "run_inflight_bench"]

TARGETS: dict[str, tuple[str, float]] = {
    "cores_10000": ("<=", 0.5),
    "rss_kb_per_task_10000": ("<=", 10.0),
    "poll_lateness_p99_s_10000": ("<=", 1.0),
    "in_flight_50000": (">=", 50_000.0),
    "errors_50000": ("<=", 0.0),
}

MODEL = "inflight-model"
POLL_INTERVAL = 5.0
_IDENTITY = Identity(tenant_id="bench", user_id="bench")


class HoldingProvider:
    """An upstream whose jobs never finish while the bench measures; records how late each
    poll of a job came after the previous one (its interval subtracted).

    Its own bookkeeping is allocated up front, so the memory per task the bench measures is
    the engine's: the last poll of each task sits in a preallocated array, indexed by the
    task's payload ``n`` (0 to ``tasks - 1``; ``tasks`` defaults to ``expected``).
    """

    poll_interval = POLL_INTERVAL

    def __init__(self, expected: int, *, tasks: int | None = None) -> None:
        self.submitted = 0
        #: Set once ``expected`` jobs were submitted.
        self.all_submitted = trio.Event()
        self._expected = expected
        self.lateness: list[float] = []
        self._last = array("d", [math.nan]) * (expected if tasks is None else tasks)
        self.recording = False

    async def prepare(self, task: Task) -> Any:
        """Nothing to prepare."""
        return None

    async def submit(self, task: Task, prepared: Any) -> str:
        """Accept the job at once."""
        self.submitted += 1
        if self.submitted >= self._expected:
            self.all_submitted.set()
        self._last[task.payload["n"]] = time.monotonic()
        return f"hold-{task.id}"

    async def poll(self, task: Task, upstream_ref: str) -> PollResult:
        """Still running; the lateness of this poll is recorded."""
        now = time.monotonic()
        n = task.payload["n"]
        last = self._last[n]
        if self.recording and not math.isnan(last):
            self.lateness.append(max(0.0, now - last - self.poll_interval))
        self._last[n] = now
        return _RUNNING

    async def finalize(self, task: Task, result: Any) -> Any:
        """Never reached while the bench measures."""
        return result

    async def cancel(self, task: Task, upstream_ref: str) -> None:
        """Nothing to cancel."""


_RUNNING = PollResult(done=False, progress=0.5)


class _ErrorCount(logging.Handler):
    """Counts log records at error level or above."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.count = 0

    def emit(self, record: logging.LogRecord) -> None:
        self.count += 1


def _rss_kb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return float(line.split()[1])
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # kB on Linux


async def _one(url: str, count: int, window: float) -> dict[str, float]:
    capacity = min(count, MAX_WORKERS)
    config = load_config(
        env={},
        overrides={
            "database.migrate_on_start": "false",
            "worker.capacity": "fixed",
            "worker.hard_limit": str(capacity),
            "worker.instance_hard_limit": str(capacity),
            "worker.shutdown_drain_timeout": "0",
            # The requeue of every running task at the stop takes ~0.3 ms a task (16 s for
            # 50,000): the default 10 s suits up to ~25,000 (worker.stop_timeout's doc).
            "worker.stop_timeout": str(max(10.0, capacity / 2000)),
            "metrics.enabled": "false",
            "tasks.demo_catalogue": "false",
            "database.pool_max_size": "20",
        },
    )
    urls = DatabaseUrls.single(url)
    requests = [
        TaskRequest(model=MODEL, payload={"n": n}, identity=_IDENTITY, run_mode=RunMode.LIVE)
        for n in range(count)
    ]
    async with open_engine(config, urls=urls, control=False) as client:
        await client.set_model(MODEL)
        for start in range(0, count, 1000):
            await client.submit(requests[start : start + 1000])
    provider = HoldingProvider(capacity, tasks=count)
    errors = _ErrorCount()
    logging.getLogger().addHandler(errors)
    before = _rss_kb()
    try:
        figures = await _hold(config, urls, provider, count, window, before)
    finally:
        logging.getLogger().removeHandler(errors)
    conn = await connect(url)
    try:
        not_queued = await conn.fetchval(
            "SELECT count(*) FROM engine_task WHERE status <> 'queued'"
        )
    finally:
        await conn.close()
    figures[f"errors_{count}"] += float(errors.count + not_queued)
    return figures


async def _hold(
    config: EngineConfig,
    urls: DatabaseUrls,
    provider: HoldingProvider,
    count: int,
    window: float,
    before: float,
) -> dict[str, float]:
    async with open_engine(config, urls=urls, providers={MODEL: provider}) as eng:
        with trio.fail_after(600):
            await provider.all_submitted.wait()
        # Let the first polls of every task pass, so each one has a previous poll.
        await trio.sleep(POLL_INTERVAL + 1)
        rss = _rss_kb()
        provider.recording = True
        statements, cpu, wall = Counters.statements, time.process_time(), time.monotonic()
        await trio.sleep(window)
        elapsed = time.monotonic() - wall
        cores = (time.process_time() - cpu) / elapsed
        rate = (Counters.statements - statements) / elapsed
        provider.recording = False
        counts = await eng.counts()
        in_flight = counts.get("running", 0)
        failed = counts.get("failed", 0) + counts.get("manual_review", 0)
        stopped_at = time.monotonic()
    drain = time.monotonic() - stopped_at
    return {
        f"in_flight_{count}": float(in_flight),
        f"rss_kb_per_task_{count}": round((rss - before) / max(1, in_flight), 2),
        f"cores_{count}": round(cores, 3),
        f"statements_per_s_{count}": round(rate, 1),
        f"poll_lateness_p99_s_{count}": round(percentile(provider.lateness, 99), 3),
        f"polls_{count}": float(len(provider.lateness)),
        f"drain_s_{count}": round(drain, 2),
        f"errors_{count}": float(failed),
    }


async def run_inflight_bench(
    admin_url: str, *, quick: bool = False, tasks: int | None = None
) -> dict[str, float]:
    """Hold each N in flight on a fresh database of ``admin_url``'s server; see the module
    docstring."""
    sizes = [tasks] if tasks is not None else ([1000] if quick else [1000, 10_000])
    window = 20.0 if quick else 60.0
    results: dict[str, float] = {}
    for count in sizes:
        async with BenchDatabase(admin_url) as db:
            results.update(await _one(db.urls.tasks, count, window))
    return results
