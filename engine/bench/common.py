"""What every benchmark shares: a throw-away database, percentiles, the result table."""

from __future__ import annotations

import json
from contextlib import AsyncExitStack
from pathlib import Path
from types import TracebackType
from typing import Any

from engine.db.database import Database, DatabaseUrls, open_database
from engine.db.resolve import scratch_database

__all__ = ["BenchDatabase", "check_targets", "format_table", "percentile", "write_json"]


def percentile(values: list[float], pct: float) -> float:
    """The ``pct``-th percentile by nearest rank (no interpolation, as latency tools report)."""
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    rank = max(1, round(pct / 100 * len(ordered) + 0.5 - 1e-9))
    return ordered[min(rank, len(ordered)) - 1]


class BenchDatabase:
    """A fresh migrated database on the server at ``admin_url``, dropped on exit."""

    def __init__(self, admin_url: str, *, max_size: int = 20) -> None:
        self.admin_url = admin_url
        self.max_size = max_size
        self.url = ""
        self._stack = AsyncExitStack()

    async def __aenter__(self) -> Database:
        async with AsyncExitStack() as stack:
            self.url = await stack.enter_async_context(
                scratch_database(self.admin_url, "engine_bench_")
            )
            db: Database = await stack.enter_async_context(
                open_database(DatabaseUrls.single(self.url), max_size=self.max_size)
            )
            self._stack = stack.pop_all()
        return db

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self._stack.__aexit__(exc_type, exc, tb)


def check_targets(
    results: dict[str, float], targets: dict[str, tuple[str, float]]
) -> dict[str, bool]:
    """``{figure: met}`` for each target present in ``results``."""
    met = {}
    for key, (op, bound) in targets.items():
        if key in results:
            met[key] = results[key] >= bound if op == ">=" else results[key] <= bound
    return met


def format_table(
    title: str, results: dict[str, float], targets: dict[str, tuple[str, float]]
) -> str:
    """A plain-text table: figure, value, target, met."""
    met = check_targets(results, targets)
    lines = [title, f"{'figure':<26} {'value':>12}  target"]
    for key, value in results.items():
        target = ""
        if key in targets:
            op, bound = targets[key]
            target = f"{op} {bound}  {'ok' if met[key] else 'MISSED'}"
        lines.append(f"{key:<26} {value:>12}  {target}")
    return "\n".join(lines)


def write_json(path: Path, results: dict[str, Any]) -> None:
    """Write ``results`` as pretty JSON."""
    path.write_text(json.dumps(results, indent=2, sort_keys=True) + "\n")
