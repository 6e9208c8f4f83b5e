"""engine: a durable task engine for trio applications, on PostgreSQL.

The public face for embedding apps::

    import engine

    config = engine.load_config()
    async with engine.open(config, providers={"my-model": MyProvider()}) as eng:
        task_id = await eng.submit(engine.TaskRequest(model="my-model", payload={...},
                                                      identity=engine.Identity(...)))
        task = await eng.wait(task_id)

``engine.open`` runs the whole service inside your trio program (``await
nursery.start(engine.serve, config, providers=...)`` does the same in a nursery of yours), and
``python -m engine run`` runs the very same tree as a process. ``engine.testing`` gives an
embedding app's tests a real database and a running engine.
"""

from typing import TYPE_CHECKING, Any

from engine._version import __version__ as __version__
from engine.lazy import LazyExports

if TYPE_CHECKING:
    from engine.config import EngineConfig as EngineConfig
    from engine.config import load_config as load_config
    from engine.db.bridge import Connection as Connection
    from engine.domain.tasks import Identity as Identity
    from engine.domain.tasks import RunMode as RunMode
    from engine.domain.tasks import Task as Task
    from engine.domain.tasks import TaskRequest as TaskRequest
    from engine.domain.tasks import TaskStatus as TaskStatus
    from engine.errors import AppError as AppError
    from engine.errors import EngineError as EngineError
    from engine.errors import InvalidProvider as InvalidProvider
    from engine.errors import InvalidTask as InvalidTask
    from engine.errors import TaskNotFound as TaskNotFound
    from engine.providers.base import AmbiguousSubmission as AmbiguousSubmission
    from engine.providers.base import NotSubmitted as NotSubmitted
    from engine.providers.base import PollResult as PollResult
    from engine.providers.base import Provider as Provider
    from engine.providers.base import ProviderError as ProviderError
    from engine.providers.base import UpstreamBusy as UpstreamBusy
    from engine.providers.context import TaskContext as TaskContext
    from engine.providers.context import current_task_context as current_task_context
    from engine.providers.simulated import SimulatedProvider as SimulatedProvider
    from engine.providers.simulated import SimulationConfig as SimulationConfig
    from engine.schedules.model import CatchUp as CatchUp
    from engine.schedules.model import Schedule as Schedule
    from engine.schedules.model import ScheduledJob as ScheduledJob
    from engine.schedules.model import ScheduledTask as ScheduledTask
    from engine.service.engine import Engine as Engine
    from engine.service.root import open as open
    from engine.service.root import serve as serve

#: Where each public name lives. The names load on first use (PEP 562), so ``import engine``
#: and ``python -m engine --help`` stay fast: the command line imports trio, asyncpg and the rest
#: only when a command needs them.
_LAZY: dict[str, str] = {
    "EngineConfig": "engine.config",
    "load_config": "engine.config",
    "Connection": "engine.db.bridge",
    "Identity": "engine.domain.tasks",
    "RunMode": "engine.domain.tasks",
    "Task": "engine.domain.tasks",
    "TaskRequest": "engine.domain.tasks",
    "TaskStatus": "engine.domain.tasks",
    "AppError": "engine.errors",
    "EngineError": "engine.errors",
    "InvalidProvider": "engine.errors",
    "InvalidTask": "engine.errors",
    "TaskNotFound": "engine.errors",
    "AmbiguousSubmission": "engine.providers.base",
    "NotSubmitted": "engine.providers.base",
    "PollResult": "engine.providers.base",
    "Provider": "engine.providers.base",
    "ProviderError": "engine.providers.base",
    "UpstreamBusy": "engine.providers.base",
    "TaskContext": "engine.providers.context",
    "current_task_context": "engine.providers.context",
    "SimulatedProvider": "engine.providers.simulated",
    "SimulationConfig": "engine.providers.simulated",
    "CatchUp": "engine.schedules.model",
    "Schedule": "engine.schedules.model",
    "ScheduledJob": "engine.schedules.model",
    "ScheduledTask": "engine.schedules.model",
    "Engine": "engine.service.engine",
    "open": "engine.service.root",
    "serve": "engine.service.root",
}

__all__ = [
    "AmbiguousSubmission",
    "AppError",
    "CatchUp",
    "Connection",
    "Engine",
    "EngineConfig",
    "EngineError",
    "Identity",
    "InvalidProvider",
    "InvalidTask",
    "NotSubmitted",
    "PollResult",
    "Provider",
    "ProviderError",
    "RunMode",
    "Schedule",
    "ScheduledJob",
    "ScheduledTask",
    "SimulatedProvider",
    "SimulationConfig",
    "Task",
    "TaskContext",
    "TaskNotFound",
    "TaskRequest",
    "TaskStatus",
    "UpstreamBusy",
    "__version__",
    "current_task_context",
    "load_config",
    "open",
    "serve",
]


_EXPORTS = LazyExports(__name__, _LAZY, globals())


def __getattr__(name: str) -> Any:
    """Load a public name on first use (``engine.Engine``, ``from engine import open``)."""
    return _EXPORTS.load(name)


def __dir__() -> list[str]:
    """The module's names, the lazy ones included."""
    return _EXPORTS.names(__all__)
