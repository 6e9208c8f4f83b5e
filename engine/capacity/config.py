"""The ``[worker]`` section: this process's role, its capacity and heartbeat, stop and retry timing.

The one home of these settings' defaults and documentation; the capacity refresher and the
service's start and stop read them.
"""

from typing import Literal

import attrs

from engine.queue.config import MAX_WORKERS
from engine.settings import choice, integer, number, setting

__all__ = ["WorkerConfig"]


@attrs.frozen
class WorkerConfig:
    """This process's role, capacity refresh (the heartbeat), and stop and retry timing."""

    mode: Literal["worker", "client"] = setting(
        "worker",
        "`worker` runs jobs. `client` runs none and leads no maintenance: it submits tasks "
        "(inserting their jobs), dispatches admissions, and in each recovery round only gives "
        "a job to every queued task without a live one.",
        choice("worker", "client"),
    )
    refresh_interval: float = setting(
        5.0,
        "Seconds between capacity refreshes; each refresh re-registers the instance, which is "
        "its heartbeat. Times `worker.heartbeat_stale_factor` (30 s by default) it is about how "
        "long a crashed instance keeps its share before the others take it.",
        number(gt=0),
    )
    heartbeat_stale_factor: int = setting(
        6,
        "An instance whose last heartbeat is older than this many refresh intervals gets no "
        "share of the capacity; 6 lets an instance miss five heartbeats in a row (a slow "
        "database, a long pause) before the others take its share.",
        integer(2),
    )
    hard_limit: int = setting(
        100,
        "Cap on the cluster-wide worker capacity; 0 means no cap. At most 2,147,483,647 (the "
        "registry's integer columns); each instance still runs at most 100,000 at once (one "
        "generation's most; a fixed capacity is this cap, or `instance_hard_limit`, up to "
        "100,000).",
        integer(0, 2_147_483_647),
    )
    instance_hard_limit: int = setting(
        0,
        "Cap on the capacity of this instance; 0 means no cap beyond the 100,000 jobs one "
        "generation runs at most. River's Go client stops at 10,000 (a goroutine per job); "
        "here a task waiting upstream is a trio task of about 10 KB that costs no CPU between "
        "its polls, so one process holds 50,000 of them (measured: docs/benchmarks.md).",
        integer(0, MAX_WORKERS),
    )
    drain_timeout: float = setting(
        3600.0,
        "Seconds a worker generation replaced by a resize may spend finishing its running jobs "
        "before they are cancelled.",
        number(gt=0),
    )
    stop_timeout: float = setting(
        10.0,
        "Seconds each worker generation gets to stop once its jobs are cancelled, at shutdown "
        "and cleanup: every running task is requeued (in statements of 250) and its job made "
        "available again. That takes time in proportion to the tasks running: measured, 2.6 s "
        "for 10,000 tasks waiting upstream and 16 s for 50,000 (a third of it the garbage "
        "collector's full passes over the process's objects), so an instance sized for more "
        "than about 25,000 at once needs more than the default; past it the generations are "
        "cancelled outright (logged at error level) while the requeues already under way "
        "finish.",
        number(gt=0),
    )
    mark_draining_timeout: float = setting(
        5.0,
        "Seconds allowed at shutdown for marking this instance draining, which hands its share "
        "to the others at once; past it shutdown goes on, and the others take the share once "
        "its heartbeat is stale.",
        number(gt=0),
    )
    enqueue_rollback_timeout: float = setting(
        5.0,
        "Seconds a failed enqueue (recovery re-enqueue, admission, `tasks retry`: their "
        "transaction's rollback; a submit: its one statement's cancellation) gets to end, "
        "shielded from the cancellation that may have caused the failure; past it the "
        "connection is dropped, which also ends the transaction.",
        number(gt=0),
    )
    capacity: Literal["registry", "fixed"] = setting(
        "registry",
        "Where this instance's worker capacity comes from. `registry`: the global capacity "
        "(from the model and group limits, capped by `worker.hard_limit`) is split between "
        "every live instance by heartbeat, and a resize starts a new generation and drains "
        "the old one. `fixed`: one generation of `worker.instance_hard_limit` executions "
        "(else `worker.hard_limit`), no registry; for an app that runs alone.",
        choice("registry", "fixed"),
    )
    shutdown_drain_timeout: float = setting(
        10.0,
        "Seconds running tasks get to finish at shutdown (the first SIGINT or SIGTERM, or "
        "leaving an `engine.open` block) before they are requeued; no new task is claimed "
        "meanwhile. A requeued task that was already submitted upstream keeps its upstream "
        "reference and resumes polling on another instance. 0 requeues at once.",
        number(ge=0),
    )
    startup_attempts: int = setting(
        3,
        "Attempts of the whole service start (connecting, migrations, registration, the first "
        "recovery round, the first generation) before the process exits with the last error.",
        integer(1),
    )
    startup_retry_delay: float = setting(
        2.0,
        "Seconds between two attempts of the service start.",
        number(ge=0),
    )
    lock_timeout_requeue_delay: float = setting(
        1.0,
        "When a run hits a PostgreSQL lock timeout before the upstream submission, the task is "
        "requeued this many seconds later and its job snoozed as long.",
        number(ge=0),
    )
