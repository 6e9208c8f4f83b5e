"""Batcher: concurrent callers share one statement; a rolled-back batch runs again."""

from __future__ import annotations

import pytest
import trio

from engine.db.batcher import Batcher
from engine.errors import DatabaseError, TransactionConflict


async def test_concurrent_callers_share_one_batch_in_order() -> None:
    seen: list[list[int]] = []

    async def double(items: list[int]) -> list[int]:
        seen.append(list(items))
        return [i * 2 for i in items]

    batcher: Batcher[int, int] = Batcher(double)
    results: dict[int, int] = {}

    async def call(i: int) -> None:
        results[i] = await batcher.submit(i)

    async with trio.open_nursery() as nursery:
        for i in range(50):
            nursery.start_soon(call, i)
    assert results == {i: i * 2 for i in range(50)}
    assert len(seen) == 1 and sorted(seen[0]) == list(range(50))


async def test_a_batch_rolled_back_by_a_deadlock_runs_again() -> None:
    calls = 0

    async def flaky(items: list[int]) -> list[int]:
        nonlocal calls
        calls += 1
        if calls <= 2:
            raise TransactionConflict("deadlock detected")
        return items

    batcher: Batcher[int, int] = Batcher(flaky)
    assert await batcher.submit(7) == 7
    assert calls == 3


async def test_conflicts_that_persist_reach_every_caller() -> None:
    async def always(items: list[int]) -> list[int]:
        raise TransactionConflict("deadlock detected")

    batcher: Batcher[int, int] = Batcher(always, conflict_retries=2)
    with pytest.raises(TransactionConflict):
        await batcher.submit(1)


async def test_other_errors_are_not_retried() -> None:
    calls = 0

    async def broken(items: list[int]) -> list[int]:
        nonlocal calls
        calls += 1
        raise DatabaseError("syntax error")

    batcher: Batcher[int, int] = Batcher(broken)
    with pytest.raises(DatabaseError, match="syntax"):
        await batcher.submit(1)
    assert calls == 1
