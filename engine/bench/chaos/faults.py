"""The faults the chaos scenarios inject: SIGKILL of the busiest worker, ``pg_ctl restart``
of the private server, ``pg_terminate_backend`` of the engine's connections, and row locks held
while tasks come due (``lock_timeout``). Each returns a
:class:`~engine.bench.chaos.run.FaultReport`.
"""

from __future__ import annotations

import signal
import uuid
from datetime import datetime, timedelta

import trio

from engine import embedded
from engine.bench.chaos.harness import submit
from engine.bench.chaos.run import (
    BENCH_APPLICATION,
    IDENTITY,
    MODEL,
    ChaosRun,
    FaultReport,
    WorkerProcess,
    utc_now,
)
from engine.db.bridge import connect
from engine.domain.tasks import RunMode, TaskRequest

__all__ = [
    "backend_kill",
    "kill_busiest",
    "lock_timeout",
    "lock_timeout_outcome",
    "postgres_restart",
    "sigkill_worker",
]


async def kill_busiest(
    run: ChaosRun, *, counting: str = "", poll: float = 0.05
) -> tuple[WorkerProcess, int, datetime]:
    """SIGKILL the live worker running the most tasks (those matching the SQL condition
    ``counting`` too, if given), waiting up to 10 s for one; the victim, how many such tasks it
    ran, and when it was killed."""
    alive = {w.instance_id: w for w in run.alive()}
    with trio.fail_after(10):
        while True:
            rows = await run.monitor.fetch(
                "SELECT execution_owner, count(*) AS n FROM engine_task"
                " WHERE status = 'running' AND execution_owner = ANY($1::text[])"
                f"{' AND ' + counting if counting else ''}"
                " GROUP BY execution_owner ORDER BY n DESC LIMIT 1",
                list(alive),
            )
            if rows:
                break
            await trio.sleep(poll)
    victim = alive[rows[0]["execution_owner"]]
    at = utc_now()
    victim.proc.send_signal(signal.SIGKILL)
    victim.killed = True
    await victim.proc.wait()
    return victim, int(rows[0]["n"]), at


async def sigkill_worker(run: ChaosRun) -> FaultReport:
    """SIGKILL the live worker with the most running tasks (waiting up to 10 s for one)."""
    _, running, at = await kill_busiest(run)
    return FaultReport(at, {"victim_running_tasks": float(running)})


async def postgres_restart(run: ChaosRun) -> FaultReport:
    """``pg_ctl restart -m fast`` of the run's private server."""
    assert run.server is not None, "postgres_restart needs private_server=True"
    at = utc_now()
    start = trio.current_time()
    await trio.to_thread.run_sync(embedded.restart, run.server.data_dir)
    outage = trio.current_time() - start
    return FaultReport(at, {"outage_seconds": round(outage, 3)})


async def backend_kill(run: ChaosRun) -> FaultReport:
    """Terminate every ``engine%`` connection to the engine database."""
    at = utc_now()
    killed = await run.monitor.fetchval(
        "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM pg_stat_activity"
        " WHERE application_name LIKE 'engine%' AND pid <> pg_backend_pid()"
        " AND datname = current_database()"
    )
    return FaultReport(at, {"backends_killed": float(killed)})


_LOCKED_BATCH = 20
_LOCK_DUE = 1.0  # the locked batch comes due this long after it is submitted
_LOCK_HOLD = 3.0  # and its rows stay locked this long after submission


async def lock_timeout(run: ChaosRun) -> FaultReport:
    """Lock a batch of queued tasks while they come due; release after ``_LOCK_HOLD`` s."""
    due = utc_now() + timedelta(seconds=_LOCK_DUE)
    batch = [
        TaskRequest(
            model=MODEL,
            payload={"locked": n},
            identity=IDENTITY,
            run_mode=RunMode.SIMULATION,
            run_at=due,
        )
        for n in range(_LOCKED_BATCH)
    ]
    start = trio.current_time()
    holder = await connect(run.url, application_name=BENCH_APPLICATION)
    try:
        await submit(run, batch)
        locked_at = utc_now()
        async with holder.transaction():
            rows = await holder.fetch(
                "SELECT id FROM engine_task WHERE id = ANY($1::uuid[]) AND status = 'queued'"
                " FOR UPDATE SKIP LOCKED",
                [r.id for r in batch],
            )
            await trio.sleep_until(start + _LOCK_HOLD)
            at = utc_now()
    finally:
        await holder.close()
    locked = [r["id"] for r in rows]
    run.notes["locked"] = locked
    blocked = await run.monitor.fetchval(
        "SELECT count(*) FROM river_job WHERE args ->> 'task_id' = ANY($1::text[])"
        " AND attempted_at >= $2 AND attempted_at <= $3",
        [str(i) for i in locked],
        locked_at,
        at,
    )
    return FaultReport(
        at,
        {
            "locked_tasks": float(len(locked)),
            "blocked_claims": float(blocked),
            "hold_seconds": round((at - locked_at).total_seconds(), 3),
        },
    )


async def lock_timeout_outcome(run: ChaosRun) -> dict[str, float]:
    """``locked_not_succeeded``: locked tasks that did not end succeeded (requeued and run)."""
    locked: list[uuid.UUID] = run.notes.get("locked", [])
    succeeded = await run.monitor.fetchval(
        "SELECT count(*) FROM engine_task WHERE id = ANY($1::uuid[]) AND status = 'succeeded'",
        locked,
    )
    return {"locked_not_succeeded": float(len(locked) - succeeded)}
