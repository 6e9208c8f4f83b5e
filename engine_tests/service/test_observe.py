"""The service hands its metrics to every part as it builds them: the first task of a fresh
engine is counted, with its claim, its phases and the capacity that ran it."""

from __future__ import annotations

import trio

from engine.db.database import DatabaseUrls
from engine.domain.tasks import TaskStatus
from engine.metrics import Metrics
from engine.service.root import open as open_engine
from engine_tests.tasks.conftest import make_config, request
from engine_tests.tasks.test_runner import GatedProvider


def value(metrics: Metrics, name: str, **labels: str) -> float:
    return metrics.registry.get_sample_value(name, labels) or 0.0


async def test_the_first_task_of_a_fresh_engine_is_observed(db_url: str) -> None:
    config = make_config(
        **{
            "worker.capacity": "registry",
            "worker.hard_limit": "4",
            "worker.refresh_interval": "0.5",
        }
    )
    async with open_engine(
        config, urls=DatabaseUrls.single(db_url), simulated=GatedProvider()
    ) as eng:
        metrics = eng.metrics
        # Nothing has run yet: no task, no claim that found work, no completion.
        assert value(metrics, "engine_tasks_total", status="succeeded", model="sim-model") == 0
        assert value(metrics, "engine_job_completions_total", state="completed") == 0
        await eng.set_model("sim-model", concurrency_limit=2)
        task_id = await eng.submit(request())
        assert (await eng.wait(task_id, timeout=10)).status is TaskStatus.SUCCEEDED
        # The outcome is counted as it is written; the job's completion one batch later.
        with trio.fail_after(10):
            while value(metrics, "engine_job_completions_total", state="completed") < 1:
                await trio.sleep(0.01)
        assert value(metrics, "engine_tasks_total", status="succeeded", model="sim-model") == 1
        assert value(metrics, "engine_task_queue_wait_seconds_count", model="sim-model") == 1
        phases = "engine_task_phase_seconds_count"
        assert value(metrics, phases, phase="preparing", model="sim-model") == 1
        assert value(metrics, "engine_job_claim_seconds_count") >= 1
        # The capacity refresher reported the share that ran it.
        assert value(metrics, "engine_capacity_allocated_slots") == 2
        assert value(metrics, "engine_capacity_resizes_total", outcome="success") >= 1
