"""Every insert call takes the same forms of a job, on a real database: attrs args whose class
names its kind, or a mapping with a kind; bulk inserts take args, ``(args, opts)`` or
``InsertManyParams``. A mapping without a kind is refused before anything is stored."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import ClassVar

import attrs
import pytest

from engine.db.database import Database
from engine.db.sqlfiles import QUERIES
from engine.queue import (
    InsertManyParams,
    InsertOpts,
    InsertResult,
    Job,
    JobError,
    JobState,
    QueueClient,
    UniqueOpts,
    open_queue,
)
from engine.queue.config import QueueConfig


@attrs.frozen
class Email:
    kind: ClassVar[str] = "email"
    to: str


@attrs.frozen
class NoKind:
    to: str


@pytest.fixture
async def client(database: Database) -> AsyncIterator[QueueClient]:
    async with open_queue(database, QueueConfig(default_max_attempts=7)) as queue:
        yield queue


async def _rows(client: QueueClient) -> list[tuple[str, dict[str, object], str, int, int]]:
    rows = await client.db.queue.fetch(
        "SELECT kind, args, queue, priority, max_attempts FROM river_job ORDER BY id"
    )
    return [(r["kind"], r["args"], r["queue"], r["priority"], r["max_attempts"]) for r in rows]


async def test_insert_takes_attrs_args_and_a_mapping_with_a_kind(client: QueueClient) -> None:
    typed = await client.insert(Email("ada@example.com"))
    mapped = await client.insert({"to": "alan@example.com"}, InsertOpts(queue="q2"), kind="email")
    assert typed.job.kind == mapped.job.kind == "email"
    assert await _rows(client) == [
        ("email", {"to": "ada@example.com"}, "default", 1, 7),
        ("email", {"to": "alan@example.com"}, "q2", 1, 7),
    ]


async def test_insert_refuses_a_mapping_without_a_kind_and_stores_nothing(
    client: QueueClient,
) -> None:
    with pytest.raises(JobError, match=r"mapping have no kind: pass kind="):
        await client.insert({"to": "ada@example.com"})
    with pytest.raises(JobError, match="NoKind has no 'kind'"):
        await client.insert(NoKind("ada@example.com"))
    with pytest.raises(JobError, match=r"1\.\.127 characters"):
        await client.insert({"to": "ada@example.com"}, kind="")
    assert await _rows(client) == []


async def test_insert_tx_takes_the_same_forms_and_follows_the_transaction(
    client: QueueClient,
) -> None:
    async with client.db.queue.acquire() as conn:
        async with conn.transaction():
            typed = await client.insert_tx(conn, Email("ada@example.com"))
            mapped = await client.insert_tx(conn, {"to": "alan@example.com"}, kind="email")
            assert await client.get(typed.job.id) is None  # not committed yet
        with pytest.raises(JobError, match="mapping have no kind"):
            async with conn.transaction():
                await client.insert_tx(conn, Email("grace@example.com"))
                await client.insert_tx(conn, {"to": "edsger@example.com"})
    assert [r[1] for r in await _rows(client)] == [
        {"to": "ada@example.com"},
        {"to": "alan@example.com"},
    ]
    assert mapped.job.kind == "email"


def _four_forms() -> list[object]:
    return [
        Email("a@example.com"),
        (Email("b@example.com"), InsertOpts(priority=3)),
        (Email("c@example.com"), None),
        InsertManyParams({"to": "d@example.com"}, InsertOpts(queue="q2"), kind="email"),
        InsertManyParams(Email("e@example.com"), InsertOpts(max_attempts=2)),
        InsertManyParams(Email("f@example.com"), kind="renamed"),
    ]


_EXPECTED = [
    ("email", {"to": "a@example.com"}, "default", 1, 7),
    ("email", {"to": "b@example.com"}, "default", 3, 7),
    ("email", {"to": "c@example.com"}, "default", 1, 7),
    ("email", {"to": "d@example.com"}, "q2", 1, 7),
    ("email", {"to": "e@example.com"}, "default", 1, 2),
    ("renamed", {"to": "f@example.com"}, "default", 1, 7),
]


def _in_order(results: list[InsertResult]) -> list[tuple[str, object]]:
    return [(r.job.kind, r.job.args["to"]) for r in results]


async def test_insert_many_takes_args_pairs_and_insert_many_params(client: QueueClient) -> None:
    results = await client.insert_many(_four_forms())
    assert _in_order(results) == [(k, a["to"]) for k, a, *_ in _EXPECTED]
    assert all(not r.skipped and r.job.state is JobState.AVAILABLE for r in results)
    assert await _rows(client) == _EXPECTED


async def test_insert_many_tx_takes_the_same_forms_and_follows_the_transaction(
    client: QueueClient,
) -> None:
    async with client.db.queue.acquire() as conn:
        with pytest.raises(RuntimeError):
            async with conn.transaction():
                await client.insert_many_tx(conn, [Email("gone@example.com")])
                raise RuntimeError("rollback")
        async with conn.transaction():
            results = await client.insert_many_tx(conn, _four_forms())
            assert await client.get(results[0].job.id) is None  # not committed yet
    assert _in_order(results) == [(k, a["to"]) for k, a, *_ in _EXPECTED]
    assert await _rows(client) == _EXPECTED


@pytest.mark.parametrize(
    ("items", "message"),
    [
        (
            [Email("a@example.com"), {"to": "b@example.com"}],
            r"insert_many item 1: job args given as a mapping have no kind: pass "
            r"InsertManyParams\(args, opts, kind=\.\.\.\)",
        ),
        (
            [(Email("a@example.com"), None), ({"to": "b@example.com"}, InsertOpts())],
            r"insert_many item 1: .*InsertManyParams",
        ),
        (
            [InsertManyParams({"to": "a@example.com"})],
            r"insert_many item 0: .*mapping have no kind",
        ),
        (
            [Email("a@example.com"), Email("b@example.com"), NoKind("c@example.com")],
            r"insert_many item 2: NoKind has no 'kind'",
        ),
        (
            [(Email("a@example.com"), InsertOpts(), "extra")],
            r"insert_many item 0: a tuple must be \(args, InsertOpts or None\)",
        ),
    ],
    ids=["bare-mapping", "mapping-pair", "params-without-kind", "class-without-kind", "triple"],
)
async def test_insert_many_refuses_a_bad_item_by_its_index_and_stores_nothing(
    client: QueueClient, items: list[object], message: str
) -> None:
    with pytest.raises(JobError, match=message):
        await client.insert_many(items)
    async with client.db.queue.acquire() as conn:
        with pytest.raises(JobError, match=message):
            await client.insert_many_tx(conn, items)
    assert await _rows(client) == []


def test_the_single_insert_is_the_bulk_insert_over_scalars() -> None:
    """``job_insert_one`` differs from ``job_insert_many`` only in how it reads its input, so
    a single insert keeps every rule of the bulk one (uniqueness, the NOTIFY)."""
    one, many = QUERIES["job_insert_one"], QUERIES["job_insert_many"]
    rest = "inserted AS ("
    assert one[one.index(rest) :] == many[many.index(rest) :]
    assert "$1::text[]" in many and "$1::text AS kind" in one


async def test_single_and_bulk_inserts_store_the_same_rows(client: QueueClient) -> None:
    """One job through the single statement and one through the bulk one (its own chunk of
    two with a duplicate): the same columns, and the same unique answer."""
    opts = InsertOpts(
        queue="forms",
        priority=3,
        max_attempts=7,
        tags=["tag-a", "tag-b"],
        metadata={"m": 1},
        unique=UniqueOpts(by_args=True),
    )
    single = await client.insert({"n": 1}, opts, kind="form")
    again = await client.insert({"n": 1}, opts, kind="form")
    twice = InsertManyParams({"n": 2}, opts, kind="form")
    bulk = await client.insert_many([twice, twice])
    assert not single.skipped and again.skipped and again.job.id == single.job.id
    assert [r.skipped for r in bulk] == [False, True]

    def shape(job: Job) -> tuple[object, ...]:
        return (
            job.kind,
            job.queue,
            job.priority,
            job.max_attempts,
            job.state,
            job.tags,
            job.metadata,
            job.unique_key is not None,
        )

    assert shape(single.job) == shape(bulk[0].job)
    assert single.job.args == {"n": 1} and bulk[0].job.args == {"n": 2}
