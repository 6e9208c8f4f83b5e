"""The resize and load scenarios: their analysis on made-up data, and a quick real run each."""

from __future__ import annotations

import math
import uuid
from datetime import UTC, datetime, timedelta

import pytest

from engine.bench.chaos.scope_limits import AdmittedExecution, running_over_limit
from engine.bench.load import TARGETS as LOAD_TARGETS
from engine.bench.load import run_load_bench
from engine.bench.resize import TARGETS as RESIZE_TARGETS
from engine.bench.resize import run_resize_bench
from engine.bench.resize_analysis import (
    Execution,
    RegistrySample,
    applied_converge_time,
    converge_time,
    even_split,
    executions_from_events,
    over_allocation,
)
from engine.bench.river_indexes import run_river_indexes_bench
from engine.bench.worker import parse_simulation, simulation_json
from engine.providers.simulated import Latency, SimulationConfig

A, B = "a", "b"


def _run(instance: str, start: float, end: float) -> Execution:
    return Execution(uuid.uuid4(), instance, start, end)


def test_even_split() -> None:
    assert even_split(10, 3) == [4, 3, 3]
    assert even_split(3, 3) == [1, 1, 1]
    assert even_split(20, 2) == [10, 10]
    assert even_split(2, 3) == [1, 1, 0]
    assert even_split(5, 0) == []


def test_executions_end_at_any_non_running_event_or_a_new_start() -> None:
    t1, t2, t3 = uuid.uuid4(), uuid.uuid4(), uuid.uuid4()
    events = [
        (t1, "task.queued", "queued", "client", 0.0),
        (t1, "task.started", "running", A, 1.0),
        (t1, "task.waiting", "queued", A, 1.1),  # back in line for admission
        (t1, "task.started", "running", B, 2.0),
        (t1, "task.submitted", "running", B, 2.1),
        (t1, "task.succeeded", "succeeded", B, 2.5),
        (t2, "task.started", "running", A, 3.0),  # A is killed at 3.5
        (t2, "task.started", "running", B, 7.0),  # taken over after recovery
        (t2, "task.succeeded", "succeeded", B, 7.2),
        (t3, "task.started", "running", B, 8.0),  # still open at the horizon
    ]
    runs = executions_from_events(events, killed={A: 3.5}, horizon=9.0)
    spans = sorted((r.instance_id, r.start, r.end) for r in runs)
    assert spans == [(A, 1.0, 1.1), (A, 3.0, 3.5), (B, 2.0, 2.5), (B, 7.0, 7.2), (B, 8.0, 9.0)]


def test_over_allocation_allows_carried_over_runs_but_not_new_starts() -> None:
    samples = [RegistrySample(t, {A: 4 if t < 1.0 else 1}) for t in (0.5, 1.0, 1.1, 1.2, 1.3)]
    carried = [_run(A, 0.1, 1.15) for _ in range(4)]
    clean = over_allocation(samples, carried, tolerance=0.05)
    assert clean.samples == 0
    assert clean.raw_samples == 2  # at 1.0 and 1.1 the four carried runs exceed 1
    assert clean.carryover_max_seconds == pytest.approx(0.2)
    # A run that starts after the shrink while the carried ones still hold the slots is a breach.
    breach = over_allocation(samples, [*carried, _run(A, 1.08, 1.4)], tolerance=0.05)
    assert breach.samples == 1
    assert breach.worst == (1.1, A, 5, 1)


def test_over_allocation_stops_checking_a_killed_instance() -> None:
    samples = [RegistrySample(t, {A: 1}) for t in (1.0, 2.0)]
    runs = [_run(A, 0.5, 3.0), _run(A, 0.5, 3.0)]
    assert over_allocation(samples, runs).samples == 2
    assert over_allocation(samples, runs, alive_until={A: 0.9}).samples == 0


def test_converge_time_needs_the_even_split_of_the_live_instances() -> None:
    samples = [
        RegistrySample(1.0, {A: 5, B: 5, "dead": 10}),
        RegistrySample(1.5, {A: 10, B: 10, "dead": 10}),  # decided while the dead row holds 10
        RegistrySample(2.0, {A: 10, B: 10, "dead": 0}),
    ]
    assert converge_time(samples, since=0.5, until=9, limit=20, live=[A, B]) == 1.0
    found = converge_time(samples, since=0.5, until=9, limit=20, live=[A, B], dead=["dead"])
    assert found == 1.5
    assert (
        converge_time(samples, since=0.5, until=1.8, limit=20, live=[A, B], dead=["dead"]) is None
    )


def test_applied_converge_time_follows_the_claim_limit_records() -> None:
    changes = {A: [(0.0, 4.0), (1.2, 1.0)], B: [(0.0, 3.0), (1.1, 1.0)], "c": [(0.0, 3.0)]}
    assert applied_converge_time(changes, since=1.0, until=9, limit=3, live=[A, B, "c"]) is None
    changes["c"].append((1.3, 1.0))
    found = applied_converge_time(changes, since=1.0, until=9, limit=3, live=[A, B, "c"])
    assert found == pytest.approx(0.3)


def _span(model: str, start: float, end: float) -> AdmittedExecution:
    at = datetime(2026, 1, 1, tzinfo=UTC)
    return AdmittedExecution(
        model, None, at + timedelta(seconds=start), at + timedelta(seconds=end)
    )


def test_scope_sweep_tells_a_hand_over_from_a_task_running_without_its_slot() -> None:
    limits = {"model:m": 1}
    # The next task's start stamped 3 ms before the previous one's end: a hand-over.
    handover = [_span("m", 0.0, 1.0), _span("m", 0.997, 2.0)]
    sweep = running_over_limit(handover, limits)
    assert (sweep.excesses, sweep.boundary_overlaps, sweep.peaks) == (0, 1, {"model:m": 1})
    assert sweep.longest == pytest.approx(0.003)
    # Two tasks side by side for 0.4 s: a real excess, and the peak shows it.
    breach = running_over_limit([_span("m", 0.0, 1.0), _span("m", 0.6, 2.0)], limits)
    assert (breach.excesses, breach.boundary_overlaps, breach.peaks) == (1, 0, {"model:m": 2})
    assert breach.longest == pytest.approx(0.4)
    # Ends sort before starts at the same instant; an unlimited model is not swept.
    exact = running_over_limit([_span("m", 0.0, 1.0), _span("m", 1.0, 2.0)], limits)
    assert (exact.excesses, exact.boundary_overlaps) == (0, 0)
    assert running_over_limit([_span("free", 0.0, 1.0)] * 3, limits).peaks == {}


def test_simulation_json_round_trips() -> None:
    config = SimulationConfig(poll=Latency("uniform", 0.1, 0.3), polls=2, cpu_seconds=0.02)
    assert parse_simulation(simulation_json(config)) == config
    assert parse_simulation('{"poll": 0.2}').poll == Latency("fixed", 0.2)
    with pytest.raises(ValueError):
        parse_simulation('{"nope": 1}')


@pytest.mark.slow
@pytest.mark.scenario
async def test_resize_scenario_quick(pg_admin_url: str, aio_loop: None) -> None:
    results = await run_resize_bench(pg_admin_url, quick=True)
    assert set(RESIZE_TARGETS) <= set(results)
    assert results["tasks_lost"] == 0
    assert results["tasks_run_twice"] == 0
    assert results["over_allocation_samples"] == 0
    assert math.isfinite(results["converge_seconds"])
    assert math.isfinite(results["takeover_seconds"])


@pytest.mark.slow
@pytest.mark.scenario
async def test_load_scenario_quick(pg_admin_url: str, aio_loop: None) -> None:
    results = await run_load_bench(pg_admin_url, quick=True)
    assert set(LOAD_TARGETS) <= set(results)
    for key in ("waiting_upstream_peak", "seconds", "recovered_seconds", "safe_capacity_min"):
        assert key in results
    assert results["heavy_limit_exceeded"] == 0
    assert results["tasks_succeeded"] == results["tasks"]


@pytest.mark.scenario
async def test_river_indexes_scenario_quick(pg_admin_url: str, aio_loop: None) -> None:
    results = await run_river_indexes_bench(pg_admin_url, quick=True)
    assert set(results) == {
        "none_jobs_per_s",
        "none_wal_bytes_per_job",
        *(
            f"{v}_{k}"
            for v in ("args", "kind", "metadata", "all_three")
            for k in ("jobs_per_s", "cost_pct", "wal_bytes_per_job")
        ),
    }
    assert all(results[f"{v}_jobs_per_s"] > 0 for v in ("none", "args", "all_three"))
    # Each index is written again by every claim and completion.
    assert results["all_three_wal_bytes_per_job"] > results["none_wal_bytes_per_job"]
