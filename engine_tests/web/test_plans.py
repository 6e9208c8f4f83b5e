"""The dashboard's task reads stay on indexes under generic and custom plans (the planner on
an empty table would pick a sequential scan, so scans are discouraged, as on a large table)."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

import pytest

from engine.db.bridge import Connection
from engine.db.sqlfiles import QUERIES
from engine_tests.plans import PLAN_MODES, explain_prepared, scans

NOW = datetime.now(UTC).isoformat()
CASES = {
    "task_page": [None, None, None, None, None, None, None, None, 50],
    "task_page_manual_review": [NOW, str(uuid.uuid4()), 25],
    "task_find_by_upstream_ref": ["ref-1", NOW, 50],
    "task_finished_per_minute": [3600.0, 1800.0],
}


@pytest.mark.parametrize("mode", PLAN_MODES)
@pytest.mark.parametrize("name", sorted(CASES))
async def test_dashboard_reads_use_indexes(conn: Connection, name: str, mode: str) -> None:
    await conn.execute("SET enable_seqscan = off")
    plan = await explain_prepared(conn, QUERIES[name], CASES[name], mode)
    tasks = [s for s in scans(plan) if s.get("Relation Name") == "engine_task"]
    assert tasks and all(s["Node Type"] != "Seq Scan" for s in tasks), (name, mode, plan)


async def test_live_counts_use_the_live_index(conn: Connection) -> None:
    # No parameters, so one plan; EXPLAIN it as it is.
    await conn.execute("SET enable_seqscan = off")
    text = await conn.fetchval("EXPLAIN (FORMAT JSON) " + QUERIES["task_count_live_by_model"])
    assert "engine_task_live_index" in str(text) and "Seq Scan" not in str(text)
