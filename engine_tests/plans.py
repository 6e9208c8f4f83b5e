"""EXPLAIN a named query the way the engine runs it: as a prepared statement, under a generic
or a custom plan (``plan_cache_mode``), and find what its plan scans.

asyncpg prepares every statement, and PostgreSQL switches a prepared statement to a generic
plan after five runs, so a hot query must stay index-bound under both. ``EXECUTE`` takes no
bind parameters: arguments go in as literals (:func:`literal`).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator, Sequence
from typing import Any

from engine.db.bridge import Connection

__all__ = ["PLAN_MODES", "explain_prepared", "literal", "scans"]

PLAN_MODES = ("force_generic_plan", "force_custom_plan")


def literal(value: object) -> str:
    """``value`` as an SQL literal whose type PostgreSQL infers from the statement's casts."""
    if value is None:
        return "NULL"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str | uuid.UUID):
        return "'" + str(value).replace("'", "''") + "'"
    if isinstance(value, list | tuple):
        items = []
        for item in value:
            if item is None:
                items.append("NULL")
            elif isinstance(item, bool):
                items.append("true" if item else "false")
            else:
                text = str(item).replace("\\", "\\\\").replace('"', '\\"')
                items.append(f'"{text}"')
        return "'{" + ",".join(items) + "}'"
    raise TypeError(f"no literal for {type(value).__name__}")


async def explain_prepared(
    conn: Connection, query: str, args: Sequence[object], mode: str
) -> dict[str, Any]:
    """The plan of ``query`` prepared and executed with ``args`` under ``mode``, inside a
    transaction that is rolled back (EXPLAIN without ANALYZE changes nothing anyway)."""
    name = f"plan_{uuid.uuid4().hex[:8]}"
    await conn.execute(f"PREPARE {name} AS {query}")
    try:
        await conn.execute(f"SET plan_cache_mode = {mode}")
        rendered = ", ".join(literal(a) for a in args)
        rows = await conn.fetch(f"EXPLAIN (FORMAT JSON) EXECUTE {name}({rendered})")
        plan: dict[str, Any] = (
            json.loads(rows[0][0])[0]["Plan"]
            if isinstance(rows[0][0], str)
            else rows[0][0][0]["Plan"]
        )
        return plan
    finally:
        await conn.execute("RESET plan_cache_mode")
        await conn.execute(f"DEALLOCATE {name}")


def scans(plan: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Every node of ``plan`` that reads a relation (scans, index scans), depth first."""
    if "Relation Name" in plan or plan.get("Node Type", "").endswith("Index Scan"):
        yield plan
    for child in plan.get("Plans", ()):
        yield from scans(child)
