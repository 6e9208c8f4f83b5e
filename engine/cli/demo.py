"""``python -m engine demo``: the service and a batch of demo tasks in one process, for a first
look (the service starts, submits, shows the tasks' progress until they are final, stops).

``--upstream http`` runs them against a real HTTP upstream instead of the simulation: a fake
generation API (:mod:`engine.providers.http.fake`) served on loopback by the same process, and
the model ``demo-http`` described to the HTTP provider kit as ``[[http_models]]`` would (an
idempotency key, polls every half second; each job takes 2 s and 5 % of them fail upstream)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager

import attrs
import trio

from engine.cli.catalogue import DEMO_MODELS
from engine.cli.exits import EXIT_INTERRUPTED, EXIT_OK
from engine.cli.service import start_service
from engine.cli.signals import Shutdown, serve_until_signal
from engine.cli.submit import Progress, ProgressDisplay, TaskIds, follow_tasks
from engine.config import EngineConfig
from engine.domain.tasks import Identity, RunMode, TaskRequest

__all__ = ["HTTP_MODEL", "run_demo"]


#: The model ``--upstream http`` serves, and how its fake upstream behaves.
HTTP_MODEL = "demo-http"
_HTTP_JOB_SECONDS = 2.0
_HTTP_FAILURE_RATE = 0.05


def run_demo(args: argparse.Namespace, config: EngineConfig) -> int:
    """Run ``demo``; exit 0 once every demo task is final (some fail on purpose: 5 %)."""

    async def demo(shutdown: Shutdown) -> None:
        async with AsyncExitStack() as stack:
            service_config, model, mode = config, args.model, RunMode.SIMULATION
            if args.upstream == "http":
                service_config, model = await stack.enter_async_context(_http_upstream(config))
                mode = RunMode.LIVE
            nursery = await stack.enter_async_context(trio.open_nursery())
            eng = await start_service(service_config, nursery, shutdown)
            if not await eng.db.coordination.fetchval(
                "SELECT enabled FROM engine_model WHERE name = $1", model
            ):
                await eng.set_model(model, concurrency_limit=DEMO_MODELS.get(model))
            requests = [
                TaskRequest(
                    model=model,
                    payload={"prompt": f"demo {n}"},
                    identity=Identity(tenant_id="demo", user_id="demo"),
                    run_mode=mode,
                )
                for n in range(args.count)
            ]
            started = trio.current_time()
            ids = TaskIds(await eng.submit(requests))
            print(f"engine demo: submitted {len(ids)} tasks to {model}", flush=True)
            display = ProgressDisplay(sys.stdout)
            progress = Progress(total=len(ids))
            await follow_tasks(eng, ids, progress, display, started=started)
            display.finish(progress, interrupted=False)
            nursery.cancel_scope.cancel(reason="demo finished")

    if trio.run(serve_until_signal, demo) is not None:
        return EXIT_INTERRUPTED
    return EXIT_OK


@asynccontextmanager
async def _http_upstream(config: EngineConfig) -> AsyncIterator[tuple[EngineConfig, str]]:
    """Serve the fake upstream for the block; the configuration that also serves
    :data:`HTTP_MODEL` from it, and that model's name."""
    # Here, not at the top: the simulation demo loads no HTTP stack (httpx, the fake server).
    from engine.providers.http.fake import Dials, FakeUpstream, fake_http_model, serve_upstream

    dials = Dials(job_seconds=_HTTP_JOB_SECONDS, failure_rate=_HTTP_FAILURE_RATE)
    async with serve_upstream(FakeUpstream(dials, seed=1)) as url:
        print(f"engine demo: a fake upstream at {url}", flush=True)
        described = fake_http_model(url, HTTP_MODEL, idempotent=True, poll_interval=0.5)
        others = tuple(m for m in config.http_models if m.model != HTTP_MODEL)
        yield attrs.evolve(config, http_models=(*others, described)), HTTP_MODEL
