"""The demo catalogue ``python -m engine run`` installs on an empty database, and the simulated
upstream it runs them on, so a first ``submit`` has something to run."""

from __future__ import annotations

import logging

from engine.providers.simulated import Latency, SimulationConfig
from engine.service.engine import Engine

__all__ = ["DEMO_MODELS", "DEMO_SIMULATION", "install_demo_catalogue"]

log = logging.getLogger(__name__)

#: The simulated upstream of the command line's service: a few hundred ms per task, three
#: polls, 5 % upstream failures.
DEMO_SIMULATION = SimulationConfig(
    prepare=Latency("uniform", 0.02, 0.1),
    submit=Latency("uniform", 0.02, 0.08),
    poll=Latency("fixed", 0.01),
    finalize=Latency("uniform", 0.02, 0.1),
    polls=3,
    poll_interval=0.2,
    failure_rate=0.05,
)

#: Installed on an empty catalogue: model name → concurrency limit (None: unlimited).
DEMO_MODELS: dict[str, int | None] = {"demo-image": 16, "demo-video": 8, "demo-chat": None}

_MODEL_COUNT = "SELECT count(*) FROM engine_model"


async def install_demo_catalogue(engine: Engine) -> bool:
    """Add the demo models if the catalogue is empty; True if it did."""
    if await engine.db.coordination.fetchval(_MODEL_COUNT):
        return False
    for name, limit in DEMO_MODELS.items():
        await engine.set_model(
            name, concurrency_limit=limit, provider="simulated", settings={"demo": True}
        )
    log.info(
        "installed the demo catalogue",
        extra={"event": "demo_catalogue", "models": list(DEMO_MODELS)},
    )
    return True
