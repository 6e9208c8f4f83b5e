"""A database blip at production lease settings: ``pg_ctl restart -m fast`` (about half a
second) under live executions loses no work, invents no manual review and leaves no execution
holding its lease or its scope slot without running.

The leases are the production defaults (60 s, renewed every 20 s): an execution that gave up on
its write would sit ``running`` until its lease expired, a whole minute, and hold the model's slot
meanwhile; the bound checked here is the outage plus a few seconds.
"""

from __future__ import annotations

import time
import uuid
from pathlib import Path

import pytest
import trio

from engine import embedded
from engine.domain.tasks import TaskStatus
from engine.errors import DatabaseError
from engine.providers.simulated import Latency, SimulatedProvider, SimulationConfig
from engine.service.root import open as open_engine
from engine_tests.tasks.conftest import make_config, request

TASKS = 40
LIMIT = 20  # the model's slots: half the tasks wait for a slot in admission
# Each task: prepare 0.2 s, then 8 polls 0.5 s apart: about 4 s, most of it waiting upstream.
SIMULATION = SimulationConfig(prepare=Latency(a=0.2), polls=8, poll_interval=0.5, seed=7)
NATURAL = 2 * 4.5  # two waves of LIMIT tasks, with no outage


@pytest.mark.slow
async def test_a_fast_restart_under_live_executions_at_production_leases(
    private_data_dir: Path,
) -> None:
    config = make_config(
        data_dir=str(private_data_dir),
        **{
            "database.migrate_on_start": "true",
            "tasks.lease_ttl": "60",
            "tasks.lease_renew_interval": "20",
            "worker.capacity": "fixed",
            "worker.instance_hard_limit": str(TASKS),
        },
    )
    provider = SimulatedProvider(SIMULATION)
    async with open_engine(config, simulated=provider) as eng:
        await eng.set_model("sim-model", concurrency_limit=LIMIT)
        started = time.monotonic()
        ids = await eng.submit([request() for _ in range(TASKS)])
        # Wait until the first wave is waiting upstream (submitted, polling).
        with trio.fail_after(30):
            while len(provider.submissions) < LIMIT:
                await trio.sleep(0.02)

        # Through the blip and after, watch for tasks the database calls running while no
        # execution of this (only) engine runs them: how long each stays so.
        orphaned_since: dict[uuid.UUID, float] = {}
        longest_orphan = 0.0

        async def watch_orphans() -> None:
            nonlocal longest_orphan
            while True:
                try:
                    rows = await eng.db.tasks.fetch(
                        "SELECT id FROM engine_task WHERE status = 'running'"
                    )
                except DatabaseError:
                    rows = None  # the server is restarting: nothing to compare yet
                if rows is not None:
                    now = time.monotonic()
                    orphans = {r["id"] for r in rows} - set(eng.keeper.running)
                    for task_id in list(orphaned_since):
                        if task_id not in orphans:
                            del orphaned_since[task_id]
                    for task_id in orphans:
                        since = orphaned_since.setdefault(task_id, now)
                        longest_orphan = max(longest_orphan, now - since)
                await trio.sleep(0.05)

        async with trio.open_nursery() as watching:
            watching.start_soon(watch_orphans)
            before = time.monotonic()
            await trio.to_thread.run_sync(embedded.restart, private_data_dir)
            outage = time.monotonic() - before

            with trio.fail_after(NATURAL + outage + 30):
                outcomes = [await eng.wait(task_id, timeout=None) for task_id in ids]
            took = time.monotonic() - started
            watching.cancel_scope.cancel()
        # No task sat running without an execution for longer than the outage plus 5 s (a
        # zombie would until its 60 s lease expired).
        assert longest_orphan <= outage + 5, (longest_orphan, outage)

        statuses = {o.status for o in outcomes}
        assert statuses == {TaskStatus.SUCCEEDED}, [
            (o.status, o.error) for o in outcomes if o.status is not TaskStatus.SUCCEEDED
        ]
        # Each reached the upstream exactly once: no resubmission after the blip.
        assert sorted(provider.submissions.values()) == [1] * TASKS
        # No execution sat out its 60 s lease: the whole batch took its natural time plus
        # about the outage, not a lease.
        assert took < NATURAL + outage + 5 + 10, (took, outage)
        async with eng.db.tasks.acquire() as conn:
            held = await conn.fetchval("SELECT count(*) FROM engine_scope_lease")
            reviews = await conn.fetchval(
                "SELECT count(*) FROM engine_task_event WHERE type = 'task.manual_review'"
            )
        assert held == 0  # no slot left behind by an execution that died on the blip
        assert reviews == 0
