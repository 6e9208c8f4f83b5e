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
"""

from engine.queue.client import QueueClient as QueueClient
from engine.queue.client import make_instance_id as make_instance_id
from engine.queue.client import open_queue as open_queue
from engine.queue.generation import Generation as Generation
from engine.queue.job import InsertOpts as InsertOpts
from engine.queue.job import InsertResult as InsertResult
from engine.queue.job import Job as Job
from engine.queue.job import JobCancel as JobCancel
from engine.queue.job import JobSnooze as JobSnooze
from engine.queue.slots import SlotPool as SlotPool
from engine.queue.states import JobState as JobState
from engine.queue.unique import UniqueOpts as UniqueOpts
from engine.queue.workers import Workers as Workers
