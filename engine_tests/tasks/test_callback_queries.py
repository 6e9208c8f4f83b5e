"""The hot statements of callbacks and progress reports stay index-bound under generic and
custom plans, on a large, stale task table (as the task writes' own plan tests do)."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime

import pytest

from engine.db.bridge import Connection
from engine.db.database import Database
from engine.db.sqlfiles import QUERIES
from engine.tasks.callbacks import CallbackCleaner
from engine_tests.plans import PLAN_MODES, explain_prepared


async def _fill(conn: Connection) -> list[uuid.UUID]:
    """100,000 finished tasks analyzed, then 300 running ones and 5,000 callbacks."""
    await conn.execute(
        """
        ALTER TABLE engine_task SET (autovacuum_enabled = false);
        INSERT INTO engine_task (id, model, tenant_id, user_id, run_mode, payload, status,
                                 finished_at)
        SELECT gen_random_uuid(), 'm', 't', 'u', 'live', '{}', 'succeeded', now()
        FROM generate_series(1, 100000);
        INSERT INTO engine_task_callback (task_id, delivery, done)
        SELECT id, md5(id::text), true FROM engine_task LIMIT 5000;
        ANALYZE engine_task;
        ANALYZE engine_task_callback;
        """
    )
    rows = await conn.fetch(
        """
        INSERT INTO engine_task (id, model, tenant_id, user_id, run_mode, payload, status,
                                 phase, execution_token, submitted_at)
        SELECT gen_random_uuid(), 'm', 't', 'u', 'live', '{}', 'running', 'waiting_upstream',
               gen_random_uuid(), now()
        FROM generate_series(1, 300)
        RETURNING id
        """
    )
    return [r["id"] for r in rows]


@pytest.mark.parametrize("mode", PLAN_MODES)
async def test_callback_and_progress_statements_use_primary_keys(
    conn: Connection, mode: str
) -> None:
    ids = await _fill(conn)
    now = datetime.now(UTC).isoformat()
    n = len(ids)
    plans = {
        "task_callback_latest_many": await explain_prepared(
            conn, QUERIES["task_callback_latest_many"], [ids], mode
        ),
        "task_callback_record": await explain_prepared(
            conn,
            QUERIES["task_callback_record"],
            [ids[0], "d", "job-1", True, '{"x": 1}', None, None],
            mode,
        ),
        "task_report_progress_many": await explain_prepared(
            conn,
            QUERIES["task_report_progress_many"],
            [
                ids,
                ids,
                ["waiting_upstream"] * n,
                [0.5] * n,
                ["m"] * n,
                ['{"fraction": 0.2}'] * n,
                [False] * n,
                ["i"] * n,
                [now] * n,
            ],
            mode,
        ),
    }
    for name, plan in plans.items():
        text = json.dumps(plan)
        assert "engine_task_pkey" in text, (name, text)
        assert '"Seq Scan"' not in text, (name, text)
    latest = json.dumps(plans["task_callback_latest_many"])
    assert "engine_task_callback_pkey" in latest, latest
    assert "engine_task_callback_received_index" not in latest, latest


async def test_the_cleaner_deletes_callbacks_past_their_retention(database: Database) -> None:
    pool = database.tasks
    await pool.execute(
        "INSERT INTO engine_task_callback (task_id, delivery, done, received_at)"
        " SELECT gen_random_uuid(), 'old', true, now() - interval '2 days'"
        " FROM generate_series(1, 25)"
    )
    await pool.execute(
        "INSERT INTO engine_task_callback (task_id, delivery, done) VALUES ($1, 'new', false)",
        uuid.uuid4(),
    )
    cleaner = CallbackCleaner(pool, batch_size=10)
    assert await cleaner.run_once() == 25  # in batches of 10
    assert await pool.fetchval("SELECT array_agg(delivery) FROM engine_task_callback") == ["new"]
