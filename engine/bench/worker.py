"""A real engine process for multi-process scenarios: ``python -m engine.bench.worker``.

::

    python -m engine.bench.worker --url URL [--set section.field=value ...] [--sim JSON]
                                  [--record] [--log-level LEVEL]

Runs the full service (:func:`engine.service.root.serve`: capacity refresher, generations,
recovery, load sampler) against the database at ``URL``, with a
:class:`~engine.providers.simulated.SimulatedProvider` built from ``--sim`` (a JSON
:class:`~engine.providers.simulated.SimulationConfig`; a latency is ``{"kind": "uniform", "a":
0.1, "b": 0.3}`` or a bare number for a fixed one), until SIGTERM or SIGINT. The first signal
is a graceful shutdown (the instance is marked draining, running tasks are requeued); a second
one exits at once. Once the service is up it prints ``ready <instance_id>`` on stdout.

The configuration is the defaults plus the ``--set`` overrides only (the environment is not
read, so a scenario is reproducible), with metrics and the demo catalogue off unless set.

``--record`` makes the process write what the scenario checks into two tables the scenario
created beforehand (:data:`BENCH_TABLES_SQL`):

* ``bench_submission(task_id, instance_id, at)``: one row per call of the provider's ``submit``,
  written *before* the simulated upstream is reached, so every attempt to reach the upstream
  is on record (a task with two rows was submitted twice);
* ``bench_claim_limit(instance_id, at, claim_limit)``: the claim limit this process applies (its
  :class:`~engine.queue.slots.SlotPool` total), each time it changes (polled every 5 ms), so a
  scenario can tell when a new share is *in force*, not only decided in the registry.

Scenarios start workers with :func:`spawn_worker` (which waits for the ``ready`` line and sends
the worker's stderr to a log file), stop them with :func:`stop_workers` (SIGTERM, then SIGKILL
after a timeout) and, in a ``finally``, :func:`kill_processes`, so none outlives its scenario.
"""

from __future__ import annotations

import argparse
import functools
import json
import logging
import os
import signal
import subprocess
import sys
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final

import attrs
import cattrs
import trio

from engine.config import EngineConfig, load_config
from engine.db.bridge import Pool, asyncio_loop, create_pool
from engine.db.database import DatabaseUrls
from engine.domain.tasks import Task
from engine.errors import DatabaseError
from engine.logs import configure_logging
from engine.providers.base import PollResult, Provider
from engine.providers.simulated import Latency, SimulatedProvider, SimulationConfig
from engine.queue.client import make_instance_id
from engine.service.engine import Engine
from engine.service.root import serve as serve_engine

__all__ = [
    "BENCH_TABLES_SQL",
    "DEFAULT_OVERRIDES",
    "RecordingProvider",
    "WorkerProcess",
    "kill_processes",
    "main",
    "parse_simulation",
    "simulation_json",
    "spawn_worker",
    "stop_workers",
]

log = logging.getLogger(__name__)

#: Exit status after a second signal (as ``python -m engine run``).
_EXIT_INTERRUPTED: Final = 130

#: Settings a bench worker runs with unless ``--set`` says otherwise.
DEFAULT_OVERRIDES: Final[dict[str, str]] = {
    "metrics.enabled": "false",
    "tasks.demo_catalogue": "false",
}

#: The tables ``--record`` writes to; the scenario runs this once before starting workers.
BENCH_TABLES_SQL: Final = """
CREATE TABLE IF NOT EXISTS bench_submission (
    task_id uuid NOT NULL,
    instance_id text NOT NULL,
    at timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE TABLE IF NOT EXISTS bench_claim_limit (
    instance_id text NOT NULL,
    at timestamptz NOT NULL,
    claim_limit double precision NOT NULL
);
"""

_CLAIM_POLL: Final = 0.005

_converter = cattrs.Converter(forbid_extra_keys=True)


def _structure_latency(value: Any, _type: Any) -> Latency:
    if isinstance(value, int | float) and not isinstance(value, bool):
        return Latency("fixed", float(value))
    if not isinstance(value, dict):
        raise ValueError(f"a latency is a number or an object, got {value!r}")
    kind = value.get("kind", "fixed")
    if kind not in ("fixed", "uniform", "lognormal"):
        raise ValueError(f"unknown latency kind {kind!r}")
    extra = set(value) - {"kind", "a", "b"}
    if extra:
        raise ValueError(f"unknown latency keys {sorted(extra)}")
    return Latency(kind, float(value.get("a", 0.0)), float(value.get("b", 0.0)))


_converter.register_structure_hook(Latency, _structure_latency)


def parse_simulation(text: str) -> SimulationConfig:
    """A :class:`SimulationConfig` from JSON (``"{}"`` is the zero-latency default).

    Raises:
        ValueError: not JSON, an unknown key or a bad value.
    """
    data = json.loads(text) if text.strip() else {}
    if not isinstance(data, dict):
        raise ValueError("--sim must be a JSON object")
    try:
        return _converter.structure(data, SimulationConfig)
    except Exception as exc:  # cattrs raises its own exception groups
        raise ValueError(f"bad --sim {text!r}: {exc}") from exc


def simulation_json(config: SimulationConfig) -> str:
    """The ``--sim`` argument that rebuilds ``config`` (the inverse of :func:`parse_simulation`)."""
    return json.dumps(_converter.unstructure(config), sort_keys=True)


class RecordingProvider:
    """Wraps a provider and records every ``submit`` in ``bench_submission`` before it."""

    def __init__(self, inner: Provider, pool: Pool, instance_id: str) -> None:
        self.inner = inner
        self.pool = pool
        self.instance_id = instance_id
        self.poll_interval = inner.poll_interval

    async def prepare(self, task: Task) -> Any:
        """Delegate."""
        return await self.inner.prepare(task)

    async def submit(self, task: Task, prepared: Any) -> str:
        """Record the attempt durably, then submit."""
        await self.pool.execute(
            "INSERT INTO bench_submission (task_id, instance_id) VALUES ($1, $2)",
            task.id,
            self.instance_id,
        )
        return await self.inner.submit(task, prepared)

    async def poll(self, task: Task, upstream_ref: str) -> PollResult:
        """Delegate."""
        return await self.inner.poll(task, upstream_ref)

    async def finalize(self, task: Task, result: Any) -> Any:
        """Delegate."""
        return await self.inner.finalize(task, result)

    async def cancel(self, task: Task, upstream_ref: str) -> None:
        """Delegate."""
        await self.inner.cancel(task, upstream_ref)


async def _record_claim_limits(engine: Engine, pool: Pool) -> None:
    """Write the applied claim limit each time it changes (see the module docstring)."""
    last: float | None = None
    while True:
        total = engine.queue.slots.total
        if total != last:
            at = datetime.now(UTC)
            try:
                await pool.execute(
                    "INSERT INTO bench_claim_limit (instance_id, at, claim_limit)"
                    " VALUES ($1, $2, $3)",
                    engine.instance_id,
                    at,
                    float(total),
                )
            except DatabaseError as exc:  # an instrument must not take the service down
                log.warning(
                    "claim limit not recorded",
                    extra={"event": "bench_record_failed", "error": str(exc)},
                )
                await trio.sleep(0.5)
            else:
                last = total
        await trio.sleep(_CLAIM_POLL)


async def serve(
    config: EngineConfig,
    url: str,
    simulation: SimulationConfig,
    *,
    record: bool = False,
) -> None:
    """Run the service until cancelled; print ``ready <instance_id>`` once it is up."""
    async with asyncio_loop():
        pool: Pool | None = None
        if record:
            pool = await create_pool(url, min_size=1, max_size=4, application_name="bench-worker")
        try:
            simulated: Provider = SimulatedProvider(simulation)
            if pool is not None:
                assert config.instance_name is not None
                simulated = RecordingProvider(simulated, pool, config.instance_name)
            async with trio.open_nursery() as nursery:
                engine: Engine = await nursery.start(
                    functools.partial(
                        serve_engine, config, urls=DatabaseUrls.single(url), simulated=simulated
                    )
                )
                if pool is not None:
                    nursery.start_soon(_record_claim_limits, engine, pool)
                print(f"ready {engine.instance_id}", flush=True)
        finally:
            if pool is not None:
                with trio.CancelScope(shield=True):
                    await pool.close()


async def _until_signal(
    config: EngineConfig, url: str, sim: SimulationConfig, record: bool
) -> None:
    """Serve until SIGTERM/SIGINT (graceful); a second signal exits at once."""
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async with trio.open_nursery() as nursery:
            work = trio.CancelScope()

            async def watch() -> None:
                received = False
                async for signum in signals:
                    if received:
                        os._exit(_EXIT_INTERRUPTED)
                    received = True
                    log.info(
                        "bench worker stopping",
                        extra={
                            "event": "shutdown_requested",
                            "signal": signal.Signals(signum).name,
                        },
                    )
                    work.cancel(reason="signal")

            nursery.start_soon(watch)
            with work:
                await serve(config, url, sim, record=record)
            nursery.cancel_scope.cancel(reason="stopped")


def _setting(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise argparse.ArgumentTypeError(f"expected section.field=value, got {text!r}")
    return key.strip(), value


def build_config(settings: Sequence[tuple[str, str]], *, record: bool) -> EngineConfig:
    """The worker's configuration: :data:`DEFAULT_OVERRIDES`, then ``settings``; with
    ``record`` an instance name is chosen here (the submission records carry it)."""
    overrides: dict[str, str] = {**DEFAULT_OVERRIDES, **dict(settings)}
    if record and not overrides.get("instance_name"):
        overrides["instance_name"] = make_instance_id()
    return load_config(env={}, overrides=overrides)


def main(argv: Sequence[str] | None = None) -> int:
    """Parse ``argv`` and serve; returns the exit status."""
    parser = argparse.ArgumentParser(
        prog="python -m engine.bench.worker",
        description="Run one engine service process with a simulated upstream.",
    )
    parser.add_argument("--url", required=True, help="the (migrated) database URL")
    parser.add_argument(
        "--set",
        dest="settings",
        action="append",
        default=[],
        type=_setting,
        metavar="SECTION.FIELD=VALUE",
        help="a configuration override (repeatable)",
    )
    parser.add_argument("--sim", default="{}", help="the simulated upstream, as JSON")
    parser.add_argument(
        "--record", action="store_true", help="write bench_submission and bench_claim_limit"
    )
    parser.add_argument("--log-level", default="WARNING", help="log level (stderr)")
    args = parser.parse_args(argv)
    configure_logging("kv", args.log_level)
    try:
        simulation = parse_simulation(args.sim)
        config = build_config(args.settings, record=args.record)
    except Exception as exc:
        print(f"engine.bench.worker: error: {exc}", file=sys.stderr)
        return 2
    trio.run(_until_signal, config, args.url, simulation, args.record)
    return 0


# ---- for scenarios: start worker processes and always stop them -------------------------------


@attrs.define
class WorkerProcess:
    """A started bench worker: its process, its registry id and where its stderr goes."""

    process: trio.Process
    instance_id: str
    log_path: Path

    @property
    def alive(self) -> bool:
        """True until the process has exited."""
        return self.process.returncode is None

    def log_tail(self, lines: int = 20) -> str:
        """The end of the worker's log, for error messages."""
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


def worker_command(
    url: str,
    settings: Mapping[str, str],
    simulation: SimulationConfig,
    *,
    record: bool = False,
    log_level: str = "WARNING",
) -> list[str]:
    """The command line that starts one bench worker."""
    command = [sys.executable, "-m", "engine.bench.worker", "--url", url]
    for key, value in settings.items():
        command += ["--set", f"{key}={value}"]
    command += ["--sim", simulation_json(simulation), "--log-level", log_level]
    if record:
        command.append("--record")
    return command


async def _read_ready(stream: trio.abc.ReceiveStream) -> str | None:
    """Read stdout lines until ``ready <id>``; return the id, or None at end of stream."""
    buffer = b""
    while True:
        while b"\n" in buffer:
            line, buffer = buffer.split(b"\n", 1)
            text = line.decode(errors="replace").strip()
            if text.startswith("ready "):
                return text.removeprefix("ready ").strip()
        chunk = await stream.receive_some()
        if not chunk:
            return None
        buffer += chunk


async def spawn_worker(
    url: str,
    settings: Mapping[str, str],
    simulation: SimulationConfig,
    *,
    log_path: Path,
    record: bool = False,
    ready_timeout: float = 30.0,
    log_level: str = "WARNING",
) -> WorkerProcess:
    """Start a bench worker and wait for its ``ready`` line.

    Raises:
        RuntimeError: it exited, or was not ready within ``ready_timeout`` (it is killed).
    """
    command = worker_command(url, settings, simulation, record=record, log_level=log_level)
    with log_path.open("ab") as log_file:
        process = await trio.lowlevel.open_process(
            command, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=log_file
        )
    handle = WorkerProcess(process, "", log_path)
    instance_id: str | None = None
    try:
        assert process.stdout is not None
        with trio.move_on_after(ready_timeout):
            instance_id = await _read_ready(process.stdout)
    finally:
        if instance_id is None:
            await kill_processes([process])
    if instance_id is None:
        raise RuntimeError(
            f"bench worker did not start (exit status {process.returncode}):\n" + handle.log_tail()
        )
    handle.instance_id = instance_id
    return handle


async def kill_processes(processes: Sequence[trio.Process], timeout: float = 10.0) -> None:
    """SIGKILL every process still running and reap it (shielded, bounded)."""
    with trio.move_on_after(timeout, shield=True):
        for process in processes:
            if process.returncode is None:
                try:
                    process.kill()
                except ProcessLookupError:
                    pass
            await process.wait()
            if process.stdout is not None:
                await process.stdout.aclose()


async def stop_workers(workers: Sequence[WorkerProcess], timeout: float = 15.0) -> list[int]:
    """SIGTERM every live worker (a graceful shutdown), wait up to ``timeout`` for them, then
    SIGKILL the rest. Returns the exit statuses (negative: killed by that signal)."""
    for worker in workers:
        if worker.alive:
            try:
                worker.process.send_signal(signal.SIGTERM)
            except ProcessLookupError:
                pass
    with trio.move_on_after(timeout, shield=True):
        for worker in workers:
            await worker.process.wait()
    await kill_processes([w.process for w in workers])
    return [w.process.returncode if w.process.returncode is not None else -9 for w in workers]


if __name__ == "__main__":
    raise SystemExit(main())
