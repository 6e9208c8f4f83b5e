"""The queue's hot statements stay index-bound under generic and custom plans, on a table
with many dead tuples, many running jobs and statistics taken before either existed.

That is the table a drain leaves between two autovacuum runs: every job passed through
``running``, so the fetching index holds a dead ``running`` entry per job. A statement that looks
jobs up by id must go through the primary key; one that walked the index's ``running`` entries
instead slowed a 20,000-job drain on PostgreSQL 15 from ~6,400 to ~1,800 jobs/s.
"""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from engine.db.bridge import Connection
from engine.db.sqlfiles import QUERIES
from engine_tests.plans import PLAN_MODES, explain_prepared, scans

RUNNING = list(range(9_901, 9_933))  # the ids that are running (see the fixture)


@pytest.fixture(params=["analyzed while available", "never analyzed"])
async def drained(conn: Connection, request: pytest.FixtureRequest) -> Connection:
    """river_job mid-drain: 20,000 jobs (analyzed while all were available, or on a fresh
    install never analyzed at all: every guess then defaults), then 10,000 moved through
    running, 9,900 of them on to completed, with no vacuum in between."""
    analyze = "ANALYZE river_job;" if request.param == "analyzed while available" else ""
    await conn.execute(
        f"""
        ALTER TABLE river_job SET (autovacuum_enabled = false);
        INSERT INTO river_job (kind, args, queue, max_attempts)
        SELECT 'noop', jsonb_build_object('i', i), 'default', 25 FROM generate_series(1, 20000) i;
        {analyze}
        UPDATE river_job SET state = 'running', attempt = 1, attempted_at = now(),
                             attempted_by = '{{c}}'
        WHERE id <= 10000;
        UPDATE river_job SET state = 'completed', finalized_at = now() WHERE id <= 9900;
        """
    )
    return conn


_STATE_COND = re.compile(r"\bstate = (?:ANY \()?'\{?([a-z_,]+)\}?'")
_ID_COND = re.compile(r"\(id = ")


def _problems(plan: dict[str, Any], *, allowed_state_scans: tuple[str, ...] = ()) -> list[str]:
    """What is wrong with the plan's reads of river_job: a sequential scan, or an index walk
    by ``state`` where a lookup by id belongs."""
    problems = []
    for node in scans(plan):
        if node.get("Relation Name") != "river_job":
            continue
        kind, cond = node["Node Type"], node.get("Index Cond", "")
        if kind == "Seq Scan":
            problems.append("sequential scan of river_job")
            continue
        found = _STATE_COND.search(cond)
        if found and not _ID_COND.search(cond):
            states = set(found.group(1).split(","))
            if not states <= set(allowed_state_scans):
                problems.append(f"{kind} on {node.get('Index Name')} by {cond}")
    return problems


_N = len(RUNNING)
#: Each hot statement on river_job, its arguments, and the state walks it may do on purpose.
_STATEMENTS: dict[str, tuple[list[object], tuple[str, ...]]] = {
    # The claim walks the 'available' entries (its purpose); the completions it carries are
    # looked up by id.
    "job_get_available_completing": (
        ["default", 32, "c", None, RUNNING[:16], None, None],
        ("available",),
    ),
    "job_set_completed_if_running_many": ([RUNNING], ()),
    "job_set_state_if_running_many": (
        [
            RUNNING,
            ["retryable"] * _N,
            [1.0] * _N,
            [json.dumps({"error": "x"})] * _N,
            [False] * _N,
            [False] * _N,
            [None] * _N,
        ],
        (),
    ),
    "job_insert_many": (
        [
            ["noop"] * 3,
            ["{}"] * 3,
            ["default"] * 3,
            [1] * 3,
            [25] * 3,
            [None] * 3,
            ["available"] * 3,
            ["[]"] * 3,
            ["{}"] * 3,
            [None] * 3,
            [None] * 3,
            "river_insert",
            [],
        ],
        (),
    ),
    # Recovery looks for running jobs of a queue: walking those entries is its purpose.
    "job_rescue_orphaned_many": (["default", 60.0, 100, "me", [], []], ("running",)),
    # The scheduler walks the scheduled and retryable entries.
    "job_schedule": ([None, 1000], ("retryable", "scheduled")),
}


@pytest.mark.parametrize("mode", PLAN_MODES)
@pytest.mark.parametrize("name", sorted(_STATEMENTS))
async def test_hot_job_statements_stay_index_bound(
    drained: Connection, name: str, mode: str
) -> None:
    args, allowed = _STATEMENTS[name]
    plan = await explain_prepared(drained, QUERIES[name], args, mode)
    assert _problems(plan, allowed_state_scans=allowed) == [], json.dumps(plan, indent=1)
    by_id = name != "job_insert_many" and not allowed
    if by_id or name == "job_get_available_completing":
        assert any(n.get("Index Name") == "river_job_pkey" for n in scans(plan))
