"""A worker killed right after the upstream accepted a task: the task ends in manual review and
the upstream saw exactly one submission."""

from __future__ import annotations

import signal
import subprocess
import sys

import pytest
import trio

from engine.domain.tasks import TaskStatus
from engine.tasks.jobs import TaskRunArgs
from engine_tests.tasks.conftest import OpenEngine, request


@pytest.mark.slow
async def test_crash_after_upstream_submission_ends_in_manual_review(
    open_test_engine: OpenEngine, db_url: str
) -> None:
    async with open_test_engine(execute=False) as eng:
        await eng.set_model("sim-model")
        await eng.db.tasks.execute("CREATE TABLE sim_submission (task_id uuid)")
        task_id = await eng.submit(request())
        proc = await trio.lowlevel.open_process(
            [sys.executable, "-m", "engine_tests.tasks.crash_worker", db_url],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            with trio.fail_after(30):
                while not await eng.db.tasks.fetchval("SELECT count(*) FROM sim_submission"):
                    await trio.sleep(0.02)
        finally:
            proc.send_signal(signal.SIGKILL)
            await proc.wait()
        task = await eng.get(task_id)
        assert task is not None and task.status is TaskStatus.RUNNING
        assert task.submitted_at is not None and task.upstream_ref is None
        # The dead owner's lease runs out (here: at once) and another worker takes the job.
        await eng.db.tasks.execute(
            "UPDATE engine_task SET lease_expires_at = now() - interval '1 s' WHERE id = $1",
            task_id,
        )
        job = await eng.queue.get(task.river_job_id)  # type: ignore[arg-type]
        assert job is not None
        await eng.runner.work(job, TaskRunArgs(str(task_id)))
        final = await eng.wait(task_id, timeout=5)
        assert final.status is TaskStatus.MANUAL_REVIEW
        assert await eng.db.tasks.fetchval("SELECT count(*) FROM sim_submission") == 1
        assert eng.simulated.submissions == {}  # type: ignore[attr-defined]
