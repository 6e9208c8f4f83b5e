"""A worker process for the chaos scenarios: the full service and a simulated upstream whose every
submission is written to a ledger before the upstream accepts it.

::

    python -m engine.bench.chaos.worker --url URL --ledger-url URL [--set k=v ...] [--sim JSON]

* ``--url``: the engine database (tasks, coordination and queue on one database);
* ``--ledger-url``: the database holding the ledger table :data:`LEDGER_TABLE`; keep it away from
  the faults a scenario injects (another database, better another server), and its connections
  are named ``chaos-ledger`` so that killing every ``engine%`` connection spares them;
* ``--set section.field=value``: configuration overrides, as ``python -m engine --set``
  (the environment is ignored, so a run does not depend on the caller's ``ENGINE_*``);
* ``--sim``: a :class:`~engine.providers.simulated.SimulationConfig` as JSON, latencies as
  ``{"kind": "uniform", "a": 0.1, "b": 0.2}``;
* ``--config``: a TOML configuration file, read under the ``--set`` overrides (the HTTP
  scenarios describe their ``[[http_models]]`` there).

It runs :func:`engine.service.root.serve` and prints ``ready <instance_id>`` on stdout once
the service has started. SIGTERM or SIGINT stop it gracefully; SIGKILL is what the scenarios use.

The ledger is the upstream's own record: a row is committed *before* the simulated upstream
accepts the request, so a process killed at any point can never hide a submission from it
(a kill between the row and the acceptance counts a submission the upstream never saw: the
count errs on the side of reporting a double submission, never of hiding one).
"""

from __future__ import annotations

import argparse
import functools
import json
import logging
import signal
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import trio

from engine.config import load_config
from engine.db.bridge import Pool, asyncio_loop, create_pool
from engine.db.database import DatabaseUrls
from engine.domain.tasks import Task
from engine.errors import DatabaseError
from engine.logs import configure_logging
from engine.providers.base import ProviderError
from engine.providers.simulated import Latency, SimulatedProvider, SimulationConfig
from engine.service.engine import Engine
from engine.service.root import serve

__all__ = [
    "LEDGER_APPLICATION",
    "LEDGER_DDL",
    "LEDGER_TABLE",
    "LedgerProvider",
    "main",
    "simulation_from_json",
    "simulation_to_json",
]

log = logging.getLogger(__name__)

#: The ledger of upstream submissions: one row per submission the upstream may have seen.
LEDGER_TABLE = "bench_submission"
LEDGER_DDL = (
    f"CREATE TABLE IF NOT EXISTS {LEDGER_TABLE} ("
    "task_id uuid NOT NULL, instance_id text NOT NULL, at timestamptz NOT NULL DEFAULT now())"
)
#: The ledger's connections are named so; it does not match ``engine%``.
LEDGER_APPLICATION = "chaos-ledger"

_LEDGER_INSERT = f"INSERT INTO {LEDGER_TABLE} (task_id, instance_id) VALUES ($1, $2)"
#: How long a submission keeps trying to reach the ledger before the upstream refuses it.
_LEDGER_DEADLINE = 20.0


def simulation_to_json(config: SimulationConfig) -> str:
    """``config`` as the JSON ``--sim`` takes."""
    data: dict[str, Any] = {}
    for name in SimulationConfig.__attrs_attrs__:
        value = getattr(config, name.name)
        if isinstance(value, Latency):
            value = {"kind": value.kind, "a": value.a, "b": value.b}
        data[name.name] = value
    return json.dumps(data, sort_keys=True)


def simulation_from_json(text: str) -> SimulationConfig:
    """The :class:`SimulationConfig` written by :func:`simulation_to_json`."""
    data = json.loads(text)
    if not isinstance(data, dict):
        raise ValueError("--sim must be a JSON object")
    fields: dict[str, Any] = {}
    for key, value in data.items():
        fields[key] = Latency(**value) if isinstance(value, dict) else value
    return SimulationConfig(**fields)


class LedgerProvider(SimulatedProvider):
    """The simulated upstream; each submission is first committed to the ledger.

    Call :meth:`open` before use and :meth:`close` after.
    """

    def __init__(self, config: SimulationConfig, ledger_url: str) -> None:
        super().__init__(config)
        self.ledger_url = ledger_url
        self.instance_id = ""
        self._pool: Pool | None = None

    async def open(self) -> None:
        """Connect to the ledger."""
        self._pool = await create_pool(
            self.ledger_url, min_size=1, max_size=4, application_name=LEDGER_APPLICATION
        )

    async def close(self) -> None:
        """Disconnect from the ledger."""
        if self._pool is not None:
            await self._pool.close()
            self._pool = None

    async def _record(self, task: Task) -> None:
        assert self._pool is not None, "LedgerProvider.open() was not called"
        delay = 0.05
        with trio.move_on_after(_LEDGER_DEADLINE):
            while True:
                try:
                    await self._pool.execute(_LEDGER_INSERT, task.id, self.instance_id)
                    return
                except DatabaseError as exc:
                    log.warning(
                        "ledger write failed; retrying",
                        extra={"event": "ledger_retry", "error": str(exc)},
                    )
                await trio.sleep(delay)
                delay = min(1.0, delay * 2)
        # Nothing reached the upstream: refusing is the truthful answer.
        raise ProviderError("the upstream's ledger is unreachable", code="ledger_unavailable")

    async def submit(self, task: Task, prepared: Any) -> str:
        """Commit the ledger row, then let the simulated upstream accept the request."""
        await self._record(task)
        return await super().submit(task, prepared)


def _overrides(pairs: Sequence[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep:
            raise SystemExit(f"chaos_worker: --set takes key=value, got {pair!r}")
        out[key.strip()] = value
    return out


async def _serve(
    url: str, provider: LedgerProvider, overrides: dict[str, str], config_file: Path | None
) -> None:
    config = load_config(env={}, toml_path=config_file, overrides=overrides)
    async with asyncio_loop():
        await provider.open()
        try:
            async with trio.open_nursery() as nursery:
                eng: Engine = await nursery.start(
                    functools.partial(
                        serve, config, urls=DatabaseUrls.single(url), simulated=provider
                    )
                )
                provider.instance_id = eng.instance_id
                print(f"ready {eng.instance_id}", flush=True)
                with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
                    async for _ in signals:
                        nursery.cancel_scope.cancel(reason="signal")
                        break
        finally:
            with trio.CancelScope(shield=True):
                await provider.close()


def main(argv: Sequence[str] | None = None) -> int:
    """Parse the command line and run the worker until a signal stops it."""
    parser = argparse.ArgumentParser(prog="python -m engine.bench.chaos.worker")
    parser.add_argument("--url", required=True, help="the engine database")
    parser.add_argument("--ledger-url", required=True, help="the database of the ledger table")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--sim", default="{}", help="SimulationConfig as JSON")
    parser.add_argument("--config", type=Path, help="a TOML configuration file (http_models)")
    parser.add_argument("--log-level", default="WARNING")
    args = parser.parse_args(argv)
    configure_logging("kv", args.log_level)
    provider = LedgerProvider(simulation_from_json(args.sim), args.ledger_url)
    trio.run(_serve, args.url, provider, _overrides(args.set), args.config)
    return 0


if __name__ == "__main__":
    sys.exit(main())
