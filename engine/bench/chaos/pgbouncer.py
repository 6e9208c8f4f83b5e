"""The chaos scenarios through PgBouncer in transaction pooling mode (``database.pooler``).

The bench runs a private PgBouncer (:mod:`engine.testing.pgbouncer`, ``pool_mode =
transaction``, :data:`SERVER_CONNECTIONS` server connections for the engine database, fewer than
the workers' client connections) in front of the run's server, and the workers reach the engine
database only through it (``run.worker_url``); the bench's own client and monitor stay direct.
The workers' configuration file sets ``database.pooler = "transaction"`` and a
``database.lock_timeout`` of 5 s, so every statement runs in a transaction that sets it with
``SET LOCAL``.

* ``pgbouncer_sigkill``: SIGKILL the worker running the most tasks, as ``sigkill_worker``; the
  workers LISTEN on a direct ``database.listen_url``.
* ``pgbouncer_restart``: stop PgBouncer (SIGTERM: every client and server connection cut at
  once) and start it again on the same port; the workers have no ``database.listen_url`` and
  work on the polling fallback, so the restart cuts every connection they have.
  ``outage_seconds`` is how long the restart took.

Targets: the common ones (nothing lost, nothing submitted twice, recovery within 5 s), and
``pooled_transactions`` (transactions PgBouncer passed on, from its statistics every second) at
least one per task, which shows the work went through it.
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Final

import trio

from engine.bench.chaos.run import ChaosRun, FaultReport
from engine.testing.pgbouncer import PgBouncer, open_pgbouncer

__all__ = [
    "PGBOUNCER_TARGETS",
    "SERVER_CONNECTIONS",
    "evaluate_pgbouncer",
    "pgbouncer_surroundings",
    "restart_pgbouncer",
]

#: PgBouncer's server connections for the engine database (``default_pool_size``, also its
#: cap): three workers hold up to ten client connections each.
SERVER_CONNECTIONS = 8
#: The scenarios' own targets (with the common ones), by figure name: at least one transaction
#: through PgBouncer per task of the quick size (150).
PGBOUNCER_TARGETS: Final = {"pooled_transactions": (">=", 150.0)}
#: The workers' ``database.lock_timeout``: long enough never to fire here, set per transaction.
_LOCK_TIMEOUT = 5.0


def _worker_config(run: ChaosRun) -> str:
    # json.dumps writes strings TOML reads as basic strings.
    lines = ["[database]", 'pooler = "transaction"', f"lock_timeout = {_LOCK_TIMEOUT:g}"]
    if run.scenario.name != "pgbouncer_restart":
        lines.append(f"listen_url = {json.dumps(run.url)}")
    return "\n".join(lines) + "\n"


@asynccontextmanager
async def pgbouncer_surroundings(run: ChaosRun) -> AsyncIterator[None]:
    """Run PgBouncer in front of the run's server; point the workers at it."""
    async with open_pgbouncer(
        run.server_admin_url, default_pool_size=SERVER_CONNECTIONS, stats_period=1
    ) as bouncer:
        run.notes["pgbouncer"] = bouncer
        run.worker_url = bouncer.url_for(run.url)
        with tempfile.TemporaryDirectory(prefix="engine-chaos-pgbouncer-") as tmp:
            path = Path(tmp) / "pgbouncer.toml"
            path.write_text(_worker_config(run))
            run.config_file = path
            yield


async def restart_pgbouncer(run: ChaosRun) -> FaultReport:
    """Stop PgBouncer at once and start it again on the same port."""
    bouncer: PgBouncer = run.notes["pgbouncer"]
    at = datetime.now(UTC)
    start = trio.current_time()
    await bouncer.restart()
    return FaultReport(at, {"outage_seconds": round(trio.current_time() - start, 3)})


async def evaluate_pgbouncer(run: ChaosRun) -> dict[str, float]:
    """``pooled_transactions`` and ``server_connections`` (PgBouncer's pool size)."""
    bouncer: PgBouncer = run.notes["pgbouncer"]
    return {
        "pooled_transactions": float(bouncer.logged_transactions()),
        "server_connections": float(SERVER_CONNECTIONS),
    }
