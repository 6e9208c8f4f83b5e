"""``python -m engine demo``: the service and a batch of tasks in one process, on the
simulation or against a real HTTP upstream (the fake, served on loopback by the same process)."""

from __future__ import annotations

import re

import pytest

from engine.db.database import Database

from .conftest import Cli

SUMMARY = re.compile(r"^(\d+) tasks: (.+) \(\d+\.\d s\)$", re.M)


@pytest.mark.slow
async def test_demo_against_a_fake_http_upstream_runs_every_task_through_the_kit(
    cli: Cli, database: Database
) -> None:
    result = await cli(
        "--set", "metrics.enabled=false", "demo", "--upstream", "http", "--count", "8"
    )
    out = result.ok()
    assert re.search(r"^engine demo: a fake upstream at http://127\.0\.0\.1:\d+$", out, re.M)
    assert "engine demo: submitted 8 tasks to demo-http" in out
    match = SUMMARY.search(out)
    assert match is not None and match.group(1) == "8", out
    # Each went through the HTTP kit: it holds the fake's job id, and the run was live.
    rows = await database.tasks.fetch(
        "SELECT status, run_mode, upstream_ref FROM engine_task WHERE model = 'demo-http'"
    )
    assert len(rows) == 8
    assert {r["run_mode"] for r in rows} == {"live"}
    assert all(r["upstream_ref"] and r["upstream_ref"].startswith("job-") for r in rows)
    assert {r["status"] for r in rows} <= {"succeeded", "failed"}  # 5 % fail upstream
