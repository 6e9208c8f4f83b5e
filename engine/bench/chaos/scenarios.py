"""The scenarios ``python -m engine bench chaos`` runs (:data:`CHAOS_SCENARIOS`), and running
them: one on fresh databases (:func:`run_chaos_scenario`), or all of them at both settings
(:func:`run_chaos_bench`); see :mod:`engine.bench.chaos` for the method.
"""

from __future__ import annotations

import shutil
import tempfile
from contextlib import AsyncExitStack
from pathlib import Path

import attrs
import trio

from engine.bench.chaos.faults import (
    backend_kill,
    lock_timeout,
    lock_timeout_outcome,
    postgres_restart,
    sigkill_worker,
)
from engine.bench.chaos.harness import (
    arrivals,
    bench_databases,
    default_requests,
    phase,
    private_server,
    spawn_worker,
    stop_workers,
    wait_allocated,
    wait_final,
)
from engine.bench.chaos.pgbouncer import (
    PGBOUNCER_TARGETS,
    evaluate_pgbouncer,
    pgbouncer_surroundings,
    restart_pgbouncer,
)
from engine.bench.chaos.report import common_figures, scenario_targets
from engine.bench.chaos.run import (
    PRODUCTION_PREFIX,
    ChaosRun,
    ChaosScenario,
    ChaosSize,
    FaultReport,
    production_settings,
    utc_now,
)
from engine.bench.chaos.scope_limits import (
    evaluate_scopes,
    prepare_scopes,
    scope_requests,
    watch_scopes,
)
from engine.bench.chaos.upstream import (
    IDEMPOTENT_MODEL,
    ONCE_MODEL,
    SUBMIT_LATENCY,
    evaluate_upstream,
    kill_mid_submission,
    prepare_upstream,
    upstream_requests,
    upstream_surroundings,
)
from engine.config import load_config
from engine.embedded import EmbeddedServer

__all__ = ["CHAOS_SCENARIOS", "TARGETS", "run_chaos_bench", "run_chaos_scenario"]

_FAULT_AT = 0.35  # the fault comes when this fraction of the arrivals has been submitted


#: The scenarios ``bench chaos`` runs, in order. ``scope_limits`` joins them with the scope
#: admissions and rate limits (engine/admission): see :class:`ChaosScenario`.
CHAOS_SCENARIOS: list[ChaosScenario] = [
    ChaosScenario("sigkill_worker", sigkill_worker),
    ChaosScenario("postgres_restart", postgres_restart, private_server=True),
    ChaosScenario("backend_kill", backend_kill),
    ChaosScenario(
        "lock_timeout",
        lock_timeout,
        # Claims give up after 0.2 s on a locked row; the batch made due by the scheduler.
        settings={"database.lock_timeout": "0.2", "queue.scheduler_interval": "0.25"},
        evaluate=lock_timeout_outcome,
        targets={
            "tasks_failed": ("<=", 0.0),
            "locked_not_succeeded": ("<=", 0.0),
            "blocked_claims": (">=", 1.0),
        },
    ),
    ChaosScenario(
        "scope_limits",
        None,  # no fault: the limits under contention are the test
        prepare=prepare_scopes,
        make_requests=scope_requests,
        watch=watch_scopes,
        evaluate=evaluate_scopes,
        # Arrivals at twice the ~20 tasks/s the limits allow, so every scope backs up.
        quick_size=ChaosSize(tasks=200, rate=40.0, final_wait=60.0),
        full_size=ChaosSize(tasks=1000, rate=40.0, final_wait=120.0),
        targets={
            "tasks_failed": ("<=", 0.0),
            "limit_exceeded_samples": ("<=", 0.0),
            "limit_exceeded_events": ("<=", 0.0),
            "rate_exceeded_windows": ("<=", 0.0),
        },
    ),
    # Real upstreams (engine/bench/chaos/upstream.py): a kill while the upstream holds the
    # submissions, with and without an idempotency key.
    *(
        ChaosScenario(
            name,
            kill_mid_submission,
            surroundings=upstream_surroundings,
            prepare=prepare_upstream,
            make_requests=upstream_requests(model),
            evaluate=evaluate_upstream,
            quick_size=ChaosSize(tasks=120, rate=20.0, final_wait=45.0),
            full_size=ChaosSize(tasks=400, rate=25.0, final_wait=90.0),
            targets={
                "in_flight_at_kill": (">=", 1.0),
                "accepted_twice": ("<=", 0.0),
                # Work flows again once a resumed task completes, which takes one upstream
                # answer (SUBMIT_LATENCY) after its claim.
                "recovery_seconds": ("<=", 5.0 + SUBMIT_LATENCY),
                **extra,
            },
        )
        for name, model, extra in (
            ("upstream_idempotent", IDEMPOTENT_MODEL, {"manual_review": ("<=", 0.0)}),
            ("upstream_once", ONCE_MODEL, {"manual_review_beyond_in_flight": ("<=", 0.0)}),
        )
    ),
    # Through PgBouncer in transaction pooling mode (engine/bench/chaos/pgbouncer.py).
    *(
        ChaosScenario(
            name,
            inject,
            surroundings=pgbouncer_surroundings,
            evaluate=evaluate_pgbouncer,
            targets=PGBOUNCER_TARGETS,
        )
        for name, inject in (
            ("pgbouncer_sigkill", sigkill_worker),
            ("pgbouncer_restart", restart_pgbouncer),
        )
    ),
]

_BY_NAME = {s.name: s for s in CHAOS_SCENARIOS}


def _all_targets() -> dict[str, tuple[str, float]]:
    return {
        f"{prefix}{s.name}_{key}": target
        for prefix, production in (("", False), (PRODUCTION_PREFIX, True))
        for s in CHAOS_SCENARIOS
        for key, target in scenario_targets(s, production=production).items()
    }


#: Every scenario's targets, by prefixed figure name (what ``bench chaos`` checks).
TARGETS: dict[str, tuple[str, float]] = _all_targets()


async def run_chaos_scenario(
    admin_url: str,
    scenario: ChaosScenario | str,
    *,
    quick: bool = False,
    log_dir: Path | None = None,
    production: bool = False,
) -> dict[str, float]:
    """Run one scenario on fresh databases of ``admin_url``'s server; its figures, unprefixed.
    ``production``: with the configuration's default intervals (60 s leases, stale after 45 s)
    instead of the short ones of :data:`~engine.bench.chaos.run.WORKER_SETTINGS`.

    ``log_dir`` keeps the workers' logs (``<scenario>-worker-<n>.log``); by default they go to
    a temporary directory that is removed afterwards.
    """
    if isinstance(scenario, str):
        scenario = _BY_NAME[scenario]
    size = scenario.quick_size if quick else scenario.full_size
    if production:
        # The defaults under the scenario's own settings; the last tasks may wait out a whole
        # lease or stale window, so the wait for them grows by both.
        defaults = load_config(env={})
        scenario = attrs.evolve(scenario, settings={**production_settings(), **scenario.settings})
        size = attrs.evolve(
            size,
            final_wait=size.final_wait + defaults.tasks.lease_ttl + defaults.recovery.stale_after,
        )
    async with AsyncExitStack() as stack:
        if log_dir is None:
            tmp = Path(tempfile.mkdtemp(prefix="engine-chaos-logs-"))
            stack.callback(shutil.rmtree, tmp, ignore_errors=True)
            log_dir = tmp
        log_dir.mkdir(parents=True, exist_ok=True)
        server: EmbeddedServer | None = None
        server_admin = admin_url
        if scenario.private_server:
            server = await stack.enter_async_context(private_server())
            server_admin = server.dsn("postgres")
        dbs = await stack.enter_async_context(bench_databases(server_admin, admin_url))
        run = ChaosRun(
            scenario=scenario,
            quick=quick,
            url=dbs.url,
            server_admin_url=server_admin,
            ledger_url=dbs.ledger_url,
            monitor=dbs.monitor,
            client=dbs.client,
            log_dir=log_dir,
            server=server,
        )
        if scenario.surroundings is not None:
            await stack.enter_async_context(scenario.surroundings(run))
        stack.push_async_callback(stop_workers, run)
        async with trio.open_nursery() as nursery:
            for index in range(scenario.workers):
                nursery.start_soon(spawn_worker, run, index)
        await wait_allocated(run)
        phase(scenario, "workers ready")
        if scenario.prepare is not None:
            await scenario.prepare(run)
        make = scenario.make_requests or default_requests
        requests = make(size.tasks)
        fault_delay = _FAULT_AT * len(requests) / size.rate
        fault: FaultReport | None = None
        async with trio.open_nursery() as watching:
            if scenario.watch is not None:
                await watching.start(scenario.watch, run)
            async with trio.open_nursery() as nursery:
                nursery.start_soon(arrivals, run, requests, size.rate)
                if scenario.inject is not None:
                    await trio.sleep(fault_delay)
                    fault = await scenario.inject(run)
                    phase(scenario, "fault injected")
            await wait_final(run, trio.current_time() + size.final_wait)
            watching.cancel_scope.cancel()
        measured_until = utc_now()
        phase(scenario, "tasks final")
        figures = await common_figures(run, fault, measured_until)
        if scenario.evaluate is not None:
            figures.update(await scenario.evaluate(run))
    phase(scenario, "cleaned up")
    return figures


async def run_chaos_bench(
    admin_url: str, *, quick: bool = False, log_dir: Path | None = None
) -> dict[str, float]:
    """Run every scenario of :data:`CHAOS_SCENARIOS` on ``admin_url``'s server twice: at the
    short intervals, then at the production defaults; their figures, each prefixed with the
    scenario's name (and :data:`PRODUCTION_PREFIX` for the second pass)."""
    results: dict[str, float] = {}
    for prefix, production in (("", False), (PRODUCTION_PREFIX, True)):
        for scenario in CHAOS_SCENARIOS:
            figures = await run_chaos_scenario(
                admin_url, scenario, quick=quick, log_dir=log_dir, production=production
            )
            results.update({f"{prefix}{scenario.name}_{k}": v for k, v in figures.items()})
    return results
