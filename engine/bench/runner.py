"""Run benchmark scenarios by name and report them (``python -m engine bench``)."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import attrs
import trio

from engine.bench.common import check_targets, format_table
from engine.config import EngineConfig
from engine.db.bridge import asyncio_loop, connect
from engine.db.dsn import redact
from engine.db.resolve import open_urls

__all__ = ["SCENARIOS", "Scenario", "run_benchmarks"]


@attrs.frozen
class Scenario:
    """A named benchmark: ``run(admin_url, quick=...)`` returns its figures (``tasks=N`` too,
    when ``takes_tasks``)."""

    name: str
    run: Callable[..., Awaitable[dict[str, float]]]
    targets: dict[str, tuple[str, float]]
    takes_tasks: bool = False
    takes_minutes: bool = False
    #: Run by ``bench all`` (a soak runs only when named: it lasts an hour by default).
    in_all: bool = True


def _scenarios() -> dict[str, Scenario]:
    from engine.bench.chaos.scenarios import TARGETS as CHAOS_TARGETS
    from engine.bench.chaos.scenarios import run_chaos_bench
    from engine.bench.http import TARGETS as HTTP_TARGETS
    from engine.bench.http import run_http_bench
    from engine.bench.inflight import TARGETS as INFLIGHT_TARGETS
    from engine.bench.inflight import run_inflight_bench
    from engine.bench.load import TARGETS as LOAD_TARGETS
    from engine.bench.load import run_load_bench
    from engine.bench.queue import TARGETS as QUEUE_TARGETS
    from engine.bench.queue import run_queue_bench
    from engine.bench.resize import TARGETS as RESIZE_TARGETS
    from engine.bench.resize import run_resize_bench
    from engine.bench.river_indexes import TARGETS as RIVER_INDEX_TARGETS
    from engine.bench.river_indexes import run_river_indexes_bench
    from engine.bench.soak import TARGETS as SOAK_TARGETS
    from engine.bench.soak import run_soak_bench
    from engine.bench.tasks import TARGETS as TASK_TARGETS
    from engine.bench.tasks import run_tasks_bench

    found = [
        Scenario("queue", run_queue_bench, QUEUE_TARGETS),
        Scenario("tasks", run_tasks_bench, TASK_TARGETS),
        Scenario("chaos", run_chaos_bench, CHAOS_TARGETS),
        Scenario("resize", run_resize_bench, RESIZE_TARGETS),
        Scenario("load", run_load_bench, LOAD_TARGETS),
        Scenario("river_indexes", run_river_indexes_bench, RIVER_INDEX_TARGETS),
        Scenario("http", run_http_bench, HTTP_TARGETS, takes_tasks=True),
        Scenario("inflight", run_inflight_bench, INFLIGHT_TARGETS, takes_tasks=True),
        Scenario("soak", run_soak_bench, SOAK_TARGETS, takes_minutes=True, in_all=False),
    ]
    return {s.name: s for s in found}


SCENARIOS = _scenarios()


def markdown(results: dict[str, dict[str, float]], server: str = "") -> str:
    """One markdown table of every scenario's figures, with targets and whether they held,
    under the server they ran on."""
    lines = [f"PostgreSQL {server}", ""] if server else []
    lines += ["| scenario | figure | value | target | met |", "|---|---|---|---|---|"]
    for name, figures in results.items():
        targets = SCENARIOS[name].targets
        met = check_targets(figures, targets)
        for key, value in figures.items():
            target = " ".join(map(str, targets[key])) if key in targets else ""
            ok = ("yes" if met[key] else "**no**") if key in met else ""
            lines.append(f"| {name} | {key} | {value} | {target} | {ok} |")
    return "\n".join(lines) + "\n"


def run_benchmarks(
    config: EngineConfig,
    names: list[str],
    *,
    json_path: Path | None = None,
    markdown_path: Path | None = None,
    quick: bool = False,
    tasks: int | None = None,
    minutes: float | None = None,
) -> dict[str, dict[str, float]]:
    """Run ``names`` (or every scenario for ``all``) on the configured server; print tables,
    write JSON (one scenario: its figures; several: keyed by scenario) and markdown.
    ``tasks`` sizes the scenarios that take a task count (``http``), ``minutes`` those that
    run for a while (``soak``)."""
    chosen = [n for n, s in SCENARIOS.items() if s.in_all] if names == ["all"] else names
    results: dict[str, dict[str, float]] = {}
    server = ""

    async def main() -> None:
        nonlocal server
        async with asyncio_loop(), open_urls(config.database, config.data_dir) as urls:
            server = await _server_version(urls.tasks)
            print(f"PostgreSQL {server} ({redact(urls.tasks)})", flush=True)
            for name in chosen:
                scenario = SCENARIOS[name]
                sized: dict[str, float] = {}
                if tasks is not None and scenario.takes_tasks:
                    sized["tasks"] = tasks
                if minutes is not None and scenario.takes_minutes:
                    sized["minutes"] = minutes
                figures = await scenario.run(urls.tasks, quick=quick, **sized)
                results[name] = figures
                print(format_table(f"bench {name}", figures, SCENARIOS[name].targets), flush=True)

    trio.run(main)
    if json_path is not None:
        payload: Any = results[chosen[0]] if len(chosen) == 1 else results
        payload = {**payload, "postgresql": server}
        json_path.write_text(json.dumps(payload, indent=2, sort_keys=True) + "\n")
    if markdown_path is not None:
        markdown_path.write_text(markdown(results, server))
    return results


async def _server_version(url: str) -> str:
    """``SHOW server_version`` of the server at ``url`` (``15.18 (Debian 15.18-0+deb12u1)``)."""
    conn = await connect(url)
    try:
        return str(await conn.fetchval("SHOW server_version"))
    finally:
        await conn.close()
