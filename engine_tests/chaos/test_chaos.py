"""The crash scenarios of ``python -m engine bench chaos`` (quick sizes), each against its targets.

Every scenario starts real worker processes on a fresh database, injects its fault under load
and waits for the outcome with deadlines (see :mod:`engine.bench.chaos` for the method).
"""

from __future__ import annotations

import pytest

from engine.bench.chaos import CHAOS_SCENARIOS, ChaosScenario, run_chaos_scenario, scenario_targets
from engine.bench.common import check_targets

#: Failed tasks are a wrong outcome (the simulated upstream never fails) but not a target of
#: these scenarios yet: a database error inside a run is recorded as a task failure by
#: TaskRunner.work (decision #11, engine/tasks/runner.py) instead of requeueing the task.
_FAILS_ON_DATABASE_ERRORS = {"postgres_restart", "backend_kill"}


@pytest.mark.chaos
@pytest.mark.slow
@pytest.mark.parametrize("scenario", CHAOS_SCENARIOS, ids=[s.name for s in CHAOS_SCENARIOS])
async def test_scenario_meets_its_targets(
    pg_admin_url: str, aio_loop: None, scenario: ChaosScenario
) -> None:
    figures = await run_chaos_scenario(pg_admin_url, scenario, quick=True)
    targets = scenario_targets(scenario)
    assert set(targets) <= set(figures), f"figures without a value: {set(targets) - set(figures)}"
    missed = {k: figures[k] for k, met in check_targets(figures, targets).items() if not met}
    assert not missed, f"{scenario.name} missed {missed}; all figures: {figures}"
    if figures["tasks_failed"]:
        if scenario.name in _FAILS_ON_DATABASE_ERRORS:
            pytest.xfail(
                f"targets met, but {figures['tasks_failed']:g} task(s) failed on a database "
                "error inside their run (TaskRunner.work records any exception as a failure)"
            )
        raise AssertionError(f"{scenario.name}: tasks failed; all figures: {figures}")
