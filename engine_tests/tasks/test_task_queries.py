"""Batched task writes: they keep to the primary key on a large table, stay linear in the batch
under either plan, and never deadlock."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime

import pytest
import trio

from engine.db.bridge import Connection
from engine.db.database import Database
from engine.db.sqlfiles import QUERIES
from engine.domain.tasks import Identity, RunMode, TaskRequest
from engine.queue.config import QueueConfig
from engine.tasks.config import TasksConfig
from engine.tasks.submit import submit_statement, validate_requests
from engine.testing.factories import make_task
from engine_tests.plans import PLAN_MODES, explain_prepared
from engine_tests.tasks.conftest import insert_running_tasks

#: Every batched write on engine_task, with arguments for ids ``$1`` and tokens ``$2``.
_BATCHED: dict[str, tuple[object, ...]] = {
    "task_lease_claim_many": ("owner", 30.0),
    "task_lease_renew_many": (30.0,),
    "task_mark_submitting_many": ("idempotently",),
    "task_unmark_submitting_many": (),
    "task_record_upstream_many": ("refs",),
    "task_set_phase_many": ("phases", "progress"),
    "task_finish_many": ("statuses", "results", "errors"),
    "task_requeue_many": ("delays", "only_before"),
    "task_report_progress_many": (
        "phases",
        "progress",
        "messages",
        "payloads",
        "simulated",
        "instances",
        "ats",
    ),
}


def _args(name: str, ids: list[uuid.UUID]) -> list[object]:
    n = len(ids)
    filler = {
        "refs": ["ref"] * n,
        "phases": ["finalizing"] * n,
        "progress": [0.9] * n,
        "statuses": ["succeeded"] * n,
        "results": [None] * n,
        "errors": [None] * n,
        "delays": [0.0] * n,
        "only_before": [False] * n,
        "idempotently": [False] * n,
        "messages": ["halfway"] * n,
        "payloads": [None] * n,
        "simulated": [True] * n,
        "instances": ["owner"] * n,
        "ats": [datetime.now(UTC).isoformat()] * n,
    }
    return [ids, ids, *(filler.get(str(a), a) for a in _BATCHED[name])]


@pytest.mark.parametrize("mode", PLAN_MODES)
@pytest.mark.parametrize("name", sorted(_BATCHED))
async def test_batched_task_writes_use_the_primary_key_on_100k_rows(
    conn: Connection, name: str, mode: str
) -> None:
    # Analyzed while every task was finished, then 300 became running and 20,000 rows were
    # rewritten with no vacuum since: stale statistics and dead tuples, under either plan.
    await conn.execute(
        """
        ALTER TABLE engine_task SET (autovacuum_enabled = false);
        INSERT INTO engine_task (id, model, tenant_id, user_id, run_mode, payload, status,
                                 finished_at)
        SELECT gen_random_uuid(), 'm', 't', 'u', 'simulation', '{}', 'succeeded', now()
        FROM generate_series(1, 100000);
        ANALYZE engine_task;
        UPDATE engine_task SET updated_at = now()
        WHERE id IN (SELECT id FROM engine_task LIMIT 20000);
        """
    )
    ids = await insert_running_tasks(conn, 300)
    plan = await explain_prepared(conn, QUERIES[name], _args(name, ids), mode)
    text = json.dumps(plan)
    assert "engine_task_pkey" in text, text
    assert '"Seq Scan"' not in text, text
    # Linear in the batch: no nested loop reads the whole input, or the locked rows, again for
    # every row (the generic plan guesses 10 rows for any array, so it would: ~0.1 ms a row
    # at 600 rows, and growing with the batch).
    assert list(_rescans_per_row(plan)) == [], text


@pytest.mark.parametrize("mode", PLAN_MODES)
@pytest.mark.parametrize("name", sorted(_BATCHED))
async def test_batched_task_writes_stay_linear_on_a_table_never_analyzed(
    conn: Connection, name: str, mode: str
) -> None:
    # A fresh install under a burst: 10,000 tasks submitted and claimed before autovacuum ever
    # analyzed the table. With no column statistics every `IS NULL` is guessed at 0.5 % of the
    # rows, so a plan believing the statement's own conditions leave one task would scan the
    # table once and, for each of its thousands of rows, the whole input (~0.75 s for 500).
    # The payloads are a prompt's size: on rows that narrow the table is small enough for a
    # hash join to look as cheap.
    status = "queued" if name == "task_lease_claim_many" else "running"
    await conn.execute(
        f"""
        ALTER TABLE engine_task SET (autovacuum_enabled = false);
        INSERT INTO engine_task (id, model, tenant_id, user_id, run_mode, payload, status,
                                 execution_token, execution_owner, lease_expires_at, started_at)
        SELECT g, 'm', 't', 'u', 'simulation', jsonb_build_object('prompt', repeat('x', 200)),
               '{status}',
               CASE WHEN '{status}' = 'running' THEN g END,
               CASE WHEN '{status}' = 'running' THEN 'owner' END,
               CASE WHEN '{status}' = 'running' THEN now() + interval '1 hour' END,
               CASE WHEN '{status}' = 'running' THEN now() END
        FROM (SELECT gen_random_uuid() AS g FROM generate_series(1, 10000)) s;
        """
    )
    ids = [r["id"] for r in await conn.fetch("SELECT id FROM engine_task LIMIT 500")]
    plan = await explain_prepared(conn, QUERIES[name], _args(name, ids), mode)
    assert list(_rescans_per_row(plan)) == [], json.dumps(plan)


def _rescans_per_row(plan: dict[str, object]) -> Iterator[str]:
    """The inner sides of nested loops that scan a whole set (the statement's input, or the
    ``locked`` CTE) once per outer row."""
    children = plan.get("Plans", [])
    assert isinstance(children, list)
    if plan.get("Node Type") == "Nested Loop":
        for child in children:
            inner = child.get("Parent Relationship") == "Inner"
            if inner and (
                child.get("Node Type") == "Function Scan"
                or (child.get("Node Type") == "CTE Scan" and child.get("CTE Name") == "locked")
            ):
                yield f"{child['Node Type']} {child.get('Alias')}"
    for child in children:
        yield from _rescans_per_row(child)


def _as_literal(value: object) -> object:
    """A submission argument in the form :func:`~engine_tests.plans.literal` renders."""
    if isinstance(value, list):
        return [_as_literal(v) for v in value]
    if isinstance(value, bytes):
        return "\\x" + value.hex()
    if isinstance(value, dict):
        return json.dumps(value)
    if isinstance(value, datetime):
        return value.isoformat()
    return value


@pytest.mark.parametrize("mode", PLAN_MODES)
@pytest.mark.parametrize("count", [1, 50])
async def test_submission_probes_the_catalogue_by_primary_key(
    conn: Connection, mode: str, count: int
) -> None:
    # A large catalogue and a large queue, analyzed: one submission (the hot case) or a batch
    # looks each model up by its key and finds live duplicates through River's unique index.
    await conn.execute(
        """
        INSERT INTO engine_model (name) SELECT 'm' || i FROM generate_series(1, 20000) AS i;
        INSERT INTO river_job (kind, args, queue, state, finalized_at, max_attempts)
        SELECT 'k', '{}', 'default', 'completed', now(), 25 FROM generate_series(1, 100000);
        ANALYZE engine_model;
        ANALYZE river_job;
        """
    )
    identity = Identity(tenant_id="t", user_id="u")
    later = datetime.now(UTC)
    requests = [
        TaskRequest(
            model=f"m{n + 1}",
            payload={"n": n},
            identity=identity,
            run_mode=RunMode.LIVE if n % 2 else RunMode.SIMULATION,
            run_at=later if n % 3 == 0 else None,
        )
        for n in range(count)
    ]
    payloads = validate_requests(requests, TasksConfig())
    query, args = submit_statement(
        requests, payloads, queue=QueueConfig(), instance_id="i", notify_channel="ch"
    )
    assert query == QUERIES["task_submit_one" if count == 1 else "task_submit_many"]
    plan = await explain_prepared(conn, query, [_as_literal(a) for a in args], mode)
    text = json.dumps(plan)
    assert "engine_model_pkey" in text, text
    assert '"Seq Scan"' not in text, text
    assert '"Conflict Arbiter Indexes": ["river_job_unique_idx"]' in text, text


async def test_concurrent_batches_over_the_same_tasks_never_deadlock(database: Database) -> None:
    # A lease renewal and a phase change (or a finish) cover the same running tasks at once;
    # without locking in one order, the two statements can each wait on the other's rows.
    async with database.tasks.acquire() as conn:
        ids = await insert_running_tasks(conn, 400)
    rounds = 15

    async def renewals() -> None:
        for _ in range(rounds):
            await database.tasks.fetch(QUERIES["task_lease_renew_many"], ids, ids, 30.0)

    async def phases() -> None:
        backwards = list(reversed(ids))
        for _ in range(rounds):
            await database.tasks.fetch(
                QUERIES["task_set_phase_many"],
                backwards,
                backwards,
                ["finalizing"] * len(ids),
                [0.9] * len(ids),
            )

    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            for _ in range(2):
                nursery.start_soon(renewals)
                nursery.start_soon(phases)
    renewed = await database.tasks.fetch(QUERIES["task_lease_renew_many"], ids, ids, 30.0)
    assert len(renewed) == len(ids)


async def test_recovery_releases_a_pending_claim_whose_owner_died(conn: Connection) -> None:
    # A claim of a limited task waits for admission holding a token while the task stays
    # queued; if its owner dies there, recovery must free the task for the next claim.
    rows = await conn.fetch(
        """
        INSERT INTO engine_task (id, model, tenant_id, user_id, run_mode, payload, status,
                                 execution_token, execution_owner, lease_expires_at, attempts)
        VALUES (gen_random_uuid(), 'm', 't', 'u', 'simulation', '{}', 'queued',
                gen_random_uuid(), 'dead', now() + interval '1 hour', 0),
               (gen_random_uuid(), 'm', 't', 'u', 'simulation', '{}', 'queued',
                gen_random_uuid(), 'alive', now() - interval '1 second', 0),
               (gen_random_uuid(), 'm', 't', 'u', 'simulation', '{}', 'queued',
                gen_random_uuid(), 'alive', now() + interval '1 hour', 0)
        RETURNING id, execution_owner, lease_expires_at < now() AS expired
        """
    )
    dead, expired, held = (r["id"] for r in rows)
    recovered = await conn.fetch(QUERIES["task_recover_interrupted_many"], ["dead"], 100, "me")
    assert sorted(r["id"] for r in recovered) == sorted([dead, expired])
    assert {r["status"] for r in recovered} == {"queued"}
    after = {
        r["id"]: r
        for r in await conn.fetch(
            "SELECT id, status, execution_token, attempts, finished_at FROM engine_task"
        )
    }
    for task_id in (dead, expired):
        task = after[task_id]
        assert task["status"] == "queued" and task["execution_token"] is None
        assert task["attempts"] == 0 and task["finished_at"] is None
    assert after[held]["execution_token"] is not None  # a live claim keeps its lease


async def test_every_move_by_recovery_is_written_to_the_tasks_history(conn: Connection) -> None:
    """Recovery requeues, sends to manual review or cancels running tasks whose owner is gone,
    and each move is an event with the reason, the lost owner and the recovering instance."""
    rows = await conn.fetch(
        """
        INSERT INTO engine_task (id, model, tenant_id, user_id, run_mode, payload, status,
                                 execution_token, execution_owner, lease_expires_at, attempts,
                                 submitted_at, upstream_ref, cancel_requested_at)
        VALUES
            -- polling upstream when its owner died: requeued, resumes polling
            (gen_random_uuid(), 'm', 't', 'u', 'live', '{}', 'running', gen_random_uuid(),
             'dead', now() + interval '1 hour', 1, now(), 'ref-1', NULL),
            -- submitted, answer never recorded: manual review
            (gen_random_uuid(), 'm', 't', 'u', 'live', '{}', 'running', gen_random_uuid(),
             'alive', now() - interval '1 second', 1, now(), NULL, NULL),
            -- cancel requested before submission: cancelled
            (gen_random_uuid(), 'm', 't', 'u', 'simulation', '{}', 'running', gen_random_uuid(),
             'dead', now() + interval '1 hour', 1, NULL, NULL, now())
        RETURNING id
        """
    )
    polling, ambiguous, cancelling = (r["id"] for r in rows)
    recovered = await conn.fetch(QUERIES["task_recover_interrupted_many"], ["dead"], 100, "me")
    assert {r["id"]: r["status"] for r in recovered} == {
        polling: "queued",
        ambiguous: "manual_review",
        cancelling: "cancelled",
    }
    events = {
        r["task_id"]: r
        for r in await conn.fetch(
            "SELECT task_id, type, status, message, payload, simulated, instance_id"
            " FROM engine_task_event"
        )
    }
    assert {k: (e["type"], e["status"]) for k, e in events.items()} == {
        polling: ("task.requeued", "queued"),
        ambiguous: ("task.manual_review", "manual_review"),
        cancelling: ("task.cancelled", "cancelled"),
    }
    assert events[polling]["payload"] == {
        "reason": "owner_gone", "owner": "dead", "recovered_by": "me"
    }  # fmt: skip
    assert events[ambiguous]["payload"]["reason"] == "lease_expired"
    assert "resumes polling" in events[polling]["message"]
    assert events[cancelling]["simulated"] and events[polling]["instance_id"] == "me"


async def test_an_unknown_submission_made_with_an_idempotency_key_is_requeued(
    conn: Connection,
) -> None:
    """Its owner died between the call and the answer: with a key, submitting again with the
    same key is safe, so recovery (and a live owner's requeue) puts it back in the queue with
    its submission kept; without a key it goes to manual review, as before."""
    rows = await conn.fetch(
        """
        INSERT INTO engine_task (id, model, tenant_id, user_id, run_mode, payload, status,
                                 execution_token, execution_owner, lease_expires_at, attempts,
                                 submitted_at, submitted_idempotently)
        VALUES
            (gen_random_uuid(), 'm', 't', 'u', 'live', '{}', 'running', gen_random_uuid(),
             'dead', now() + interval '1 hour', 1, now(), true),
            (gen_random_uuid(), 'm', 't', 'u', 'live', '{}', 'running', gen_random_uuid(),
             'dead', now() + interval '1 hour', 1, now(), false),
            (gen_random_uuid(), 'm', 't', 'u', 'live', '{}', 'running', gen_random_uuid(),
             'alive', now() + interval '1 hour', 1, now(), true),
            (gen_random_uuid(), 'm', 't', 'u', 'live', '{}', 'running', gen_random_uuid(),
             'alive', now() + interval '1 hour', 1, now(), false)
        RETURNING id, execution_token
        """
    )
    keyed, unkeyed, keyed_live, unkeyed_live = rows
    recovered = await conn.fetch(QUERIES["task_recover_interrupted_many"], ["dead"], 100, "me")
    assert {r["id"]: r["status"] for r in recovered} == {
        keyed["id"]: "queued",
        unkeyed["id"]: "manual_review",
    }
    message = await conn.fetchval(
        "SELECT message FROM engine_task_event WHERE task_id = $1", keyed["id"]
    )
    assert "made again with the same key" in message
    # A live owner handing back after a lost connection takes the same fork.
    live = [keyed_live, unkeyed_live]
    requeued = await conn.fetch(
        QUERIES["task_requeue_many"],
        [r["id"] for r in live],
        [r["execution_token"] for r in live],
        [0.0, 0.0],
        [False, False],
    )
    assert {r["id"]: r["status"] for r in requeued} == {
        keyed_live["id"]: "queued",
        unkeyed_live["id"]: "manual_review",
    }
    kept = await conn.fetchval(
        "SELECT submitted_at IS NOT NULL AND submitted_idempotently FROM engine_task WHERE id = $1",
        keyed["id"],
    )
    assert kept  # the next run knows its call was made, and with a key


@pytest.mark.parametrize("submitted", [False, True])
@pytest.mark.parametrize("ref", [None, "up-1"])
@pytest.mark.parametrize("idempotently", [False, True])
async def test_python_and_the_database_state_one_rule_for_an_ambiguous_submission(
    conn: Connection, submitted: bool, ref: str | None, idempotently: bool
) -> None:
    """``Task.submission_ambiguous`` and the SQL function the requeue and recovery statements
    use agree on every combination: started, no reference, no idempotency key."""
    submitted_at = datetime.now(UTC) if submitted else None
    task = make_task(
        submitted_at=submitted_at, upstream_ref=ref, submitted_idempotently=idempotently
    )
    in_sql = await conn.fetchval(
        "SELECT engine_task_submission_ambiguous($1, $2, $3)", submitted_at, ref, idempotently
    )
    assert task.submission_ambiguous is in_sql
    assert task.submission_ambiguous is (submitted and ref is None and not idempotently)
