"""The hot queries keep their index, and unique inserts hold under concurrent transactions."""

from __future__ import annotations

import json
import random

import pytest
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
            conn, QUERIES["job_get_available_completing"], "default", 10, "c", None, [], None, None
        )
    assert "river_job_prioritized_fetching_index" in plan
    assert '"Seq Scan"' not in plan.replace('"Relation Name": "river_queue"', "")


_CLAIM_TYPES = "text, integer, text, timestamptz, bigint[], text, text[]"


@pytest.mark.parametrize("plan_mode", ["force_generic_plan", "force_custom_plan"])
@pytest.mark.parametrize(
    "args_filter", [None, ("model", ("m1", "m2"))], ids=["no-filter", "model-filter"]
)
async def test_claim_query_stays_on_the_fetching_index_in_both_plan_modes(
    conn: Connection, plan_mode: str, args_filter: tuple[str, tuple[str, ...]] | None
) -> None:
    # A prepared statement switches to a generic plan after five runs; the claim must walk the
    # fetching index under either plan, with and without an args filter.
    await conn.execute(
        """
        INSERT INTO river_job (kind, args, queue, state, finalized_at, max_attempts)
        SELECT 'k', jsonb_build_object('model', 'm' || (i % 7)), 'default', 'completed', now(), 25
        FROM generate_series(1, 100000) AS i;
        INSERT INTO river_job (kind, args, queue, max_attempts)
        SELECT 'k', CASE WHEN i % 3 = 0 THEN '{}' ELSE jsonb_build_object('model', 'm' || (i % 7))
                    END, 'default', 25
        FROM generate_series(1, 50) AS i;
        ANALYZE river_job;
        """
    )
    await conn.execute(
        f"PREPARE claim({_CLAIM_TYPES}) AS {QUERIES['job_get_available_completing']}"
    )
    await conn.execute(f"SET plan_cache_mode = {plan_mode}")
    # EXECUTE takes no bind parameters: the filter goes in as literals.
    key, values = ("NULL", "NULL")
    if args_filter is not None:
        key, values = f"'{args_filter[0]}'", "'{" + ",".join(args_filter[1]) + "}'"
    async with conn.transaction():
        rows = await conn.fetch(
            "EXPLAIN (FORMAT JSON) EXECUTE claim('default', 10, 'c', NULL, '{}', "
            f"{key}, {values})"
        )
    plan = json.dumps(rows[0][0])
    assert "river_job_prioritized_fetching_index" in plan
    assert '"Seq Scan"' not in plan.replace('"Relation Name": "river_queue"', "")
    # The mode took: a generic plan keeps the parameters, a custom one has the values.
    assert ("$1" in plan) is (plan_mode == "force_generic_plan")


async def test_claim_filter_takes_jobs_without_the_key_null_or_an_allowed_value(
    conn: Connection,
) -> None:
    await conn.execute(
        """
        INSERT INTO river_job (kind, args, queue, max_attempts) VALUES
            ('k', '{"n": 1, "model": "a"}', 'default', 25),
            ('k', '{"n": 2, "model": "b"}', 'default', 25),
            ('k', '{"n": 3}', 'default', 25),
            ('k', '{"n": 4, "model": null}', 'default', 25),
            ('k', '{"n": 5, "model": "c"}', 'default', 25)
        """
    )
    claim = QUERIES["job_get_available_completing"]

    async def claimed(key: str | None, values: list[str] | None) -> list[int]:
        # Rolled back, so every claim sees the same five jobs.
        await conn.execute("BEGIN")
        try:
            rows = await conn.fetch(claim, "default", 10, "c", None, [], key, values)
        finally:
            await conn.execute("ROLLBACK")
        return sorted(r["args"]["n"] for r in rows)

    assert await claimed(None, None) == [1, 2, 3, 4, 5]
    assert await claimed("model", ["a", "c"]) == [1, 3, 4, 5]
    assert await claimed("model", ["b"]) == [2, 3, 4]
    assert await claimed("model", []) == [3, 4]


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
