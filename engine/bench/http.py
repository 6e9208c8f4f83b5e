"""``python -m engine bench http``: HTTP-model tasks through the fake upstream, webhooks vs polling.

The same work twice, each on a fresh database: ``--tasks`` tasks (2,000; 200 with ``--quick``)
of one HTTP model whose upstream (:class:`~engine.providers.http.fake.FakeUpstream`, on a
loopback socket in this process) takes 1 s per job,

* ``webhook``: the upstream calls back ``POST /hooks/<task id>`` (signed) when a job is done;
  the engine polls only every 60 s as a fallback;
* ``polling``: no callbacks; the engine polls every 2 s.

Figures per mode: ``<mode>_tasks_per_s`` (tasks over the time from the first submission to
the last finish), ``<mode>_p50_s`` / ``<mode>_p99_s`` (end to end, each task's ``created_at``
to its ``finished_at``, both the server's clock), ``<mode>_polls`` (poll requests the
upstream answered) and ``<mode>_not_succeeded``; ``webhook_to_polling_p50`` compares the two.
The runner prints the server's version. The upstream, the engine and its HTTP server share
this process (and its CPU): on a small machine the figures are bound by how many HTTP
requests per second Python serves, and polling pays for its requests.
"""

from __future__ import annotations

import logging

import httpx
import trio

from engine.bench.common import BenchDatabase, percentile
from engine.config import load_config
from engine.db.database import DatabaseUrls
from engine.domain.tasks import Identity, RunMode, TaskRequest
from engine.providers.http.description import HttpCallback
from engine.providers.http.fake import FakeUpstream, fake_http_model, serve_upstream
from engine.providers.http.provider import HttpProvider
from engine.queue.generation import MAX_WORKERS
from engine.service.root import open as open_engine

__all__ = ["TARGETS", "run_http_bench"]

TARGETS: dict[str, tuple[str, float]] = {
    # The fake fails nothing: any task not succeeded is a bug.
    "webhook_not_succeeded": ("<=", 0),
    "polling_not_succeeded": ("<=", 0),
    # Callbacks finish tasks sooner than 2 s polls, and with far fewer requests.
    "webhook_to_polling_p50": ("<=", 1.0),
}

MODEL = "bench-http"
_SECRET_ENV = "BENCH_WEBHOOK_SECRET"
_ENVIRON = {_SECRET_ENV: "bench-secret"}
_IDENTITY = Identity(tenant_id="bench", user_id="bench")
_FINAL = ("succeeded", "failed", "cancelled", "manual_review")
_LATENCIES = (
    "SELECT extract(epoch FROM finished_at - created_at) AS e2e,"
    " extract(epoch FROM created_at) AS created, extract(epoch FROM finished_at) AS finished"
    " FROM engine_task WHERE model = $1 AND finished_at IS NOT NULL"
)
_OUTCOMES = (
    "SELECT status, error->>'code' AS code, count(*) AS n FROM engine_task WHERE model = $1"
    " GROUP BY 1, 2"
)
#: Upstream latency, the polling mode's poll interval, the webhook mode's fallback poll.
UPSTREAM_SECONDS = 1.0
POLL_INTERVAL = 2.0
FALLBACK_POLL = 60.0


async def _run_mode(url: str, count: int, *, webhook: bool) -> dict[str, float]:
    workers = min(count, MAX_WORKERS)
    config = load_config(
        env={},
        overrides={
            "database.migrate_on_start": "false",
            "worker.capacity": "fixed",
            "worker.hard_limit": str(workers),
            "metrics.enabled": "false",
            "metrics.port": "0",
        },
    )
    fake = FakeUpstream()
    fake.dials.job_seconds = UPSTREAM_SECONDS
    fake.dials.callback_secret = _ENVIRON[_SECRET_ENV] if webhook else None
    callback = HttpCallback(secret_env=_SECRET_ENV, poll_interval=FALLBACK_POLL)
    requests = [
        TaskRequest(model=MODEL, payload={"n": n}, identity=_IDENTITY, run_mode=RunMode.LIVE)
        for n in range(count)
    ]
    async with (
        serve_upstream(fake) as upstream_url,
        httpx.AsyncClient(limits=httpx.Limits(max_connections=32)) as client,
    ):
        model = fake_http_model(
            upstream_url,
            MODEL,
            poll_interval=POLL_INTERVAL,
            callback=callback if webhook else None,
        )
        provider = HttpProvider(model, client, environ=_ENVIRON)
        urls = DatabaseUrls.single(url)
        async with open_engine(config, urls=urls, providers={MODEL: provider}) as eng:
            await eng.set_model(MODEL)
            for start in range(0, count, 1000):
                await eng.submit(requests[start : start + 1000])
            while True:
                counts = await eng.counts()
                if sum(counts.get(s, 0) for s in _FINAL) >= count:
                    break
                await trio.sleep(0.1)
            rows = await eng.db.tasks.fetch(_LATENCIES, MODEL)
            outcomes = await eng.db.tasks.fetch(_OUTCOMES, MODEL)
    latencies = [float(r["e2e"]) for r in rows]
    span = max(float(r["finished"]) for r in rows) - min(float(r["created"]) for r in rows)
    mode = "webhook" if webhook else "polling"
    return {
        f"{mode}_tasks_per_s": round(count / span, 1),
        f"{mode}_p50_s": round(percentile(latencies, 50), 3),
        f"{mode}_p99_s": round(percentile(latencies, 99), 3),
        f"{mode}_polls": fake.polls,
        f"{mode}_not_succeeded": count - counts.get("succeeded", 0),
        # Why, when some did not: one figure per status and error code.
        **{
            f"{mode}_{r['status']}_{r['code'] or 'none'}": float(r["n"])
            for r in outcomes
            if r["status"] != "succeeded"
        },
    }


async def run_http_bench(
    admin_url: str, *, quick: bool = False, tasks: int | None = None
) -> dict[str, float]:
    """Run both modes on fresh databases on ``admin_url``'s server (``tasks`` tasks each;
    default 2,000, 200 when ``quick``)."""
    count = tasks if tasks is not None else (200 if quick else 2000)
    if count < 1:
        raise ValueError(f"--tasks must be at least 1, not {count}")
    results: dict[str, float] = {}
    # httpx logs every request at INFO: thousands of lines, and CPU the figures would pay for.
    chatty = logging.getLogger("httpx")
    level = chatty.level
    chatty.setLevel(logging.WARNING)
    try:
        for webhook in (True, False):
            async with BenchDatabase(admin_url) as db:
                results |= await _run_mode(db.urls.tasks, count, webhook=webhook)
    finally:
        chatty.setLevel(level)
    results["webhook_to_polling_p50"] = round(
        results["webhook_p50_s"] / max(results["polling_p50_s"], 1e-9), 3
    )
    return results
