"""``python -m engine demo``: the service and a batch of demo tasks in one process, for a first
look (the service starts, submits, shows the tasks' progress until they are final, stops)."""

from __future__ import annotations

import argparse
import sys

import trio

from engine.cli.catalogue import DEMO_MODELS
from engine.cli.submit import Progress, ProgressDisplay, TaskIds, follow_tasks
from engine.config import EngineConfig
from engine.tasks.models import Identity, RunMode, TaskRequest

__all__ = ["run_demo"]


def run_demo(args: argparse.Namespace, config: EngineConfig) -> int:
    """Run ``demo``; exit 0 once every demo task is final (some fail on purpose: 5 %)."""
    from engine.cli.main import EXIT_INTERRUPTED, EXIT_OK, _Shutdown, _until_signal, start_service

    async def demo(shutdown: _Shutdown) -> None:
        async with trio.open_nursery() as nursery:
            eng = await start_service(config, nursery, shutdown)
            if not await eng.db.coordination.fetchval(
                "SELECT enabled FROM engine_model WHERE name = $1", args.model
            ):
                await eng.set_model(args.model, concurrency_limit=DEMO_MODELS.get(args.model))
            requests = [
                TaskRequest(
                    model=args.model,
                    payload={"prompt": f"demo {n}"},
                    identity=Identity(tenant_id="demo", user_id="demo"),
                    run_mode=RunMode.SIMULATION,
                )
                for n in range(args.count)
            ]
            started = trio.current_time()
            ids = TaskIds(await eng.submit(requests))
            print(f"engine demo: submitted {len(ids)} tasks to {args.model}", flush=True)
            display = ProgressDisplay(sys.stdout)
            progress = Progress(total=len(ids))
            await follow_tasks(eng, ids, progress, display, started=started)
            display.finish(progress, interrupted=False)
            nursery.cancel_scope.cancel(reason="demo finished")

    if trio.run(_until_signal, demo) is not None:
        return EXIT_INTERRUPTED
    return EXIT_OK
