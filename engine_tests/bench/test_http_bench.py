"""The http scenario: a small real run of both modes, and its registration."""

from __future__ import annotations

import pytest

from engine.bench.http import run_http_bench
from engine.bench.runner import SCENARIOS


def test_the_http_scenario_is_registered_and_sized_by_tasks() -> None:
    assert SCENARIOS["http"].run is run_http_bench
    assert SCENARIOS["http"].takes_tasks


@pytest.mark.scenario
async def test_http_scenario_small(pg_admin_url: str, aio_loop: None) -> None:
    results = await run_http_bench(pg_admin_url, tasks=20)
    assert results["webhook_not_succeeded"] == 0
    assert results["polling_not_succeeded"] == 0
    assert results["webhook_polls"] == 0  # every task finished by its callback
    assert results["polling_polls"] >= 20
    assert 0 < results["webhook_p50_s"] <= results["webhook_p99_s"]
    assert results["webhook_tasks_per_s"] > 0 and results["polling_tasks_per_s"] > 0
