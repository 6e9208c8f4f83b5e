"""The durable queue: River's job semantics on trio, batched end to end.

Jobs live in River's tables (``river_job`` and friends, ``docs/queue.md``). Inserts are one
statement for any number of jobs, unique inserts keep River's keys and partial index, producers
claim many jobs per statement, and a batch completer records many outcomes per statement.
Job states (see docs/queue.md)::

    insert ─► available ─(claim: attempt+1)─► running ─┬─ return ───► completed
       │          ▲                                     ├─ JobSnooze(d) ─► available/scheduled
       ├─► scheduled ─(scheduler)─┘                     │                  (attempt−1)
       └─► pending                                      ├─ error ─► available/retryable (+error)
                                                        ├─ error, no attempts left ─► discarded
                                                        ├─ JobCancel / cancel() ─► cancelled
                                                        └─ hard stop ─► available (attempt back)

Invariants: a job row leaves ``running`` only through a guarded write (``state = 'running'``);
a claimed job is always either worked or left running for orphan recovery, never dropped.

Used on its own (docs/queue.md, "The queue on its own")::

    async with engine.queue.open(config, workers=workers) as queue:
        await queue.insert(SendEmail(to="ada@example.com"))
        await queue.wait_drained()

:func:`open` opens the database of the app's settings (an
:class:`~engine.config.EngineConfig`, or any :class:`QueueSettings`: ``database.url`` or the
embedded server), migrates it, and runs the client's services and one generation;
:func:`open_queue` does the same on pools the caller owns (:func:`engine.db.open_database`).
"""

from engine.errors import JobError as JobError
from engine.queue.client import QueueClient as QueueClient
from engine.queue.client import QueueSettings as QueueSettings
from engine.queue.client import make_instance_id as make_instance_id
from engine.queue.client import open as open
from engine.queue.client import open_queue as open_queue
from engine.queue.generation import Generation as Generation
from engine.queue.job import InsertManyParams as InsertManyParams
from engine.queue.job import InsertOpts as InsertOpts
from engine.queue.job import InsertResult as InsertResult
from engine.queue.job import Job as Job
from engine.queue.job import JobArgs as JobArgs
from engine.queue.job import JobCancel as JobCancel
from engine.queue.job import JobSnooze as JobSnooze
from engine.queue.slots import SlotPool as SlotPool
from engine.queue.states import JobState as JobState
from engine.queue.unique import UniqueOpts as UniqueOpts
from engine.queue.workers import Worker as Worker
from engine.queue.workers import Workers as Workers

__all__ = [
    "Generation",
    "InsertManyParams",
    "InsertOpts",
    "InsertResult",
    "Job",
    "JobArgs",
    "JobCancel",
    "JobError",
    "JobSnooze",
    "JobState",
    "QueueClient",
    "QueueSettings",
    "SlotPool",
    "UniqueOpts",
    "Worker",
    "Workers",
    "make_instance_id",
    "open",
    "open_queue",
]
