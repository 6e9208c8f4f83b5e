"""``bench queue``'s figures: repeated runs, and the figures with targets drawn from them."""

from __future__ import annotations

import statistics

from engine.bench.queue import run_queue_bench


async def test_the_ratio_compares_the_means_of_two_burn_downs_and_two_baselines(
    pg_admin_url: str, aio_loop: None
) -> None:
    figures = await run_queue_bench(pg_admin_url, quick=True)
    drains = [figures["burn_down_jobs_per_s_1"], figures["burn_down_jobs_per_s_2"]]
    bases = [figures["baseline_jobs_per_s_1"], figures["baseline_jobs_per_s_2"]]
    assert all(rate > 0 for rate in drains + bases)
    assert abs(figures["burn_down_jobs_per_s"] - statistics.fmean(drains)) <= 0.1
    assert abs(figures["baseline_jobs_per_s"] - statistics.fmean(bases)) <= 0.1
    assert (
        abs(figures["ratio_to_baseline"] - statistics.fmean(drains) / statistics.fmean(bases))
        <= 0.001
    )
    # 200 jobs of 50 ms at 100 workers: two rounds at the least, and the median of three runs.
    assert 0.1 <= figures["sleepy_seconds"] <= figures["sleepy_seconds_max"]
    assert figures["latency_p50_ms"] <= figures["latency_p99_ms"]
