"""The single-write figures of ``bench tasks``: each write is timed, and each one stored."""

from __future__ import annotations

from engine.bench.common import BenchDatabase
from engine.bench.tasks import _single_writes


async def test_single_writes_time_every_write_and_store_each_one(
    pg_admin_url: str, aio_loop: None
) -> None:
    async with BenchDatabase(pg_admin_url) as db:
        times = await _single_writes(db.urls.tasks, 9, 3)
        counts = await db.tasks.fetchrow(
            "SELECT (SELECT count(*) FROM engine_task) AS tasks,"
            " (SELECT count(*) FROM river_job WHERE kind = 'bench_single') AS queued,"
            " (SELECT count(*) FROM bench_plain_insert) AS plain"
        )
    assert {name: len(ms) for name, ms in times.items()} == {"submit": 9, "plain": 9, "queue": 9}
    assert all(ms > 0 for values in times.values() for ms in values)
    # The warm-up rounds write too; none of the writes was skipped or lost.
    assert counts is not None and tuple(counts.values()) == (12, 12, 12)
