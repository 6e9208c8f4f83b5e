"""``python -m engine bench river_indexes``: what each of River's optional indexes costs.

engine's schema leaves out three indexes of River's (``queue.river_indexes`` builds them):
``river_job_args_index`` and ``river_job_metadata_index`` (GIN) and ``river_job_kind``. Every
claim and every completion changes ``state``, an indexed column, so each is a non-HOT update that
writes every index of the row again. This scenario runs the queue bench's no-op burn-down (20,000
jobs at ``max_workers`` 32) without them, with each alone and with all three, four times each in
turn, and reports the best run of each and its cost against none:

* ``<variant>_jobs_per_s``: jobs drained per second;
* ``<variant>_cost_pct``: how much slower than without the indexes, in percent;
* ``<variant>_wal_bytes_per_job``: WAL written per job during the drain (the least of the
  runs): the extra index writes themselves, which vary far less than the throughput.
"""

from __future__ import annotations

import math

from engine.bench.common import BenchDatabase
from engine.bench.queue import burn_down
from engine.db.migrate import RIVER_INDEXES
from engine.db.sqlfiles import QUERIES

__all__ = ["TARGETS", "run_river_indexes_bench"]

#: No targets: these are costs to read, not goals.
TARGETS: dict[str, tuple[str, float]] = {}

#: Rounds of every variant in turn; each figure is the best of them (runs vary by ±10 %).
_ROUNDS = 4

_VARIANTS: dict[str, tuple[str, ...]] = {
    "none": (),
    **{word: (word,) for word in RIVER_INDEXES.values()},
    "all_three": tuple(RIVER_INDEXES.values()),
}


async def run_river_indexes_bench(admin_url: str, *, quick: bool = False) -> dict[str, float]:
    """Burn down with each variant of the indexes; the best of ``_ROUNDS`` runs of each."""
    jobs = 2_000 if quick else 20_000
    best: dict[str, float] = {}
    wal: dict[str, float] = {}
    for _ in range(_ROUNDS):
        for variant, words in _VARIANTS.items():
            async with BenchDatabase(admin_url) as db:
                for word in words:
                    await db.queue.execute(QUERIES[f"job_index_create_{word}"])
                drained = await burn_down(db, jobs, 32)
            best[variant] = max(best.get(variant, 0.0), drained.jobs_per_s)
            wal[variant] = min(wal.get(variant, math.inf), drained.wal_bytes_per_job)
    results: dict[str, float] = {}
    for variant, rate in best.items():
        results[f"{variant}_jobs_per_s"] = round(rate, 1)
        results[f"{variant}_wal_bytes_per_job"] = round(wal[variant])
        if variant != "none":
            results[f"{variant}_cost_pct"] = round(100 * (1 - rate / best["none"]), 1)
    return results
