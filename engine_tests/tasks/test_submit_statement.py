"""Submission is one statement: models checked, jobs, tasks and first events written together,
or nothing written at all."""

from __future__ import annotations

import re
import uuid
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import trio

from engine.db.bridge import Connection, connect
from engine.db.listen import RESYNC, Listener, Notification
from engine.db.sqlfiles import QUERIES
from engine.domain.tasks import RunMode, TaskRequest
from engine.errors import InvalidTask, UniqueViolation
from engine.queue.config import QueueConfig
from engine.queue.notifier import insert_payload
from engine.service.engine import Engine
from engine.tasks.config import TasksConfig
from engine.tasks.jobs import TaskJob, insert_task_jobs
from engine.tasks.submit import submit_tasks
from engine_tests.tasks.conftest import OpenEngine, request

_QUEUE = QueueConfig()
_CHANNEL = "test_submit_insert"


async def _submit(conn: Connection, requests: Sequence[TaskRequest]) -> None:
    await submit_tasks(
        conn,
        requests,
        queue=_QUEUE,
        tasks=TasksConfig(),
        instance_id="test",
        notify_channel=_CHANNEL,
    )


async def _counts(conn: Connection) -> tuple[int, int, int]:
    """Tasks, jobs and task events stored."""
    row = await conn.fetchrow(
        "SELECT (SELECT count(*) FROM engine_task) AS tasks,"
        " (SELECT count(*) FROM river_job) AS jobs,"
        " (SELECT count(*) FROM engine_task_event) AS events"
    )
    assert row is not None
    return row["tasks"], row["jobs"], row["events"]


class _Queries:
    """Every query asyncpg sends on a connection (BEGIN and COMMIT included), from the second
    submission on: the first run of each statement on a connection also looks up its types
    (River's ``river_job_state`` enum), once, as asyncpg does on every connection."""

    def __init__(self, conn: Connection) -> None:
        self.sent: list[str] = []
        conn.raw.add_query_logger(lambda logged: self.sent.append(logged.query))

    @classmethod
    async def warmed(cls, conn: Connection) -> _Queries:
        """Run both statements once (rejected submissions, which store nothing), then log."""
        for count in (1, 2):
            with pytest.raises(InvalidTask):
                await _submit(conn, [request("no-such-model") for _ in range(count)])
        return cls(conn)


async def test_a_submit_is_one_statement_storing_task_job_and_event_together(
    conn: Connection,
) -> None:
    await conn.execute("INSERT INTO engine_model (name) VALUES ('echo')")
    req = request("echo", run_mode=RunMode.LIVE, payload={"prompt": "a cat"})
    queries = await _Queries.warmed(conn)
    await _submit(conn, [req])
    # No BEGIN, no COMMIT, no catalogue lookup: the one statement is its own transaction.
    assert queries.sent == [QUERIES["task_submit_one"]]
    assert not conn.raw.is_in_transaction()
    row = await conn.fetchrow(
        "SELECT t.river_job_id, t.status, t.payload, t.tenant_id, t.api_key_id,"
        " j.id AS job_id, j.args, j.state::text AS job_state,"
        " t.xmin::text AS task_xact, j.xmin::text AS job_xact"
        " FROM engine_task t JOIN river_job j ON j.id = t.river_job_id WHERE t.id = $1",
        req.id,
    )
    assert row is not None
    assert row["river_job_id"] == row["job_id"] and row["status"] == "queued"
    assert row["payload"] == {"prompt": "a cat"}
    assert (row["tenant_id"], row["api_key_id"]) == ("t1", "k1")
    assert row["args"] == {"task_id": str(req.id), "model": "echo"}
    assert row["job_state"] == "available"
    events = await conn.fetch(
        "SELECT type, status, instance_id, xmin::text AS xact FROM engine_task_event"
        " WHERE task_id = $1",
        req.id,
    )
    assert [(e["type"], e["status"], e["instance_id"]) for e in events] == [
        ("task.queued", "queued", "test")
    ]
    # Written by one transaction: the three rows carry the same creating transaction id.
    assert row["task_xact"] == row["job_xact"] == events[0]["xact"]


class _Rollback(Exception):
    pass


async def _job_row(conn: Connection, store: Any, job: TaskJob) -> dict[str, Any]:
    """The river_job row ``store`` writes for ``job``'s task, in a transaction rolled back."""
    try:
        async with conn.transaction():
            await store()
            row = await conn.fetchrow(
                "SELECT * FROM river_job WHERE args ->> 'task_id' = $1", str(job.task_id)
            )
            assert row is not None
            found = dict(row.items())
            raise _Rollback
    except _Rollback:
        pass
    return found


@pytest.mark.parametrize("run_mode", [RunMode.LIVE, RunMode.SIMULATION])
@pytest.mark.parametrize("later", [False, True], ids=["now", "scheduled"])
@pytest.mark.parametrize("count", [1, 2], ids=["one", "many"])
async def test_the_job_a_submission_stores_is_the_one_insert_task_jobs_stores(
    conn: Connection, run_mode: RunMode, later: bool, count: int
) -> None:
    """The statements build the job's columns themselves: they must stay those of the queue's
    own insert (``job_insert_many``), which a River client shares."""
    await conn.execute("INSERT INTO engine_model (name) VALUES ('echo')")
    run_at = datetime.now(UTC) + timedelta(hours=1) if later else None
    req = request("echo", run_mode=run_mode, run_at=run_at)
    job = TaskJob(req.id, req.model, req.run_mode, req.run_at)

    async def by_submission() -> None:
        await _submit(conn, [req, request("echo")][:count])

    async def by_queue_insert() -> None:
        await insert_task_jobs(conn, [job], queue=_QUEUE, notify_channel=_CHANNEL)

    submitted = await _job_row(conn, by_submission, job)
    inserted = await _job_row(conn, by_queue_insert, job)
    # The id is the sequence's next; an available job is scheduled at the statement's now().
    differ = {"id", "created_at"} | (set() if later else {"scheduled_at"})
    assert {k: v for k, v in submitted.items() if k not in differ} == {
        k: v for k, v in inserted.items() if k not in differ
    }
    assert submitted["state"] == ("scheduled" if later else "available")
    assert submitted["unique_key"] is not None


async def _next_real(listener: Listener) -> Notification:
    while True:
        note = await listener.receive.receive()
        if note != RESYNC:
            return note


async def test_an_unknown_or_disabled_model_stores_and_notifies_nothing(
    db_url: str, conn: Connection
) -> None:
    await conn.execute(
        "INSERT INTO engine_model (name, enabled) VALUES ('echo', true), ('off', false)"
    )
    batch = [request("echo"), request("nope"), request("off"), request("echo")]
    listener = Listener(db_url, [_CHANNEL])
    async with trio.open_nursery() as nursery:
        await nursery.start(listener.run)
        queries = await _Queries.warmed(conn)
        with pytest.raises(InvalidTask) as raised:
            await _submit(conn, batch)
        assert str(raised.value) == (
            "task rejected; nothing was stored:\n"
            "  - request 1: unknown model 'nope'\n"
            "  - request 2: model 'off' is disabled"
        )
        assert queries.sent == [QUERIES["task_submit_many"]]  # checked by the statement itself
        assert await _counts(conn) == (0, 0, 0)
        # Notifications arrive in commit order: the marker is the first, so the rejected
        # statement sent none.
        await conn.execute("SELECT pg_notify($1, 'marker')", _CHANNEL)
        with trio.fail_after(5):
            assert await _next_real(listener) == Notification(_CHANNEL, "marker")
        # And an accepted one does wake the producers.
        await _submit(conn, [batch[0], batch[3]])
        with trio.fail_after(5):
            assert await _next_real(listener) == Notification(_CHANNEL, insert_payload(_QUEUE.name))
        nursery.cancel_scope.cancel()
    assert await _counts(conn) == (2, 2, 2)


async def test_the_engine_rejects_a_disabled_model_with_the_same_text(eng: Engine) -> None:
    await eng.set_model("off", enabled=False)
    with pytest.raises(
        InvalidTask,
        match=re.escape(
            "task rejected; nothing was stored:\n  - request 0: model 'off' is disabled"
        ),
    ):
        await eng.submit(request("off"))
    async with eng.db.tasks.acquire() as conn:
        assert await _counts(conn) == (0, 0, 0)


async def test_a_batch_of_many_requests_in_one_call(conn: Connection) -> None:
    """More than one job-insert chunk (5,000) of live and simulation tasks over two models,
    some due later: one statement, each task pointing at its own job."""
    await conn.execute("INSERT INTO engine_model (name) VALUES ('echo'), ('flux')")
    later = datetime.now(UTC) + timedelta(hours=1)
    batch = [
        request(
            ("echo", "flux")[n % 2],
            run_mode=(RunMode.LIVE, RunMode.SIMULATION)[n % 3 == 0],
            run_at=later if n % 5 == 0 else None,
            payload={"n": n},
        )
        for n in range(6_000)
    ]
    queries = await _Queries.warmed(conn)
    await _submit(conn, batch)
    assert queries.sent == [QUERIES["task_submit_many"]]
    assert await _counts(conn) == (6_000, 6_000, 6_000)
    rows = await conn.fetch(
        "SELECT t.id, t.model, t.run_mode, t.payload, j.args, j.state::text AS state"
        " FROM engine_task t JOIN river_job j ON j.id = t.river_job_id"
    )
    assert len(rows) == 6_000
    by_id = {r["id"]: r for r in rows}
    for n, req in enumerate(batch):
        row = by_id[req.id]
        assert row["payload"] == {"n": n} and row["model"] == req.model
        assert row["args"]["task_id"] == str(req.id)
        assert row["args"].get("model") == (req.model if req.run_mode is RunMode.LIVE else None)
        assert row["state"] == ("scheduled" if n % 5 == 0 else "available")


async def test_a_task_id_already_stored_is_refused_and_nothing_changes(conn: Connection) -> None:
    await conn.execute("INSERT INTO engine_model (name) VALUES ('echo')")
    first = request("echo")
    await _submit(conn, [first])
    before = await conn.fetchrow("SELECT * FROM river_job")
    again = TaskRequest(model="echo", payload={"other": 1}, identity=first.identity, id=first.id)
    fresh = request("echo")
    # Its job is live: the insert finds it, then the task row collides.
    with pytest.raises(UniqueViolation) as raised:
        await _submit(conn, [fresh, again])
    assert raised.value.constraint_name == "engine_task_pkey"
    assert await _counts(conn) == (1, 1, 1)
    assert await conn.fetchrow("SELECT * FROM river_job") == before
    # Its job is finished: the insert makes a new one, then the task row collides; the new
    # job goes with the statement.
    await conn.execute("UPDATE river_job SET state = 'completed', finalized_at = now()")
    with pytest.raises(UniqueViolation):
        await _submit(conn, [fresh, again])
    assert await _counts(conn) == (1, 1, 1)
    task = await conn.fetchrow("SELECT payload FROM engine_task WHERE id = $1", first.id)
    assert task is not None and task["payload"] == {"prompt": "a cat"}


async def test_two_requests_with_one_id_are_refused_before_any_round_trip(
    conn: Connection,
) -> None:
    one = request()
    twin = TaskRequest(model=one.model, payload={}, identity=one.identity, id=one.id)
    queries = await _Queries.warmed(conn)
    with pytest.raises(InvalidTask, match="two requests have the same id"):
        await _submit(conn, [one, twin])
    assert queries.sent == []


async def test_submit_tx_stores_nothing_when_the_callers_transaction_rolls_back(
    open_test_engine: OpenEngine,
) -> None:
    async with open_test_engine(execute=False) as eng:
        await eng.set_model("sim-model")
        async with eng.db.tasks.acquire() as conn:
            with pytest.raises(_Rollback):
                async with conn.transaction():
                    await eng.submit_tx(conn, [request() for _ in range(3)])
                    assert await _counts(conn) == (3, 3, 3)  # visible inside it
                    raise _Rollback
            assert await _counts(conn) == (0, 0, 0)


async def test_a_rejected_submit_tx_leaves_the_callers_transaction_usable(
    open_test_engine: OpenEngine,
) -> None:
    async with open_test_engine(execute=False) as eng:
        await eng.set_model("sim-model")
        kept = request()
        async with eng.db.tasks.acquire() as conn:
            async with conn.transaction():
                with pytest.raises(InvalidTask, match="unknown model 'nope'"):
                    await eng.submit_tx(conn, [request(), request("nope")])
                await eng.submit_tx(conn, [kept])
            assert await _counts(conn) == (1, 1, 1)
            stored = await conn.fetchval("SELECT id FROM engine_task")
    assert isinstance(stored, uuid.UUID) and stored == kept.id


def test_the_single_statement_is_the_batch_statement_over_scalars() -> None:
    """``task_submit_one`` differs from ``task_submit_many`` only in how it reads its input."""
    one, many = QUERIES["task_submit_one"], QUERIES["task_submit_many"]
    rest = "problems AS MATERIALIZED ("
    assert one[one.index(rest) :] == many[many.index(rest) :]
    assert "$1::text[]" in many and "$1::text AS kind" in one


async def test_a_submit_cancelled_while_its_statement_waits_stores_nothing(
    open_test_engine: OpenEngine, db_url: str
) -> None:
    """Cancelled in flight, the statement is cancelled on the server too, before submit
    returns: nothing stored, and the next submit goes through."""
    async with open_test_engine(execute=False) as eng:
        await eng.set_model("sim-model")
        admin = await connect(db_url)
        try:
            async with admin.transaction():
                await admin.execute("LOCK TABLE engine_task IN SHARE MODE")
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(eng.submit, request())
                    with trio.fail_after(10):
                        while not await admin.fetchval(
                            "SELECT count(*) FROM pg_stat_activity WHERE datname ="
                            " current_database() AND wait_event_type = 'Lock'"
                        ):
                            await trio.sleep(0.01)
                    nursery.cancel_scope.cancel()
                # Still holding the lock: the statement is gone from the server already.
                assert not await admin.fetchval(
                    "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                    " AND wait_event_type = 'Lock'"
                )
            assert await _counts(admin) == (0, 0, 0)
            kept = await eng.submit(request())
            assert await _counts(admin) == (1, 1, 1)
            assert await admin.fetchval("SELECT id FROM engine_task") == kept
        finally:
            await admin.close()
