"""The figures every chaos scenario reports (``tasks_lost``, ``submitted_twice``,
``recovery_seconds`` or ``seconds``, ``manual_review``, ``tasks_failed``: see
:mod:`engine.bench.chaos`) and the targets they are held to.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from datetime import datetime

from engine.bench.chaos.run import (
    BENCH_APPLICATION,
    FINAL,
    ChaosRun,
    ChaosScenario,
    FaultReport,
    production_bound,
)
from engine.bench.chaos.worker import LEDGER_TABLE
from engine.db.bridge import connect

__all__ = ["common_figures", "scenario_targets", "status_counts", "submitted_twice"]

log = logging.getLogger("engine.bench.chaos")


async def _recovery_seconds(run: ChaosRun, fault: datetime, measured_until: datetime) -> float:
    """The ``recovery_seconds`` figure (see :mod:`engine.bench.chaos`)."""
    rows = await run.monitor.fetch(
        """
        WITH interrupted AS (
            SELECT t.id, t.finished_at
            FROM engine_task t
            WHERE t.created_at <= $1 AND (t.finished_at IS NULL OR t.finished_at > $1)
        ),
        moved AS (
            SELECT i.id,
                   least(
                       (SELECT min(e.at) FROM engine_task_event e
                        WHERE e.task_id = i.id AND e.type = 'task.started' AND e.at > $1),
                       i.finished_at
                   ) AS at
            FROM interrupted i
        )
        SELECT count(*) AS interrupted,
               count(*) FILTER (WHERE at IS NULL) AS never_moved,
               max(at) AS last_moved
        FROM moved
        """,
        fault,
    )
    interrupted, never_moved = rows[0]["interrupted"], rows[0]["never_moved"]
    last_moved: datetime | None = rows[0]["last_moved"]
    flow = await run.monitor.fetchval(
        """
        SELECT min(t.finished_at)
        FROM engine_task t
        WHERE t.status = 'succeeded' AND t.finished_at > $1
          AND (SELECT max(e.at) FROM engine_task_event e
               WHERE e.task_id = t.id AND e.type = 'task.started') > $1
        """,
        fault,
    )
    log.debug(
        "recovery measured",
        extra={
            "event": "chaos_recovery",
            "interrupted": interrupted,
            "never_moved": never_moved,
            "last_moved": last_moved,
            "flow": flow,
        },
    )
    if never_moved or flow is None:
        return round((measured_until - fault).total_seconds(), 3)
    end: datetime = max(flow, last_moved) if last_moved is not None else flow
    return round(max(0.0, (end - fault).total_seconds()), 3)


async def _completion_seconds(run: ChaosRun, measured_until: datetime) -> float:
    """The ``seconds`` figure: first submitted task created until the last one final (until
    ``measured_until`` if some never were)."""
    row = (
        await run.monitor.fetch(
            "SELECT min(created_at) AS first, max(finished_at) AS last,"
            " count(*) FILTER (WHERE finished_at IS NULL) AS open"
            " FROM engine_task WHERE id = ANY($1::uuid[])",
            run.submitted,
        )
    )[0]
    first: datetime | None = row["first"]
    if first is None:
        return 0.0
    end: datetime = measured_until if row["open"] or row["last"] is None else row["last"]
    return round((end - first).total_seconds(), 3)


async def submitted_twice(ledger_url: str) -> int:
    """Tasks with more than one row in the ledger at ``ledger_url``: seen twice upstream."""
    ledger = await connect(ledger_url, application_name=BENCH_APPLICATION)
    try:
        return int(
            await ledger.fetchval(
                f"SELECT count(*) FROM (SELECT task_id FROM {LEDGER_TABLE}"
                " GROUP BY task_id HAVING count(*) > 1) AS s"
            )
        )
    finally:
        await ledger.close()


async def status_counts(run: ChaosRun) -> dict[str, int]:
    """How many of the run's submitted tasks are in each status now."""
    return {
        r["status"]: int(r["n"])
        for r in await run.monitor.fetch(
            "SELECT status, count(*) AS n FROM engine_task WHERE id = ANY($1::uuid[])"
            " GROUP BY status",
            run.submitted,
        )
    }


async def common_figures(
    run: ChaosRun, fault: FaultReport | None, measured_until: datetime
) -> dict[str, float]:
    """The figures every scenario reports (``tasks``, ``tasks_lost``, ``submitted_twice``,
    ``recovery_seconds`` or ``seconds``, ``manual_review``, ``tasks_failed``), and the
    injector's own."""
    counts = await status_counts(run)
    final = sum(n for status, n in counts.items() if status in FINAL)
    twice = await submitted_twice(run.ledger_url)
    figures: dict[str, float] = {
        "tasks": float(len(run.submitted)),
        "tasks_lost": float(len(run.submitted) - final),
        "submitted_twice": float(twice),
    }
    if fault is None:
        figures["seconds"] = await _completion_seconds(run, measured_until)
    else:
        figures["recovery_seconds"] = await _recovery_seconds(run, fault.at, measured_until)
    figures["manual_review"] = float(counts.get("manual_review", 0))
    figures["tasks_failed"] = float(counts.get("failed", 0))
    if fault is not None:
        figures.update(fault.figures)
    return figures


#: Targets of every scenario, by the scenario's own figure names.
_COMMON_TARGETS: Mapping[str, tuple[str, float]] = {
    "tasks_lost": ("<=", 0.0),
    "submitted_twice": ("<=", 0.0),
    "recovery_seconds": ("<=", 5.0),
}


def scenario_targets(
    scenario: ChaosScenario, *, production: bool = False
) -> dict[str, tuple[str, float]]:
    """The scenario's targets, by its unprefixed figure names (no ``recovery_seconds`` without
    a fault). ``production``: recovery's bound is the production stale window plus a scan
    interval instead of the short intervals' 5 s (a scenario's own slack on top is kept)."""
    common = {
        k: v
        for k, v in _COMMON_TARGETS.items()
        if scenario.inject is not None or k != "recovery_seconds"
    }
    targets = {**common, **scenario.targets}
    if production and "recovery_seconds" in targets:
        op, bound = targets["recovery_seconds"]
        short = _COMMON_TARGETS["recovery_seconds"][1]
        targets["recovery_seconds"] = (op, bound - short + production_bound())
    return targets
