"""The ``[worker]`` section: this process's role, its capacity and heartbeat, stop and retry timing.

The one home of these settings' defaults and documentation; the capacity refresher and the
service's start and stop read them.
"""

from typing import Literal

import attrs

from engine.settings import choice, integer, number, setting

__all__ = ["WorkerConfig"]


@attrs.frozen
class WorkerConfig:
    """This process's role, capacity refresh (the heartbeat), and stop and retry timing."""

    mode: Literal["worker", "client"] = setting(
        "worker",
        "`worker` runs jobs. `client` runs none and leads no maintenance: it submits tasks "
        "(inserting their jobs), dispatches admissions, and in each recovery round only gives "
        "a job to every queued task without a live one (the reference's "
        "`StartAsyncQueueWorker` and `StartAsyncQueueClient`).",
        choice("worker", "client"),
    )
    refresh_interval: float = setting(
        5.0,
        "Seconds between capacity refreshes; each refresh re-registers the instance, which is "
        "its heartbeat (the reference's `AsyncWorkerRefreshIntervalSeconds`, whose default was "
        "not seen; 5 s is proposed).",
        number(gt=0),
    )
    heartbeat_stale_factor: int = setting(
        6,
        "An instance whose last heartbeat is older than this many refresh intervals gets no "
        "share of the capacity (reference: 6).",
        integer(2),
    )
    hard_limit: int = setting(
        100,
        "Cap on the cluster-wide worker capacity; 0 means no cap (the reference's "
        "`AsyncWorkerHardLimit`). At most 2,147,483,647 (the registry's integer columns); "
        "each instance still runs at most 10,000 at once. Proposed default.",
        integer(0, 2_147_483_647),
    )
    instance_hard_limit: int = setting(
        0,
        "Cap on the capacity of this instance; 0 means no cap beyond the 10,000 jobs one "
        "generation runs at most (the reference's `AsyncWorkerInstanceHardLimit`).",
        integer(0, 10_000),
    )
    drain_timeout: float = setting(
        3600.0,
        "Seconds a worker generation replaced by a resize may spend finishing its running jobs "
        "before they are cancelled (reference: 1 h).",
        number(gt=0),
    )
    stop_timeout: float = setting(
        10.0,
        "Seconds each worker generation gets to stop once its jobs are cancelled, at shutdown "
        "and cleanup (reference: 10 s).",
        number(gt=0),
    )
    mark_draining_timeout: float = setting(
        5.0,
        "Timeout in seconds for marking this instance draining at shutdown (reference: 5 s).",
        number(gt=0),
    )
    enqueue_rollback_timeout: float = setting(
        5.0,
        "Seconds a failed enqueue transaction (submit, recovery re-enqueue, admission, "
        "`tasks retry`) gets to roll back, shielded from the cancellation that may have caused "
        "the failure; past it the connection is dropped, which also ends the transaction "
        "(reference: 5 s on a fresh context).",
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
        "meanwhile. A requeued task that was already submitted upstream keeps its reference "
        "and resumes polling on another instance. 0 requeues at once.",
        number(ge=0),
    )
    startup_attempts: int = setting(
        3,
        "Attempts of the whole service start (connecting, migrations, registration, the first "
        "recovery round, the first generation) before the process exits with the last error "
        "(reference: 3).",
        integer(1),
    )
    startup_retry_delay: float = setting(
        2.0,
        "Seconds between two attempts of the service start (reference: 2 s).",
        number(ge=0),
    )
    lock_timeout_requeue_delay: float = setting(
        1.0,
        "When a run hits a PostgreSQL lock timeout before the upstream submission, the task is "
        "requeued this many seconds later and its job snoozed as long (reference: 1 s).",
        number(ge=0),
    )
