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

from engine._version import __version__ as __version__
from engine.config import EngineConfig as EngineConfig
from engine.config import load_config as load_config
from engine.db.bridge import Connection as Connection
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
from engine.providers.simulated import SimulatedProvider as SimulatedProvider
from engine.providers.simulated import SimulationConfig as SimulationConfig
from engine.schedules.model import CatchUp as CatchUp
from engine.schedules.model import Schedule as Schedule
from engine.schedules.model import ScheduledJob as ScheduledJob
from engine.schedules.model import ScheduledTask as ScheduledTask
from engine.service.engine import Engine as Engine
from engine.service.root import open as open
from engine.service.root import serve as serve
from engine.tasks.models import Identity as Identity
from engine.tasks.models import RunMode as RunMode
from engine.tasks.models import Task as Task
from engine.tasks.models import TaskRequest as TaskRequest
from engine.tasks.models import TaskStatus as TaskStatus

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
    "TaskNotFound",
    "TaskRequest",
    "TaskStatus",
    "UpstreamBusy",
    "__version__",
    "load_config",
    "open",
    "serve",
]
