"""The hot queries keep their index, and unique inserts hold under concurrent transactions."""

from __future__ import annotations

import json
import random

import trio
import trio.lowlevel

from engine.db.bridge import Connection
from engine.db.database import Database
from engine.db.sqlfiles import QUERIES
from engine.queue import InsertOpts, UniqueOpts
from engine.queue.insert import insert_tx, prepare


async def _explain(conn: Connection, query: str, *args: object) -> str:
    rows = await conn.fetch("EXPLAIN (FORMAT JSON) " + query, *args)
    return json.dumps(rows[0][0])


async def test_claim_query_uses_the_fetching_index_on_100k_rows(conn: Connection) -> None:
    # 100k finished jobs and a few available ones: the shape of a busy queue's table.
    await conn.execute(
        """
        INSERT INTO river_job (kind, args, queue, state, finalized_at, max_attempts)
        SELECT 'k', '{}', 'default', 'completed', now(), 25 FROM generate_series(1, 100000);
        INSERT INTO river_job (kind, args, queue, max_attempts)
        SELECT 'k', '{}', 'default', 25 FROM generate_series(1, 50);
        ANALYZE river_job;
        """
    )
    async with conn.transaction():
        plan = await _explain(
            conn, QUERIES["job_get_available_completing"], "default", 10, "c", None, []
        )
    assert "river_job_prioritized_fetching_index" in plan
    assert '"Seq Scan"' not in plan.replace('"Relation Name": "river_queue"', "")


async def test_completion_query_uses_the_primary_key_on_100k_rows(conn: Connection) -> None:
    await conn.execute(
        """
        INSERT INTO river_job (kind, args, queue, state, attempted_at, max_attempts)
        SELECT 'k', '{}', 'default', 'running', now(), 25 FROM generate_series(1, 100000);
        ANALYZE river_job;
        """
    )
    async with conn.transaction():
        plan = await _explain(
            conn,
            QUERIES["job_set_state_if_running_many"],
            [1, 2, 3],
            ["completed"] * 3,
            [None] * 3,
            [None] * 3,
            [False] * 3,
            [False] * 3,
            [None] * 3,
        )
    assert "river_job_pkey" in plan
    assert '"Seq Scan"' not in plan


async def test_unique_inserts_from_concurrent_transactions_some_rolled_back(
    database: Database,
) -> None:
    opts = InsertOpts(unique=UniqueOpts(by_args=True, by_queue=True))
    keys = list(range(20))
    rng = random.Random(7)
    committed: set[int] = set()

    async def writer(i: int) -> None:
        for _ in range(10):
            key = rng.choice(keys)
            rollback = rng.random() < 0.4
            try:
                async with database.queue.transaction() as conn:
                    await insert_tx(conn, [prepare({"key": key}, opts, kind="u")])
                    await trio.lowlevel.checkpoint()
                    if rollback:
                        raise KeyError("roll back")
                committed.add(key)
            except KeyError:
                pass

    async with trio.open_nursery() as nursery:
        for i in range(8):
            nursery.start_soon(writer, i)
    rows = await database.queue.fetch(
        "SELECT args->>'key' AS key, count(*) FROM river_job GROUP BY 1"
    )
    counts = {int(r["key"]): r["count"] for r in rows}
    # Exactly one live job per committed key; rolled-back keys left nothing behind.
    assert counts == {k: 1 for k in committed}
