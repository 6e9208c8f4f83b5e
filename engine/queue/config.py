"""The ``[queue]`` section: the job queue's fetching, completion, maintenance and insert options.

The one home of these settings' defaults and documentation. The queue's own parts take their
values from this section when they are built (``GenerationConfig.from_section``,
``CompleterConfig.from_section``, …), never from defaults of their own.
"""

import re
from typing import Any, ClassVar, Final

import attrs

from engine.settings import (
    Requirement,
    Rule,
    boolean,
    enforce_section_rules,
    integer,
    not_above_rule,
    number,
    setting,
    text,
)

__all__ = ["MAX_WORKERS", "QueueConfig"]

#: The most jobs one generation runs at once, per queue. River caps a Go client at 10,000
#: (``MaxWorkers``: each job is a goroutine); here a running job is a trio task, and one that
#: waits upstream costs about 10 KB and no CPU between its polls, so one process holds 50,000
#: waiting tasks (docs/benchmarks.md, the inflight scenario). The bound stays: past it, a claim,
#: a lease renewal and a shutdown's requeue grow past what one process does in bounded time.
MAX_WORKERS: Final = 100_000

# River's tag rule for job tags; Go's \w is ASCII and \z is Python's \Z.
_TAG_RE: Final = re.compile(r"\A[\w][\w\-]+[\w]\Z", re.ASCII)


def _tags() -> Any:
    return Requirement(
        "must be a list of tags, each 3 to 255 characters of letters, digits, "
        "'_' and '-', not starting or ending with '-'",
        lambda v: (
            isinstance(v, tuple)
            and all(isinstance(t, str) and len(t) <= 255 and _TAG_RE.match(t) for t in v)
        ),
    )


@attrs.frozen
class QueueConfig:
    """The job queue, with River's semantics: fetching, completion, maintenance, insert options."""

    name: str = setting(
        "gateway_tasks",
        "Queue the engine inserts task jobs into and works. 1 to 127 "
        "characters, the limit of the `river_job.queue` column.",
        text(1, 127),
    )
    job_kind: str = setting(
        "gateway_task_run",
        "Job kind of task jobs. 1 to 127 characters, the limit of the `river_job.kind` column.",
        text(1, 127),
    )
    fetch_cooldown: float = setting(
        0.005,
        "Least time, in seconds, between two fetches of one of a producer's fetch loops after "
        "a fetch that found the queue drained (fewer jobs than it could take): a burst of insert "
        "notifications then costs one fetch. After a full fetch the next one does not wait, "
        "and a fetch that found some jobs is followed by one more a cooldown later. Inserts are "
        "never held back: every insert of an available job notifies. Deliberately 5 ms rather "
        "than River's 100 ms `FetchCooldown`, after Oban's `dispatch_cooldown`, because the "
        "100 ms debounce dominates pickup latency.",
        number(ge=0),
    )
    fetch_poll_interval: float = setting(
        1.0,
        "Seconds between a producer's fallback fetches, plus up to 10 % jitter: they find the "
        "jobs no notification announced (a lost one, or none at all behind a transaction "
        "pooler without `database.listen_url`) (River `FetchPollInterval`).",
        number(gt=0),
    )
    scheduler_interval: float = setting(
        5.0,
        "Seconds between the leader's passes that make due scheduled and retryable jobs "
        "available and notify their queues (River scheduler). A snooze or retry due within "
        "5 s does not wait for a pass: its job is made available at once, to run when due.",
        number(gt=0),
    )
    completer_tick: float = setting(
        0.05,
        "Longest wait, in seconds, between a job finishing and the write of its outcome: the "
        "completer gathers the completions that arrive within this time of the first one, or "
        "until `completer_flush_size` are waiting, and writes them together. A job that "
        "completed cleanly may instead be written with its producer's next claim. Default "
        "after River's batch completer.",
        number(gt=0),
    )
    completer_flush_size: int = setting(
        100,
        "Waiting completions that make the completer write at once, without waiting out "
        "`completer_tick` (River).",
        integer(1),
    )
    completer_max_batch: int = setting(
        5000,
        "Most job completions written by one statement; larger batches are split (River).",
        integer(1),
    )
    completer_backpressure_high: int = setting(
        10000,
        "When this many completions wait to be written, producers claim no new jobs until the "
        "backlog falls below `completer_backpressure_low`. Finishing jobs never wait: they "
        "hand their outcome over without blocking. River's thresholds.",
        integer(1),
    )
    completer_backpressure_low: int = setting(
        5000,
        "Backlog of waiting completions under which producers claim new jobs again (River).",
        integer(0),
    )
    hot_operation_timeout: float = setting(
        10.0,
        "Deadline, in seconds, of each claim statement and of each attempt to write a batch of "
        "completions; a write that timed out is tried again (River).",
        number(gt=0),
    )
    job_timeout: float | None = setting(
        None,
        "Deadline of one job run, in seconds, for job kinds registered without a timeout of "
        "their own, task runs included; unset means no deadline: a task run polls its upstream "
        "for as long as it takes. A run past it is cancelled and counts as a failed attempt, "
        "retried with backoff; a cancelled task run is requeued first and resumes on the retry.",
        number(gt=0, optional=True),
    )
    completed_retention: float = setting(
        86400.0,
        "Seconds a completed job is kept before the cleaner deletes it (24 h: a day to inspect "
        "what ran).",
        number(ge=0),
    )
    cancelled_retention: float = setting(
        86400.0,
        "Seconds a cancelled job is kept before the cleaner deletes it (River: 24 h).",
        number(ge=0),
    )
    discarded_retention: float = setting(
        604800.0,
        "Seconds a discarded job is kept before the cleaner deletes it (River: 7 days).",
        number(ge=0),
    )
    cleaner_interval: float = setting(
        30.0,
        "Seconds between the leader's passes that delete jobs past their retention (River).",
        number(gt=0),
    )
    leader_ttl: float = setting(
        15.0,
        "Seconds a leadership term lasts without renewal (River: elect interval + 10 s).",
        number(gt=0),
    )
    leader_elect_interval: float = setting(
        5.0,
        "Seconds between attempts to take leadership, plus up to 1 s jitter (a leader's "
        "resignation starts one at once), and between the leader's renewals of its term "
        "(River).",
        number(gt=0),
    )
    insert_max_attempts: int = setting(
        1000,
        "Attempts allowed to an inserted task job before it is discarded; snoozes do not count. "
        "A task job is retried only for infrastructure errors, so a high bound keeps it "
        "through long outages.",
        integer(1),
    )
    insert_priority: int = setting(
        2,
        "Priority of inserted task jobs, 1 (highest) to 4; 2 leaves 1 for "
        "jobs that must jump the queue.",
        integer(1, 4),
    )
    insert_tags: tuple[str, ...] = setting(
        ("gateway-task",),
        "Tags written on inserted task jobs; comma-separated in the environment and with "
        "`--set`; they mark task jobs for "
        "whoever reads the queue (a River client's tooling included).",
        _tags(),
    )
    default_max_attempts: int = setting(
        25,
        "Attempts allowed to a job inserted through the queue client without its own "
        "`max_attempts` (River default). Task jobs always get "
        "`insert_max_attempts`.",
        integer(1, 32767),
    )
    max_workers: int = setting(
        100,
        "Jobs a queue opened on its own (`engine.queue.open`, docs/queue.md) runs at once from "
        "its `default` queue when it is given workers and no queues of its own, 1 to 100,000 "
        "(the most one generation runs; River's `MaxWorkers` is 10,000, a Go client's "
        "goroutines). The service does not read it: its capacity comes from the `[worker]` "
        "section.",
        integer(1, MAX_WORKERS),
    )
    shutdown_drain_timeout: float = setting(
        10.0,
        "Seconds the running jobs of a queue opened on its own (`engine.queue.open`, "
        "docs/queue.md) get to finish when its block ends; then they are cancelled and go back "
        "to `available` at once, their attempt restored. 0 cancels them at once. The service "
        "does not read it: its shutdown takes `worker.shutdown_drain_timeout`.",
        number(ge=0),
    )

    gc_tuning: bool = setting(
        True,
        "Tune Python's garbage collector while this process runs jobs (from the start of its "
        "first generation to the end of its last): what exists when the first starts (the "
        "code, the engine, your app's start-up objects) is left out of later collections "
        "(`gc.freeze()`), and the youngest generation is collected every 10,000 allocations "
        "instead of 700. Runs allocate many short-lived objects that reference counting frees; "
        "with the defaults the collector walks the whole heap again and again for almost no "
        "garbage (about a fifth of the CPU of `bench tasks`), and each full pass stops every "
        "job for 15-30 ms. It is process-wide, so set it false when your application tunes the "
        "collector itself; the previous settings come back when the last generation stops.",
        boolean(),
    )
    river_indexes: bool = setting(
        False,
        "Create the three indexes of River's schema that engine leaves out "
        "(`river_job_args_index` and `river_job_metadata_index`, GIN on `args` and `metadata`, "
        "and `river_job_kind`), concurrently, when migrating. Turn it on when a Go River "
        "service's reindexer or River UI shares the schema; each costs throughput on every "
        "claim and completion (docs/queue.md). Turning it off again drops nothing.",
        boolean(),
    )

    rules: ClassVar[tuple[Rule, ...]] = (
        not_above_rule("queue.fetch_cooldown", "queue.fetch_poll_interval"),
        not_above_rule("queue.completer_flush_size", "queue.completer_max_batch"),
        Rule(
            ("queue.completer_backpressure_low", "queue.completer_backpressure_high"),
            "queue.completer_backpressure_low must be less than queue.completer_backpressure_high",
            lambda v: (
                v["queue.completer_backpressure_low"] < v["queue.completer_backpressure_high"]
            ),
        ),
        Rule(
            ("queue.leader_elect_interval", "queue.leader_ttl"),
            "queue.leader_elect_interval must be less than queue.leader_ttl, or leadership "
            "lapses between two elections",
            lambda v: v["queue.leader_elect_interval"] < v["queue.leader_ttl"],
        ),
    )
    """The rules among these fields."""

    def __attrs_post_init__(self) -> None:
        enforce_section_rules(self, self.rules)
