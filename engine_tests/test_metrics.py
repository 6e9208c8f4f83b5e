"""Metrics (their HTTP server is engine.web: engine_tests/web/test_server.py)."""

from __future__ import annotations

import enum
from datetime import UTC, datetime, timedelta

import attrs
import pytest
import trio
from prometheus_client import REGISTRY

import engine
from engine.load.controller import LoadSnapshot
from engine.load.pressure import PressureState
from engine.metrics import (
    EXECUTION_PHASES,
    JOB_STATES,
    MAX_MODEL_LABELS,
    OTHER_MODEL,
    RESIZE_OUTCOMES,
    Metrics,
)

ALL_NAMES = [
    "engine_capacity_allocated_slots",
    "engine_capacity_desired_slots",
    "engine_capacity_hard_limit_slots",
    "engine_capacity_capped",
    "engine_capacity_cluster_allocated_slots",
    "engine_instances_alive",
    "engine_capacity_resizes_total",
    "engine_load_safe_capacity_slots",
    "engine_load_heavy_limit_slots",
    "engine_load_pressure_state",
    "engine_executions_active",
    "engine_executions_in_phase",
    "engine_queue_jobs",
    "engine_job_claim_seconds",
    "engine_job_completion_batch_seconds",
    "engine_job_completions_total",
    "engine_task_phase_seconds",
    "engine_tasks_total",
    "engine_recoveries_total",
    "engine_admissions_waiting",
    "engine_leader",
    "engine_generations",
    "engine_task_queue_wait_seconds",
    "engine_task_end_to_end_seconds",
    "engine_build_info",
    "process_cpu_seconds_total",
    "python_info",
]


def value(metrics: Metrics, name: str, **labels: str) -> float | None:
    return metrics.registry.get_sample_value(name, labels)


def snapshot(pressure_state: PressureState = PressureState.ELEVATED) -> LoadSnapshot:
    return LoadSnapshot(
        mode="adaptive",
        claim_limit=10,
        safe_capacity=8,
        heavy_limit=6,
        active=7,
        preparing=2,
        waiting_upstream=4,
        finalizing=1,
        pressure_state=pressure_state,
        pressure_reason="cpu",
        sampled_at=1.0,
    )


class State(enum.StrEnum):
    COMPLETED = "completed"
    RETRYABLE = "retryable"


@attrs.frozen
class Done:
    """Stands in for ``engine.queue.executor.Completion``: only ``state`` is read."""

    state: State


@attrs.frozen
class Timed:
    """Stands in for ``engine.domain.tasks.Task``: only the timing fields are read."""

    model: str = "m"
    attempts: int = 1
    created_at: datetime = attrs.field(factory=lambda: datetime.now(UTC) - timedelta(seconds=5))
    started_at: datetime | None = attrs.field(
        factory=lambda: datetime.now(UTC) - timedelta(seconds=2)
    )


# --- the metrics -----------------------------------------------------------------------------


def test_render_contains_every_metric() -> None:
    metrics = Metrics()
    # Touch the labelled series that only exist once used, so they render samples too.
    metrics.set_queue_depth({"default": {"available": 1}})
    metrics.completions_flushed([Done(State.COMPLETED)], 0.01)
    metrics.phase_done("preparing", 1.0, "m")
    metrics.task_finished("succeeded", Timed())
    metrics.task_started(Timed())
    metrics.count_recoveries("orphaned_jobs", 0)
    metrics.set_admissions_waiting({"m": 1})
    text = metrics.render().decode()
    for name in ALL_NAMES:
        assert f"\n{name}" in text or text.startswith(name), name
        assert f"# TYPE {name} " in text, name


def test_own_registry_never_the_global_one() -> None:
    first, second = Metrics(), Metrics()  # would raise "Duplicated timeseries" if shared
    assert first.registry is not second.registry
    assert first.registry is not REGISTRY
    first.set_leader(True)
    assert value(first, "engine_leader") == 1
    assert value(second, "engine_leader") == 0
    assert REGISTRY.get_sample_value("engine_leader") is None


def test_capacity_limits_are_separate_series() -> None:
    metrics = Metrics()
    metrics.capacity_changed(allocated=3, desired=12, hard_limit=8, capped=True)
    assert value(metrics, "engine_capacity_allocated_slots") == 3
    assert value(metrics, "engine_capacity_desired_slots") == 12
    assert value(metrics, "engine_capacity_hard_limit_slots") == 8
    assert value(metrics, "engine_capacity_capped") == 1
    metrics.capacity_changed(allocated=3, desired=5, hard_limit=8, capped=False)
    assert value(metrics, "engine_capacity_capped") == 0

    metrics.cluster_changed(active_instances=4, cluster_allocated=40)
    assert value(metrics, "engine_instances_alive") == 4
    assert value(metrics, "engine_capacity_cluster_allocated_slots") == 40


def test_resize_counter_increments() -> None:
    metrics = Metrics()
    for outcome in RESIZE_OUTCOMES:  # every outcome exists from the start, at 0
        assert value(metrics, "engine_capacity_resizes_total", outcome=outcome) == 0
    metrics.resized("success")
    metrics.resized("success")
    metrics.resized("refresh_failed")
    assert value(metrics, "engine_capacity_resizes_total", outcome="success") == 2
    assert value(metrics, "engine_capacity_resizes_total", outcome="refresh_failed") == 1
    assert value(metrics, "engine_capacity_resizes_total", outcome="start_failed") == 0
    with pytest.raises(ValueError, match="unknown resize outcome"):
        metrics.resized("succes")


def test_load_limits_usage_and_one_hot_pressure() -> None:
    metrics = Metrics()

    def pressure() -> dict[str, float | None]:
        return {
            s.value: value(metrics, "engine_load_pressure_state", state=s.value)
            for s in PressureState
        }

    assert pressure() == {"normal": 1, "elevated": 0, "critical": 0}
    for phase in EXECUTION_PHASES:  # every phase exists from the start, at 0
        assert value(metrics, "engine_executions_in_phase", phase=phase) == 0
    metrics.set_load(snapshot())
    # Limits ...
    assert value(metrics, "engine_load_safe_capacity_slots") == 8
    assert value(metrics, "engine_load_heavy_limit_slots") == 6
    # ... and usage, in series of their own.
    assert value(metrics, "engine_executions_active") == 7
    in_phase = {p: value(metrics, "engine_executions_in_phase", phase=p) for p in EXECUTION_PHASES}
    assert in_phase == {"preparing": 2, "waiting_upstream": 4, "finalizing": 1}
    assert pressure() == {"normal": 0, "elevated": 1, "critical": 0}
    metrics.set_load(snapshot(pressure_state=PressureState.CRITICAL))
    assert pressure() == {"normal": 0, "elevated": 0, "critical": 1}
    metrics.set_pressure_state("normal")
    assert pressure() == {"normal": 1, "elevated": 0, "critical": 0}
    with pytest.raises(ValueError):
        metrics.set_pressure_state("panic")


def test_admissions_waiting_by_model_is_a_full_snapshot() -> None:
    metrics = Metrics()
    metrics.set_admissions_waiting({"image": 7, "video": 2})
    assert value(metrics, "engine_admissions_waiting", model="image") == 7
    assert value(metrics, "engine_admissions_waiting", model="video") == 2
    # A model whose waiters were all admitted reads 0, not its last value.
    metrics.set_admissions_waiting({"video": 1})
    assert value(metrics, "engine_admissions_waiting", model="image") == 0
    assert value(metrics, "engine_admissions_waiting", model="video") == 1


def test_queue_depth_is_a_full_snapshot() -> None:
    metrics = Metrics()
    metrics.set_queue_depth({"default": {"available": 5, "running": 2}, "media": {"retryable": 1}})
    assert value(metrics, "engine_queue_jobs", queue="default", state="available") == 5
    assert value(metrics, "engine_queue_jobs", queue="default", state="running") == 2
    for state in JOB_STATES:  # zero-filled
        assert value(metrics, "engine_queue_jobs", queue="media", state=state) is not None
    assert value(metrics, "engine_queue_jobs", queue="media", state="scheduled") == 0

    metrics.set_queue_depth({"default": {"available": 1}})
    assert value(metrics, "engine_queue_jobs", queue="default", state="available") == 1
    assert value(metrics, "engine_queue_jobs", queue="default", state="running") == 0
    # A queue that disappeared is removed, not left at its last value.
    assert value(metrics, "engine_queue_jobs", queue="media", state="retryable") is None


def test_completions_and_carried_writes() -> None:
    metrics = Metrics()
    batch = [Done(State.COMPLETED), Done(State.COMPLETED), Done(State.RETRYABLE)]
    metrics.completions_flushed(batch, 0.02)
    assert value(metrics, "engine_job_completions_total", state="completed") == 2
    assert value(metrics, "engine_job_completions_total", state="retryable") == 1
    assert value(metrics, "engine_job_completion_batch_seconds_count") == 1
    assert value(metrics, "engine_job_completion_batch_seconds_sum") == pytest.approx(0.02)
    # A write carried by a claim has no duration of its own: counted, not timed.
    metrics.completions_flushed([Done(State.COMPLETED)] * 3, None)
    assert value(metrics, "engine_job_completion_batch_seconds_count") == 1
    assert value(metrics, "engine_job_completions_total", state="completed") == 5
    # An empty batch counts and times nothing.
    metrics.completions_flushed([], 0.0)
    assert value(metrics, "engine_job_completion_batch_seconds_count") == 1
    assert value(metrics, "engine_job_completions_total", state="completed") == 5


def test_the_other_engine_metrics() -> None:
    metrics = Metrics()
    metrics.claimed(0.004)
    assert value(metrics, "engine_job_claim_seconds_count") == 1
    metrics.phase_done("finalizing", 42.0, "m")
    assert value(metrics, "engine_task_phase_seconds_count", phase="finalizing", model="m") == 1
    metrics.count_task("failed", "m", 3)
    assert value(metrics, "engine_tasks_total", status="failed", model="m") == 3
    metrics.count_recovery_round({"requeued_async_tasks": 2, "orphaned_jobs": 0})
    assert value(metrics, "engine_recoveries_total", kind="requeued_async_tasks") == 2
    assert value(metrics, "engine_recoveries_total", kind="orphaned_jobs") == 0
    metrics.generations_changed(2)
    assert value(metrics, "engine_generations") == 2
    metrics.set_leader(True)
    metrics.set_leader(False)
    assert value(metrics, "engine_leader") == 0


def test_task_latencies_and_model_label() -> None:
    metrics = Metrics()
    metrics.task_started(Timed())
    assert value(metrics, "engine_task_queue_wait_seconds_count", model="m") == 1
    assert value(metrics, "engine_task_queue_wait_seconds_sum", model="m") == pytest.approx(
        3.0, abs=0.1
    )
    # A later attempt is not a wait for the queue.
    metrics.task_started(Timed(attempts=2))
    assert value(metrics, "engine_task_queue_wait_seconds_count", model="m") == 1
    metrics.task_finished("succeeded", Timed())
    assert value(metrics, "engine_tasks_total", status="succeeded", model="m") == 1
    count = "engine_task_end_to_end_seconds_count"
    assert value(metrics, count, model="m", status="succeeded") == 1
    total = value(metrics, "engine_task_end_to_end_seconds_sum", model="m", status="succeeded")
    assert total is not None and 5.0 <= total < 60.0
    # No task (the run failed before its claim returned it): counted, not timed.
    metrics.task_finished("failed", None)
    assert value(metrics, "engine_tasks_total", status="failed", model="unknown") == 1


def test_model_label_is_bounded() -> None:
    metrics = Metrics()
    for i in range(MAX_MODEL_LABELS):
        assert metrics.model_label(f"m{i}") == f"m{i}"
    assert metrics.model_label("one-too-many") == OTHER_MODEL
    assert metrics.model_label("m0") == "m0"  # models already seen keep their label
    metrics.count_task("failed", "one-too-many")
    assert value(metrics, "engine_tasks_total", status="failed", model=OTHER_MODEL) == 1


def test_build_info_and_process_collectors() -> None:
    metrics = Metrics()
    assert value(metrics, "engine_build_info", version=engine.__version__) == 1
    assert value(metrics, "process_cpu_seconds_total") is not None
    text = metrics.render().decode()
    assert "python_info{" in text


# --- the identities, on a real database --------------------------------------------------------


async def test_completions_counter_equals_completed_jobs(db_url: str) -> None:
    """Every job completion is counted, including those a producer's claim carried."""
    from engine_tests.service.test_service import service
    from engine_tests.tasks.conftest import request

    n = 30
    async with service(db_url) as (eng, _):
        await eng.set_model("sim-model", concurrency_limit=4)
        ids = await eng.submit([request() for _ in range(n)])
        for task_id in ids:
            assert (await eng.wait(task_id, timeout=20)).status.value == "succeeded"
        # wait() returns once the task row is final; the job row and the counter follow it.
        completed_sql = "SELECT count(*) FROM river_job WHERE state = 'completed'"
        with trio.fail_after(10):
            while (completed := await eng.db.queue.fetchval(completed_sql)) < n:
                await trio.sleep(0.01)
            while value(eng.metrics, "engine_job_completions_total", state="completed") != (
                completed
            ):
                await trio.sleep(0.01)
        assert completed == n
        assert await eng.db.queue.fetchval(completed_sql) == n
        assert value(eng.metrics, "engine_job_completions_total", state="completed") == n
        # Per model: every task counted once, timed once from submission to start and to its
        # final status, and each phase observed once per task.
        m = eng.metrics
        assert value(m, "engine_tasks_total", status="succeeded", model="sim-model") == n
        assert value(m, "engine_task_queue_wait_seconds_count", model="sim-model") == n
        end_to_end = "engine_task_end_to_end_seconds_count"
        assert value(m, end_to_end, model="sim-model", status="succeeded") == n
        for phase in ("preparing", "waiting_upstream", "finalizing"):
            count = "engine_task_phase_seconds_count"
            assert value(m, count, phase=phase, model="sim-model") == n, phase
