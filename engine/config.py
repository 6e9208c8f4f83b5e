"""Engine configuration: typed settings, four sources, one error listing every problem.

Every setting is a field of a frozen attrs class; :class:`EngineConfig` holds two top-level
fields and one section class per subsystem. :func:`load_config` merges four sources, a later
one winning for the same field:

1. the defaults written on the fields below;
2. an optional TOML file (``toml_path``, else the file named by ``ENGINE_CONFIG``), with one
   table per section: ``[queue]`` / ``fetch_cooldown = 0.01``;
3. environment variables ``ENGINE_<SECTION>_<FIELD>`` (``ENGINE_QUEUE_FETCH_COOLDOWN``), and
   ``ENGINE_<FIELD>`` for top-level fields (``ENGINE_DATA_DIR``);
4. overrides with dotted keys (``queue.fetch_cooldown``), which the CLI fills from
   ``--set section.field=value`` and a few flags.

Text from the environment and the command line is converted by the field's type: booleans take
``true/false/1/0/yes/no/on/off``, lists are comma-separated, and the empty string means "unset"
(None) for optional fields (also accepted in TOML, which has no null). Unknown ``ENGINE_*``
variables (except ``ENGINE_CONFIG`` and ``ENGINE_TEST_*``) and unknown TOML keys are errors with
a "did you mean" hint. All problems from all sources are collected and raised as one
:class:`~engine.errors.ConfigError`; the CLI prints it and exits with
:data:`config_problems_exit_code`.

Each field's ``metadata["doc"]`` is its user documentation (unit and origin, usually a section
of the project's design notes); :func:`config_reference_markdown` renders them into
``docs/configuration.md``.
"""

import difflib
import inspect
import json
import math
import os
import re
import tomllib
import types
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, Final, Literal, TypeVar, get_args, get_origin
from urllib.parse import urlsplit, urlunsplit

import attrs
import cattrs

from engine.errors import ConfigError
from engine.providers.http.description import HttpModel, http_models_from_tables
from engine.schedules.model import Schedule, duplicate_names, schedule_from_table

__all__ = [
    "AdmissionConfig",
    "DashboardConfig",
    "DatabaseConfig",
    "EngineConfig",
    "FieldInfo",
    "LoadConfig",
    "LoggingConfig",
    "MetricsConfig",
    "QueueConfig",
    "RecoveryConfig",
    "TasksConfig",
    "WorkerConfig",
    "config_as_dict",
    "config_problems_exit_code",
    "config_reference_markdown",
    "iter_fields",
    "load_config",
]

config_problems_exit_code: Final = 2
"""Exit status of the CLI when the configuration is invalid (as argparse's usage errors)."""

_T = TypeVar("_T")

# Variables with the ENGINE_ prefix that are not settings.
_CONFIG_FILE_VAR: Final = "ENGINE_CONFIG"
_TEST_VAR_PREFIX: Final = "ENGINE_TEST_"
_ENV_PREFIX: Final = "ENGINE_"


# ---------------------------------------------------------------------------------------------
# Per-field rules


@attrs.frozen
class _Requirement:
    """An attrs validator that states its rule in words ("must be a number >= 0").

    The same words are used for a value of the wrong type and for one out of range, so each
    field has exactly one message.
    """

    text: str
    test: Callable[[Any], bool]
    optional: bool = False

    def describe(self) -> str:
        """The rule, as the tail of an error message."""
        return f"{self.text}, or empty for none" if self.optional else self.text

    def problem(self, value: object) -> str | None:
        """None if ``value`` is allowed, else the rule it breaks."""
        if value is None and self.optional:
            return None
        try:
            ok = self.test(value)
        except (TypeError, ValueError):
            ok = False
        return None if ok else self.describe()

    def __call__(self, instance: object, attribute: "attrs.Attribute[Any]", value: object) -> None:
        problem = self.problem(value)
        if problem is not None:
            raise ValueError(f"{attribute.name} = {value!r}: {problem}")


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _number(*, gt: float | None = None, ge: float | None = None, optional: bool = False) -> Any:
    if gt is not None:
        bound = gt
        return _Requirement(
            f"must be a number > {bound:g}", lambda v: _is_number(v) and v > bound, optional
        )
    low = 0.0 if ge is None else ge
    return _Requirement(
        f"must be a number >= {low:g}", lambda v: _is_number(v) and v >= low, optional
    )


def _integer(ge: int, le: int | None = None) -> Any:
    if le is None:
        return _Requirement(f"must be an integer >= {ge}", lambda v: _is_int(v) and v >= ge)
    return _Requirement(
        f"must be an integer from {ge} to {le}", lambda v: _is_int(v) and ge <= v <= le
    )


def _fraction() -> Any:
    return _Requirement("must be a number > 0 and <= 1", lambda v: _is_number(v) and 0 < v <= 1)


def _boolean(*, optional: bool = False) -> Any:
    return _Requirement("must be true or false", lambda v: isinstance(v, bool), optional)


def _choice(*choices: str) -> Any:
    listed = ", ".join(repr(c) for c in choices)
    return _Requirement(f"must be one of {listed}", lambda v: isinstance(v, str) and v in choices)


def _text(min_len: int, max_len: int, *, optional: bool = False) -> Any:
    return _Requirement(
        f"must be a string of {min_len} to {max_len} characters",
        lambda v: isinstance(v, str) and min_len <= len(v) <= max_len,
        optional,
    )


def _path(*, optional: bool = False) -> Any:
    return _Requirement("must be a path", lambda v: isinstance(v, Path), optional)


def _postgres_url(*, optional: bool = False) -> Any:
    return _Requirement(
        "must be a postgresql:// or postgres:// URL, each port a number from 1 to 65535",
        lambda v: (
            isinstance(v, str)
            and urlsplit(v).scheme in ("postgresql", "postgres")
            and _ports_valid(v)
        ),
        optional,
    )


def _ports_valid(url: str) -> bool:
    """Every ``host:port`` of ``url`` (libpq accepts several, comma-separated) has a port
    from 1 to 65535, or none; the driver would otherwise fail with its own parse error."""
    hosts = urlsplit(url).netloc.rpartition("@")[2]
    for host in hosts.split(","):
        if host.startswith("["):  # an IPv6 literal: [::1]:5432
            host = host.partition("]")[2]
        _, colon, port = host.rpartition(":")
        if colon and port and not (port.isdigit() and 1 <= int(port) <= 65535):
            return False
    return True


_NAME_RE: Final = re.compile(r"\A[^\s]+\Z")


def _instance_name() -> Any:
    return _Requirement(
        "must be 1 to 63 characters without whitespace",
        lambda v: isinstance(v, str) and len(v) <= 63 and _NAME_RE.match(v) is not None,
        optional=True,
    )


# River's tag rule for job tags; Go's \w is ASCII and \z is Python's \Z.
_TAG_RE: Final = re.compile(r"\A[\w][\w\-]+[\w]\Z", re.ASCII)


def _tags() -> Any:
    return _Requirement(
        "must be a list of tags, each 3 to 255 characters of letters, digits, "
        "'_' and '-', not starting or ending with '-'",
        lambda v: (
            isinstance(v, tuple)
            and all(isinstance(t, str) and len(t) <= 255 and _TAG_RE.match(t) for t in v)
        ),
    )


def _setting(default: _T, doc: str, rule: Any) -> _T:
    """A config field: its default, its user documentation and its rule."""
    return attrs.field(default=default, validator=rule, metadata={"doc": doc})


# ---------------------------------------------------------------------------------------------
# Cross-field rules


@attrs.frozen
class _Rule:
    """A rule between fields; ``holds`` gets a mapping from dotted field name to value."""

    names: tuple[str, ...]
    text: str
    holds: Callable[[Mapping[str, Any]], bool]


def _stale_rule(section: str, what: str) -> _Rule:
    return _Rule(
        (f"{section}.stale_after", "worker.refresh_interval"),
        f"{section}.stale_after must be more than twice worker.refresh_interval: a worker writes "
        f"its heartbeat only once per refresh, so with a shorter threshold a live worker looks "
        f"dead and {what} while it is still working",
        lambda v: v[f"{section}.stale_after"] > 2 * v["worker.refresh_interval"],
    )


def _not_above_rule(low: str, high: str) -> _Rule:
    return _Rule((low, high), f"{low} must not exceed {high}", lambda v: v[low] <= v[high])


_RESOURCES: Final = ("cpu", "memory", "db_connections")

_RULES: Final[tuple[_Rule, ...]] = (
    _not_above_rule("database.pool_min_size", "database.pool_max_size"),
    _Rule(
        ("database.pooler", "database.listen_url", "database.migrate_on_start"),
        'database.pooler = "transaction" with database.migrate_on_start needs '
        "database.listen_url: migrations hold an advisory lock across transactions, which a "
        "transaction pooler does not keep. Set database.listen_url to a direct URL of the "
        "database, or set database.migrate_on_start = false and migrate with "
        "`python -m engine migrate` and a direct database.url",
        lambda v: (
            v["database.pooler"] != "transaction"
            or v["database.listen_url"] is not None
            or not v["database.migrate_on_start"]
        ),
    ),
    _not_above_rule("queue.fetch_cooldown", "queue.fetch_poll_interval"),
    _not_above_rule("queue.completer_flush_size", "queue.completer_max_batch"),
    _Rule(
        ("queue.completer_backpressure_low", "queue.completer_backpressure_high"),
        "queue.completer_backpressure_low must be less than queue.completer_backpressure_high",
        lambda v: v["queue.completer_backpressure_low"] < v["queue.completer_backpressure_high"],
    ),
    _Rule(
        ("queue.leader_elect_interval", "queue.leader_ttl"),
        "queue.leader_elect_interval must be less than queue.leader_ttl, or leadership lapses "
        "between two elections",
        lambda v: v["queue.leader_elect_interval"] < v["queue.leader_ttl"],
    ),
    *(_not_above_rule(f"load.{res}_elevated", f"load.{res}_critical") for res in _RESOURCES),
    _Rule(
        ("tasks.lease_renew_interval", "tasks.lease_ttl"),
        "tasks.lease_renew_interval must be at most half of tasks.lease_ttl, so that one late "
        "or failed renewal does not lose the lease",
        lambda v: 2 * v["tasks.lease_renew_interval"] <= v["tasks.lease_ttl"],
    ),
    _stale_rule("recovery", "recovery takes its running jobs away"),
    _stale_rule("admission", "its admitted tasks are yielded"),
    _Rule(
        ("dashboard.username", "dashboard.password"),
        "dashboard.username and dashboard.password go together: set both for basic auth, or "
        "neither",
        lambda v: (v["dashboard.username"] is None) == (v["dashboard.password"] is None),
    ),
)


def _broken_rules(values: Mapping[str, Any], rules: tuple[_Rule, ...]) -> list[_Rule]:
    return [rule for rule in rules if not rule.holds(values)]


def _enforce_rules(instance: attrs.AttrsInstance) -> None:
    """``__attrs_post_init__`` body: raise ValueError if a cross-field rule is broken."""
    if isinstance(instance, EngineConfig):
        values = {name: _value_at(instance, name) for name in _FIELDS}
        owned = tuple(r for r in _RULES if len({n.split(".")[0] for n in r.names}) > 1)
    else:
        section = _SECTION_OF_CLASS[type(instance)]
        values = {
            f"{section}.{a.name}": getattr(instance, a.name) for a in attrs.fields(type(instance))
        }
        owned = tuple(r for r in _RULES if all(n in values for n in r.names))
    broken = _broken_rules(values, owned)
    if broken:
        raise ValueError("; ".join(rule.text for rule in broken))


# ---------------------------------------------------------------------------------------------
# The settings


@attrs.frozen
class DatabaseConfig:
    """PostgreSQL connections: where the database is and how the connection pools behave."""

    url: str | None = _setting(
        None,
        "URL of the PostgreSQL database (`postgresql://user:password@host:port/dbname`) that "
        "holds the tasks, the job queue and the coordination tables. Unset starts the embedded "
        "PostgreSQL server under `data_dir` instead.",
        _postgres_url(optional=True),
    )
    tasks_url: str | None = _setting(
        None,
        "URL for the task-store pool (the reference's `store`: task rows and the enqueue "
        "transaction); unset means `database.url`. Must reach the same database as "
        "`database.queue_url`, since a task and its job are written in one transaction."
        "",
        _postgres_url(optional=True),
    )
    coordination_url: str | None = _setting(
        None,
        "URL for the coordination pool (the reference's `coordinationStore`: capacity, worker "
        "registry, recovery and admissions); unset means `database.url`. The reference allows a "
        "different database; engine does not yet, and refuses at start a URL that reaches "
        "another database than `database.tasks_url` (a different user or host name for the same "
        "database is fine).",
        _postgres_url(optional=True),
    )
    queue_url: str | None = _setting(
        None,
        "URL for the job-queue pool (the reference's `riverStore`: fetch, completion and "
        "maintenance); unset means `database.url`. Must reach the same database as "
        "`database.tasks_url`.",
        _postgres_url(optional=True),
    )
    pool_min_size: int = _setting(
        1,
        "Connections each pool opens at start and keeps open. Proposed default.",
        _integer(0),
    )
    pool_max_size: int = _setting(
        10,
        "Most connections each pool holds at once; the load controller compares connections in "
        "use with this. Proposed default.",
        _integer(1),
    )
    connect_attempts: int = _setting(
        3,
        "How many times to try to reach an unreachable database server when opening the pools "
        "before giving up (every command that connects; the service does this once per "
        "`worker.startup_attempts` attempt), after the reference's startup retry (3 attempts).",
        _integer(1),
    )
    connect_retry_delay: float = _setting(
        2.0,
        "Seconds to wait between two attempts to reach the database server (reference: 2 s "
        "between startup attempts).",
        _number(ge=0),
    )
    migrate_on_start: bool = _setting(
        True,
        "Apply pending schema migrations at start. Turn it off when migrations are applied "
        "separately before a deploy.",
        _boolean(),
    )
    embedded_check_interval: float = _setting(
        5.0,
        "Seconds between two looks at the embedded server while the engine runs: one that "
        "stopped under it (killed, a full disk) is logged with the tail of its log and started "
        "again, with backoff. Unused with an external server.",
        _number(gt=0),
    )
    probe_interval: float = _setting(
        5.0,
        "Seconds between two probes of the database (`SELECT 1` on each pool, 5 s to answer) "
        "while the engine runs: `/healthz` fails while it does not answer, and the outage is "
        "logged once when it starts and once when it ends.",
        _number(gt=0),
    )
    statement_cache_size: int = _setting(
        100,
        "Prepared statements asyncpg caches per connection. Ignored (no cache) with "
        '`database.pooler = "transaction"`, where a named prepared statement does not survive '
        "its transaction.",
        _integer(0),
    )
    lock_timeout: float | None = _setting(
        None,
        "PostgreSQL `lock_timeout` for every statement, in seconds; unset keeps the server's "
        "setting. A statement that waits longer fails with SQLSTATE 55P03, which a task run "
        "handles as a lock timeout. Set once per connection; with "
        '`database.pooler = "transaction"` set with `SET LOCAL` in every transaction instead '
        "(a statement outside a transaction then runs in one of its own).",
        _number(gt=0, optional=True),
    )
    pooler: Literal["none", "transaction"] = _setting(
        "none",
        "What the database URLs go through: `none` (PostgreSQL itself, or a pooler in session "
        "mode) or `transaction` (PgBouncer's `pool_mode = transaction`, or another pooler that "
        "may run each transaction on another server connection). With `transaction` the "
        "engine keeps no session state on its pools: no prepared statement cache, "
        "`lock_timeout` per transaction, LISTEN and migrations only on `database.listen_url`. "
        "See docs/operations.md, Behind PgBouncer.",
        _choice("none", "transaction"),
    )
    listen_url: str | None = _setting(
        None,
        "A direct URL of the engine's database (not through a transaction pooler) for the "
        "work that needs a session of its own: LISTEN for notifications and, with "
        '`database.pooler = "transaction"`, schema migrations (their advisory lock spans '
        "several transactions). Unset: LISTEN on each pool's own URL without a pooler; behind "
        "a transaction pooler no LISTEN at all (every consumer works at its poll interval: "
        "`queue.fetch_poll_interval` for new jobs, `tasks.lease_renew_interval` for cancels "
        "of running tasks, `worker.refresh_interval`, `admission.dispatch_interval`) and no "
        "migrations.",
        _postgres_url(optional=True),
    )
    command_timeout: float | None = _setting(
        None,
        "Default timeout of one SQL statement on the client side, in seconds (asyncpg's "
        "`command_timeout`); unset means none.",
        _number(gt=0, optional=True),
    )

    def __attrs_post_init__(self) -> None:
        _enforce_rules(self)


@attrs.frozen
class QueueConfig:
    """The job queue, with River's semantics: fetching, completion, maintenance, insert options."""

    name: str = _setting(
        "gateway_tasks",
        "Queue the engine inserts task jobs into and works. 1 to 127 "
        "characters, the limit of the `river_job.queue` column.",
        _text(1, 127),
    )
    job_kind: str = _setting(
        "gateway_task_run",
        "Job kind of task jobs. 1 to 127 characters, the limit of the "
        "`river_job.kind` column.",
        _text(1, 127),
    )
    fetch_cooldown: float = _setting(
        0.005,
        "Least time between two fetches of available jobs, in seconds; also the per-queue rate "
        "limit of insert notifications. Deliberately 5 ms rather than River's 100 ms "
        "`FetchCooldown`, after Oban's `dispatch_cooldown`, "
        "because the 100 ms debounce dominates pickup latency.",
        _number(ge=0),
    )
    fetch_poll_interval: float = _setting(
        1.0,
        "Seconds between fallback fetches when no insert notification arrives, plus up to 10 % "
        "jitter (River `FetchPollInterval`).",
        _number(gt=0),
    )
    scheduler_interval: float = _setting(
        5.0,
        "Seconds between passes that make due scheduled and retryable jobs available; a snooze "
        "or retry at most this far ahead is made available at once (River scheduler).",
        _number(gt=0),
    )
    completer_tick: float = _setting(
        0.05,
        "Tick of the batch completer, in seconds: a tick writes the finished jobs when at least "
        "`completer_flush_size` are waiting, else every 5th tick does (River).",
        _number(gt=0),
    )
    completer_flush_size: int = _setting(
        100,
        "Waiting completions that make the next tick write them (River).",
        _integer(1),
    )
    completer_max_batch: int = _setting(
        5000,
        "Most job completions written by one statement; larger batches are split (River).",
        _integer(1),
    )
    completer_backpressure_high: int = _setting(
        10000,
        "When this many completions wait to be written, finishing jobs block until the backlog "
        "falls below `completer_backpressure_low` (River).",
        _integer(1),
    )
    completer_backpressure_low: int = _setting(
        5000,
        "Backlog of waiting completions under which blocked jobs resume (River).",
        _integer(0),
    )
    hot_operation_timeout: float = _setting(
        10.0,
        "Timeout of each fetch and completion statement, in seconds (River).",
        _number(gt=0),
    )
    job_timeout: float | None = _setting(
        None,
        "Deadline of one job run, in seconds, for job kinds registered without a timeout of "
        "their own, task runs included; unset means no deadline, as the reference's "
        "`JobTimeout` -1. A run past it is cancelled and counts "
        "as a failed attempt, retried with backoff; a cancelled task run is requeued first and "
        "resumes on the retry.",
        _number(gt=0, optional=True),
    )
    completed_retention: float = _setting(
        86400.0,
        "Seconds a completed job is kept before the cleaner deletes it (reference: 24 h).",
        _number(ge=0),
    )
    cancelled_retention: float = _setting(
        86400.0,
        "Seconds a cancelled job is kept before the cleaner deletes it (River: 24 h).",
        _number(ge=0),
    )
    discarded_retention: float = _setting(
        604800.0,
        "Seconds a discarded job is kept before the cleaner deletes it (River: 7 days).",
        _number(ge=0),
    )
    cleaner_interval: float = _setting(
        30.0,
        "Seconds between the leader's passes that delete jobs past their retention (River).",
        _number(gt=0),
    )
    leader_ttl: float = _setting(
        15.0,
        "Seconds a leadership term lasts without renewal (River: elect interval + 10 s).",
        _number(gt=0),
    )
    leader_elect_interval: float = _setting(
        5.0,
        "Seconds between attempts to take or renew leadership, plus up to 1 s jitter (River).",
        _number(gt=0),
    )
    insert_max_attempts: int = _setting(
        1000,
        "Attempts allowed to an inserted task job before it is discarded; snoozes do not count "
        "(reference: 1000).",
        _integer(1),
    )
    insert_priority: int = _setting(
        2,
        "Priority of inserted task jobs, 1 (highest) to 4 (reference: 2).",
        _integer(1, 4),
    )
    insert_tags: tuple[str, ...] = _setting(
        ("gateway-task",),
        "Tags written on inserted task jobs; comma-separated in the environment and with "
        "`--set` (reference: `gateway-task`).",
        _tags(),
    )
    default_max_attempts: int = _setting(
        25,
        "Attempts allowed to a job inserted through the queue client without its own "
        "`max_attempts` (River default). Task jobs always get "
        "`insert_max_attempts`.",
        _integer(1, 32767),
    )

    river_indexes: bool = _setting(
        False,
        "Create the three indexes of River's schema that engine leaves out "
        "(`river_job_args_index` and `river_job_metadata_index`, GIN on `args` and `metadata`, "
        "and `river_job_kind`), concurrently, when migrating. Turn it on when a Go River "
        "service's reindexer or River UI shares the schema; each costs throughput on every "
        "claim and completion (docs/queue.md). Turning it off again drops nothing.",
        _boolean(),
    )

    def __attrs_post_init__(self) -> None:
        _enforce_rules(self)


@attrs.frozen
class WorkerConfig:
    """This process's role, capacity refresh (the heartbeat), and stop and retry timing."""

    mode: Literal["worker", "client"] = _setting(
        "worker",
        "`worker` runs jobs; `client` only inserts jobs and recovers at start (the reference's "
        "`StartAsyncQueueWorker` and `StartAsyncQueueClient`).",
        _choice("worker", "client"),
    )
    refresh_interval: float = _setting(
        5.0,
        "Seconds between capacity refreshes; each refresh re-registers the instance, which is "
        "its heartbeat (the reference's `AsyncWorkerRefreshIntervalSeconds`, whose default was "
        "not seen; 5 s is proposed).",
        _number(gt=0),
    )
    heartbeat_stale_factor: int = _setting(
        6,
        "An instance whose last heartbeat is older than this many refresh intervals gets no "
        "share of the capacity (reference: 6).",
        _integer(2),
    )
    hard_limit: int = _setting(
        100,
        "Cap on the cluster-wide worker capacity; 0 means no cap (the reference's "
        "`AsyncWorkerHardLimit`). At most 2,147,483,647 (the registry's integer columns); "
        "each instance still runs at most 10,000 at once. Proposed default.",
        _integer(0, 2_147_483_647),
    )
    instance_hard_limit: int = _setting(
        0,
        "Cap on the capacity of this instance; 0 means no cap beyond the 10,000 jobs one "
        "generation runs at most (the reference's `AsyncWorkerInstanceHardLimit`).",
        _integer(0, 10_000),
    )
    drain_timeout: float = _setting(
        3600.0,
        "Seconds a worker generation replaced by a resize may spend finishing its running jobs "
        "before they are cancelled (reference: 1 h).",
        _number(gt=0),
    )
    stop_timeout: float = _setting(
        10.0,
        "Seconds each worker generation gets to stop once its jobs are cancelled, at shutdown "
        "and cleanup (reference: 10 s).",
        _number(gt=0),
    )
    mark_draining_timeout: float = _setting(
        5.0,
        "Timeout in seconds for marking this instance draining at shutdown (reference: 5 s).",
        _number(gt=0),
    )
    enqueue_rollback_timeout: float = _setting(
        5.0,
        "Seconds a failed enqueue transaction (submit, recovery re-enqueue, admission, "
        "`tasks retry`) gets to roll back, shielded from the cancellation that may have caused "
        "the failure; past it the connection is dropped, which also ends the transaction "
        "(reference: 5 s on a fresh context).",
        _number(gt=0),
    )
    capacity: Literal["registry", "fixed"] = _setting(
        "registry",
        "Where this instance's worker capacity comes from. `registry`: the global capacity "
        "(from the model and group limits, capped by `worker.hard_limit`) is split between "
        "every live instance by heartbeat, and a resize starts a new generation and drains "
        "the old one. `fixed`: one generation of `worker.instance_hard_limit` executions "
        "(else `worker.hard_limit`), no registry; for an app that runs alone.",
        _choice("registry", "fixed"),
    )
    shutdown_drain_timeout: float = _setting(
        10.0,
        "Seconds running tasks get to finish at shutdown (the first SIGINT or SIGTERM, or "
        "leaving an `engine.open` block) before they are requeued; no new task is claimed "
        "meanwhile. A requeued task that was already submitted upstream keeps its reference "
        "and resumes polling on another instance. 0 requeues at once.",
        _number(ge=0),
    )
    startup_attempts: int = _setting(
        3,
        "Attempts of the whole service start (connecting, migrations, registration, the first "
        "recovery round, the first generation) before the process exits with the last error "
        "(reference: 3).",
        _integer(1),
    )
    startup_retry_delay: float = _setting(
        2.0,
        "Seconds between two attempts of the service start (reference: 2 s).",
        _number(ge=0),
    )
    lock_timeout_requeue_delay: float = _setting(
        1.0,
        "When a run hits a PostgreSQL lock timeout before the upstream submission, the task is "
        "requeued this many seconds later and its job snoozed as long (reference: 1 s).",
        _number(ge=0),
    )

    def __attrs_post_init__(self) -> None:
        _enforce_rules(self)


@attrs.frozen
class LoadConfig:
    """The local load controller: pressure from CPU, memory and database connections."""

    mode: Literal["legacy", "observe", "adaptive"] = _setting(
        "legacy",
        "`legacy` admits runs up to the claim limit; `observe` also computes pressure and safe "
        "capacity but admits as legacy; `adaptive` enforces them.",
        _choice("legacy", "observe", "adaptive"),
    )
    sample_interval: float = _setting(
        1.0,
        "Seconds between two samples of CPU, memory and database-connection use. Proposed."
        "",
        _number(gt=0),
    )
    heavy_limit: int = _setting(
        0,
        "Most runs in the heavy phases (preparing and finalizing) at once; 0 means equal to "
        "the claim limit.",
        _integer(0),
    )
    cpu_elevated: float = _setting(
        0.80,
        "CPU use, as a fraction of the available CPU, at which pressure becomes elevated. "
        "Proposed.",
        _fraction(),
    )
    cpu_critical: float = _setting(
        0.95,
        "CPU use, as a fraction, at which pressure becomes critical. Proposed."
        "",
        _fraction(),
    )
    memory_elevated: float = _setting(
        0.75,
        "Memory use, as a fraction of the cgroup limit, at which pressure becomes elevated. "
        "Proposed.",
        _fraction(),
    )
    memory_critical: float = _setting(
        0.90,
        "Memory use, as a fraction, at which pressure becomes critical. Proposed."
        "",
        _fraction(),
    )
    db_connections_elevated: float = _setting(
        0.70,
        "Database connections in use, as a fraction of the pools' maximum, at which pressure "
        "becomes elevated. Proposed.",
        _fraction(),
    )
    db_connections_critical: float = _setting(
        0.90,
        "Database connections in use, as a fraction, at which pressure becomes critical. "
        "Proposed.",
        _fraction(),
    )
    escalate_samples: int = _setting(
        2,
        "Consecutive samples above a threshold needed to raise the pressure state. Proposed."
        "",
        _integer(1),
    )
    recover_samples: int = _setting(
        3,
        "Consecutive samples below a threshold needed to lower the pressure state. Proposed."
        "",
        _integer(1),
    )
    retry_base: float = _setting(
        0.25,
        "Seconds a refused run's job is snoozed at least; the snooze is `retry_base` plus "
        "(hash of the task id mod `retry_spread_ms`) milliseconds (reference: 250 ms).",
        _number(ge=0),
    )
    retry_spread_ms: int = _setting(
        501,
        "Modulus, in milliseconds, of the per-task part of that snooze (reference: 501, giving "
        "250 to 750 ms).",
        _integer(1),
    )

    def __attrs_post_init__(self) -> None:
        _enforce_rules(self)


@attrs.frozen
class RecoveryConfig:
    """The periodic recovery of interrupted tasks and orphaned jobs."""

    interval: float = _setting(
        15.0,
        "Seconds between recovery rounds; the first runs at start (reference: 15 s).",
        _number(gt=0),
    )
    stale_after: float = _setting(
        45.0,
        "Seconds without a heartbeat after which a worker counts as dead and its running jobs "
        "are recovered (reference: 45 s). Must exceed twice "
        "`worker.refresh_interval`.",
        _number(gt=0),
    )
    batch_size: int = _setting(
        100,
        "Most orphaned jobs recovered per round (reference: 100).",
        _integer(1),
    )
    recoverable_task_limit: int = _setting(
        1000,
        "Most tasks without a live job re-enqueued per call (reference: 1000).",
        _integer(1),
    )

    def __attrs_post_init__(self) -> None:
        _enforce_rules(self)


@attrs.frozen
class AdmissionConfig:
    """Admission: per-scope concurrency enforced before a task takes a worker slot."""

    dispatch_interval: float = _setting(
        0.5,
        "Seconds between dispatcher passes that admit waiting tasks into free scope slots; a "
        "lease release also wakes it. Proposed.",
        _number(gt=0),
    )
    reap_interval: float = _setting(
        5.0,
        "Seconds between passes that release expired admissions. Proposed.",
        _number(gt=0),
    )
    stale_after: float = _setting(
        45.0,
        "Seconds after which an admitted task that has not started, or whose worker is stale, "
        "gives its slot back (reference: 45 s). Must exceed twice "
        "`worker.refresh_interval`.",
        _number(gt=0),
    )
    queue_timeout: float | None = _setting(
        None,
        "Seconds a task may wait for admission before it fails; unset means no limit."
        "",
        _number(gt=0, optional=True),
    )

    def __attrs_post_init__(self) -> None:
        _enforce_rules(self)


@attrs.frozen
class TasksConfig:
    """Task submission limits and the per-task execution lease."""

    max_payload_bytes: int = _setting(
        1_000_000,
        "Largest accepted task payload, in bytes of its JSON encoding. Proposed default.",
        _integer(1),
    )
    max_field_length: int = _setting(
        256,
        "Longest accepted identity field (tenant and user ids, API key fields) and group key, "
        "in characters; a longer one rejects the task (InvalidTask). Model names are capped at "
        "200 by the catalogue's column.",
        _integer(1, 100_000),
    )
    max_payload_depth: int = _setting(
        64,
        "Deepest accepted nesting of objects and arrays in a task payload; a deeper one rejects "
        "the task (InvalidTask) before it is encoded.",
        _integer(1, 1_000),
    )
    lease_ttl: float = _setting(
        60.0,
        "Seconds an execution lease on a task lasts without renewal; a run whose lease lapsed "
        "may be taken over. Proposed default.",
        _number(gt=0),
    )
    lease_renew_interval: float = _setting(
        20.0,
        "Seconds between renewals of a running task's lease; at most half of `lease_ttl`. "
        "Proposed default.",
        _number(gt=0),
    )
    demo_catalogue: bool = _setting(
        True,
        "Install the demo models (served by the simulated provider) when the service starts "
        "on an empty catalogue, so a first `submit` has something to run.",
        _boolean(),
    )

    def __attrs_post_init__(self) -> None:
        _enforce_rules(self)


@attrs.frozen
class MetricsConfig:
    """The Prometheus metrics endpoint."""

    enabled: bool | None = _setting(
        None,
        "Serve Prometheus metrics (and `/healthz`, `/readyz`) over HTTP. Unset: on for "
        "`python -m engine run`, off for an engine embedded with `engine.open` or "
        "`engine.serve`; `true` or `false` decides for both.",
        _boolean(optional=True),
    )
    host: str = _setting(
        "127.0.0.1",
        "Address the metrics server listens on; `0.0.0.0` exposes it on every interface.",
        _text(1, 255),
    )
    port: int = _setting(
        9464,
        "TCP port of the metrics server; 0 picks a free port (useful in tests).",
        _integer(0, 65535),
    )

    def __attrs_post_init__(self) -> None:
        _enforce_rules(self)


@attrs.frozen
class DashboardConfig:
    """The web dashboard, served by the metrics server (`metrics.host`, `metrics.port`).

    Off loopback the dashboard needs an access token or basic-auth credentials: the service
    refuses to start without them. `/metrics`, `/healthz` and `/readyz` never need them.
    """

    enabled: bool | None = _setting(
        None,
        "Serve the dashboard pages on the metrics server. Unset: on for `python -m engine run` "
        "(and `python -m engine dashboard`), off for an engine embedded with `engine.open` or "
        "`engine.serve`; `true` or `false` decides for both. With `metrics.enabled = false` "
        "and this `true`, the server runs for the dashboard alone.",
        _boolean(optional=True),
    )
    token: str | None = _setting(
        None,
        "Access token: a request must send `Authorization: Bearer <token>`, or sign in once "
        "with it on the dashboard's sign-in page (a cookie then carries the session). "
        "Required (or `username` and `password`) when `metrics.host` is not a loopback address.",
        _text(16, 500, optional=True),
    )
    username: str | None = _setting(
        None,
        "Basic-auth user name (with `password`); it is also the actor recorded on changes made "
        "through the dashboard.",
        _text(1, 200, optional=True),
    )
    password: str | None = _setting(
        None,
        "Basic-auth password (with `username`).",
        _text(8, 500, optional=True),
    )

    def __attrs_post_init__(self) -> None:
        _enforce_rules(self)


@attrs.frozen
class LoggingConfig:
    """Log output."""

    format: Literal["kv", "json"] = _setting(
        "kv",
        "`kv` writes `key=value` lines for people; `json` writes one JSON object per line for "
        "log collectors. Every line carries a stable `event` key.",
        _choice("kv", "json"),
    )
    level: Literal["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"] = _setting(
        "INFO",
        "Lowest level written (case-insensitive).",
        _choice("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"),
    )

    def __attrs_post_init__(self) -> None:
        _enforce_rules(self)


@attrs.frozen
class EngineConfig:
    """The whole engine configuration; build it with :func:`load_config`."""

    data_dir: Path | None = attrs.field(
        default=None,
        validator=_path(optional=True),
        metadata={
            "doc": "Directory for the engine's local state, such as the embedded PostgreSQL "
            "cluster; unset means the launcher's default. `~` is expanded."
        },
    )
    app: str | None = _setting(
        None,
        "Your providers, as `package.module:attribute`: a mapping of model name to provider, "
        "or a callable or async context manager that gives one (imported at start; the "
        "service runs the tasks of exactly these models, plus simulation tasks). "
        "`python -m engine run --app` sets it too. Unset: simulation tasks only.",
        _text(3, 500, optional=True),
    )
    instance_name: str | None = _setting(
        None,
        "Human-readable name of this instance, used in its instance and client ids in place of "
        "the host name; unset means the host name. Keep it short: client ids must stay within "
        "100 characters.",
        _instance_name(),
    )
    database: DatabaseConfig = attrs.field(
        factory=DatabaseConfig, metadata={"doc": "PostgreSQL connections."}
    )
    queue: QueueConfig = attrs.field(factory=QueueConfig, metadata={"doc": "The job queue."})
    worker: WorkerConfig = attrs.field(
        factory=WorkerConfig, metadata={"doc": "Worker role and timing."}
    )
    load: LoadConfig = attrs.field(factory=LoadConfig, metadata={"doc": "The load controller."})
    recovery: RecoveryConfig = attrs.field(
        factory=RecoveryConfig, metadata={"doc": "Periodic recovery."}
    )
    admission: AdmissionConfig = attrs.field(
        factory=AdmissionConfig, metadata={"doc": "Admission control."}
    )
    tasks: TasksConfig = attrs.field(factory=TasksConfig, metadata={"doc": "Tasks and leases."})
    metrics: MetricsConfig = attrs.field(
        factory=MetricsConfig, metadata={"doc": "Metrics endpoint."}
    )
    dashboard: DashboardConfig = attrs.field(
        factory=DashboardConfig, metadata={"doc": "Web dashboard."}
    )
    logging: LoggingConfig = attrs.field(factory=LoggingConfig, metadata={"doc": "Logging."})
    http_models: tuple[HttpModel, ...] = attrs.field(
        default=(),
        metadata={
            "doc": "Models served by the HTTP provider kit, as `[[http_models]]` tables of the "
            "TOML file only (docs/http-providers.md).",
            "list_of_tables": True,
        },
    )
    schedules: tuple[Schedule, ...] = attrs.field(
        default=(),
        metadata={
            "doc": "Periodic schedules, as `[[schedules]]` tables of the TOML file only "
            "(docs/schedules.md).",
            "list_of_tables": True,
        },
    )

    def __attrs_post_init__(self) -> None:
        _enforce_rules(self)


_SECTION_CLASSES: Final[dict[str, type[Any]]] = {
    a.name: a.type
    for a in attrs.fields(EngineConfig)
    if isinstance(a.type, type) and attrs.has(a.type)
}
_SECTION_OF_CLASS: Final[dict[type[Any], str]] = {
    cls: name for name, cls in _SECTION_CLASSES.items()
}


def _value_at(config: EngineConfig, dotted: str) -> Any:
    value: Any = config
    for part in dotted.split("."):
        value = getattr(value, part)
    return value


# ---------------------------------------------------------------------------------------------
# Field introspection and the reference document


@attrs.frozen
class FieldInfo:
    """One setting, as documented: names, type, default and rule."""

    name: str
    """Dotted name, as used in ``--set`` (``queue.fetch_cooldown``; ``data_dir`` at top level)."""
    section: str | None
    """The TOML table holding it, or None for a top-level field."""
    key: str
    """The key inside its table."""
    env_var: str
    """The environment variable that sets it (``ENGINE_QUEUE_FETCH_COOLDOWN``)."""
    type: str
    """Its type, in words (``float``, ``int | None``, ``'kv' | 'json'``, ``list[str]``)."""
    default: str
    """Its default, spelled as in TOML (``unset`` for None)."""
    doc: str
    """User documentation: meaning, unit and origin."""
    requirement: str
    """What values are allowed (``a number >= 0``)."""
    attribute: "attrs.Attribute[Any]" = attrs.field(repr=False, eq=False)
    """The attrs attribute behind it."""


def _split_optional(tp: Any) -> tuple[bool, Any]:
    if get_origin(tp) in (types.UnionType,) and type(None) in get_args(tp):
        rest = [a for a in get_args(tp) if a is not type(None)]
        return True, rest[0]
    return False, tp


def _type_text(tp: Any) -> str:
    optional, base = _split_optional(tp)
    if get_origin(base) is Literal:
        text = " | ".join(repr(a) for a in get_args(base))
    elif get_origin(base) is tuple:
        text = "list[str]"
    elif base is Path:
        text = "path"
    else:
        text = base.__name__
    return f"{text} | None" if optional else text


def _toml_text(value: object) -> str:
    if value is None:
        return "unset"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, tuple):
        return json.dumps(list(value))
    if isinstance(value, str | Path):
        return json.dumps(str(value))
    return repr(value)


def _env_var(section: str | None, key: str) -> str:
    return f"{_ENV_PREFIX}{section.upper()}_{key.upper()}" if section else _ENV_PREFIX + key.upper()


def _field_info(section: str | None, attribute: "attrs.Attribute[Any]") -> FieldInfo:
    rule = attribute.validator
    assert isinstance(rule, _Requirement), attribute.name
    return FieldInfo(
        name=f"{section}.{attribute.name}" if section else attribute.name,
        section=section,
        key=attribute.name,
        env_var=_env_var(section, attribute.name),
        type=_type_text(attribute.type),
        default=_toml_text(attribute.default),
        doc=attribute.metadata["doc"],
        requirement=rule.describe().removeprefix("must be "),
        attribute=attribute,
    )


def iter_fields() -> Iterator[FieldInfo]:
    """Every setting, top-level fields first, then each section's fields in declaration order."""
    for attribute in attrs.fields(EngineConfig):
        if attribute.metadata.get("list_of_tables"):
            continue  # not a setting: read from the TOML file's array of tables only
        if attribute.name in _SECTION_CLASSES:
            for inner in attrs.fields(_SECTION_CLASSES[attribute.name]):
                yield _field_info(attribute.name, inner)
        else:
            yield _field_info(None, attribute)


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def config_reference_markdown() -> str:
    """The configuration reference as Markdown: sources and syntax, then a table per section."""
    lines = [
        "# Configuration reference",
        "",
        "<!-- Generated from engine/config.py by engine.config.config_reference_markdown(); "
        "do not edit by hand. -->",
        "",
        "Settings come from four sources; for the same setting a later one wins:",
        "",
        "1. the defaults below;",
        "2. a TOML file, given by the CLI or by `ENGINE_CONFIG`, with one table per section;",
        "3. environment variables `ENGINE_<SECTION>_<SETTING>` (`ENGINE_<SETTING>` at top level);",
        "4. command-line overrides `--set section.setting=value`.",
        "",
        "Environment and command-line values are text: booleans take `true`, `false`, `1`, `0`, "
        "`yes`, `no`, `on`, `off`; lists are comma-separated; an empty value unsets an optional "
        "setting (also in TOML). Times are in seconds and may be fractional. An unknown "
        "`ENGINE_*` variable (other than `ENGINE_CONFIG` and `ENGINE_TEST_*`) or an unknown TOML "
        f"key is an error. All problems are reported together, and the CLI exits with status "
        f"{config_problems_exit_code}.",
        "",
        "```toml",
        "[queue]",
        "fetch_cooldown = 0.01",
        "",
        "[worker]",
        "hard_limit = 50",
        "```",
    ]
    by_section: dict[str | None, list[FieldInfo]] = {}
    for info in iter_fields():
        by_section.setdefault(info.section, []).append(info)
    for section, infos in by_section.items():
        lines.append("")
        if section is None:
            lines += ["## Top level", "", "Keys outside any table."]
        else:
            intro = inspect.cleandoc(_SECTION_CLASSES[section].__doc__ or "")
            lines += [f"## `[{section}]`", "", intro]
        lines += [
            "",
            "| Setting | Type | Default | Allowed | Environment variable | Description |",
            "|---|---|---|---|---|---|",
        ]
        for info in infos:
            cells = (
                f"`{info.name}`",
                _cell(info.type),
                f"`{_cell(info.default)}`",
                _cell(info.requirement),
                f"`{info.env_var}`",
                _cell(info.doc),
            )
            lines.append("| " + " | ".join(cells) + " |")
    lines += [
        "",
        "## `[[schedules]]`",
        "",
        "Periodic schedules, one `[[schedules]]` table each, in the TOML file only (not in the "
        "environment or `--set`); an embedding app may also pass its own to `engine.open`. "
        "Their keys and their `[schedules.task]` / `[schedules.job]` tables are described in "
        "[schedules.md](schedules.md).",
        "",
        "## `[[http_models]]`",
        "",
        "Models served by the HTTP provider kit, one `[[http_models]]` table each, in the TOML "
        "file only: `python -m engine run` serves them with the `app` setting's providers. "
        "Their keys are described in [http-providers.md](http-providers.md).",
    ]
    lines += ["", "## Rules between settings", ""]
    lines += [f"- {rule.text}." for rule in _RULES]
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------------------------
# Loading


_FIELDS: Final[dict[str, FieldInfo]] = {info.name: info for info in iter_fields()}
_BY_ENV_VAR: Final[dict[str, FieldInfo]] = {info.env_var: info for info in _FIELDS.values()}
_TRUE: Final = frozenset({"true", "1", "yes", "on"})
_FALSE: Final = frozenset({"false", "0", "no", "off"})

_converter: Final = cattrs.Converter(forbid_extra_keys=True)
_converter.register_unstructure_hook(Path, str)


@attrs.frozen
class _Given:
    """One value from one source, before conversion."""

    name: str
    raw: object
    origin: str
    text: bool


def _convert(raw: object, tp: Any, *, text: bool) -> object:
    """Best-effort conversion of ``raw`` to ``tp``; the field's rule judges the result."""
    optional, base = _split_optional(tp)
    if optional and raw == "":
        return None
    if get_origin(base) is Literal:
        if isinstance(raw, str):
            for choice in get_args(base):
                if raw.strip().casefold() == str(choice).casefold():
                    return choice
        return raw
    if not text:
        if base is float and _is_int(raw):
            return float(raw)  # type: ignore[arg-type]
        if base is Path and isinstance(raw, str):
            return Path(raw).expanduser()
        if get_origin(base) is tuple and isinstance(raw, list):
            return tuple(raw)
        return raw
    assert isinstance(raw, str)
    stripped = raw.strip()
    try:
        if base is bool:
            lowered = stripped.lower()
            return True if lowered in _TRUE else False if lowered in _FALSE else raw
        if base is int:
            return int(stripped)
        if base is float:
            return float(stripped)
    except ValueError:
        return raw
    if base is Path:
        return Path(raw).expanduser()
    if get_origin(base) is tuple:
        return tuple(item.strip() for item in raw.split(",") if item.strip())
    return raw


def _redacted(url: str) -> str:
    """``url`` with its password, if any, replaced by ``***``."""
    try:
        parts = urlsplit(url)
        if parts.password is None:
            return url
    except ValueError:
        return url
    host = parts.netloc.rpartition("@")[2]
    return urlunsplit(parts._replace(netloc=f"{parts.username or ''}:***@{host}"))


#: Settings whose values never appear in messages or in ``config_as_dict``.
_SECRETS: Final = frozenset({"dashboard.token", "dashboard.password"})


def _shown(name: str, value: object) -> str:
    """``repr(value)``, with the password of a database URL masked."""
    if name.endswith("url") and isinstance(value, str):
        value = _redacted(value)
    if name in _SECRETS and value is not None:
        return "'***'"
    return repr(value)


def _suggestion(word: str, candidates: list[str], spell: Callable[[str], str] = str) -> str:
    # Compared without the ENGINE_ prefix every variable shares, or it alone makes any short
    # name look close to another (ENGINE_QWXZJK to ENGINE_APP).
    def bare(name: str) -> str:
        return name.removeprefix(_ENV_PREFIX)

    by_bare = {bare(c): c for c in candidates}
    close = difflib.get_close_matches(bare(word), list(by_bare), n=1, cutoff=0.6)
    return f"; did you mean {spell(by_bare[close[0]])}?" if close else ""


def _read_schedules(value: object, origin: str, problems: list[str]) -> list[Schedule]:
    """The ``[[schedules]]`` tables; a problem per bad field, naming the table and the field."""
    if not isinstance(value, list):
        problems.append(
            f"schedules ({origin}): must be an array of tables; write [[schedules]] once per "
            "schedule"
        )
        return []
    schedules: list[Schedule] = []
    for n, table in enumerate(value):
        name = table.get("name") if isinstance(table, dict) else None
        where = f"schedules[{n}]" + (f" ({name})" if isinstance(name, str) and name else "")
        schedule, found = schedule_from_table(table, where)
        problems += [f"{problem} ({origin})" for problem in found]
        if schedule is not None:
            schedules.append(schedule)
    problems += [f"{problem} ({origin})" for problem in duplicate_names(schedules)]
    return schedules


def _read_toml(path: Path, named_by: str | None, problems: list[str]) -> list[_Given]:
    where = f"{path} (from {named_by})" if named_by else str(path)
    try:
        with path.open("rb") as file:
            data = tomllib.load(file)
    except OSError as exc:
        problems.append(f"{where}: cannot read the configuration file: {exc.strerror or exc}")
        return []
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        problems.append(f"{where}: not valid TOML: {exc}")
        return []
    origin = f"from {path}"
    given: list[_Given] = []
    names = list(_FIELDS)
    for key, value in data.items():
        if key == "schedules":
            given.append(_Given(key, _read_schedules(value, origin, problems), origin, False))
        elif key == "http_models":
            models, found = http_models_from_tables(value, origin)
            problems += found
            given.append(_Given(key, models, origin, False))
        elif key in _SECTION_CLASSES:
            if not isinstance(value, dict):
                problems.append(
                    f"{key} = {value!r} ({origin}): must be a table; write [{key}] and put its "
                    "settings under it"
                )
                continue
            for inner, inner_value in value.items():
                dotted = f"{key}.{inner}"
                if dotted in _FIELDS:
                    given.append(_Given(dotted, inner_value, origin, text=False))
                else:
                    hint = _suggestion(dotted, names)
                    problems.append(f"{dotted} ({origin}): unknown setting{hint}")
        elif key in _FIELDS:
            given.append(_Given(key, value, origin, text=False))
        elif isinstance(value, dict):
            hint = _suggestion(key, list(_SECTION_CLASSES), lambda s: f"[{s}]")
            problems.append(f"[{key}] ({origin}): unknown section{hint}")
        else:
            problems.append(f"{key} ({origin}): unknown setting{_suggestion(key, names)}")
    return given


def _read_env(env: Mapping[str, str], problems: list[str]) -> list[_Given]:
    given: list[_Given] = []
    for var in sorted(env):
        if not var.startswith(_ENV_PREFIX) or var == _CONFIG_FILE_VAR:
            continue
        if var.startswith(_TEST_VAR_PREFIX):
            continue
        info = _BY_ENV_VAR.get(var)
        if info is None:
            hint = _suggestion(var, list(_BY_ENV_VAR))
            problems.append(f"{var} (environment variable): unknown setting{hint}")
        else:
            given.append(_Given(info.name, env[var], f"from {var}", text=True))
    return given


def _read_overrides(overrides: Mapping[str, object], problems: list[str]) -> list[_Given]:
    given: list[_Given] = []
    for key, value in overrides.items():
        if key in _FIELDS:
            given.append(_Given(key, value, "from --set", text=isinstance(value, str)))
        else:
            problems.append(f"{key} (from --set): unknown setting{_suggestion(key, list(_FIELDS))}")
    return given


def load_config(
    *,
    env: Mapping[str, str] | None = None,
    toml_path: Path | None = None,
    overrides: Mapping[str, object] | None = None,
) -> EngineConfig:
    """Build the configuration from defaults, a TOML file, the environment and overrides.

    ``env`` defaults to ``os.environ``; ``toml_path`` defaults to the file named by
    ``ENGINE_CONFIG`` in ``env`` (none if unset or empty); ``overrides`` maps dotted names
    (``queue.fetch_cooldown``) to text, as given by ``--set``, converted like environment
    values; a non-text value (from a typed CLI flag) must already have the field's type, as in
    TOML. Overrides beat the environment, which beats the file, which beats the defaults.

    Raises :class:`~engine.errors.ConfigError` listing every problem found in every source:
    unreadable or malformed file, unknown keys or variables, bad values (even ones a higher
    source overrides) and broken rules between fields.
    """
    environ: Mapping[str, str] = os.environ if env is None else env
    problems: list[str] = []
    layers: list[list[_Given]] = []
    if toml_path is not None:
        layers.append(_read_toml(toml_path, None, problems))
    elif environ.get(_CONFIG_FILE_VAR):
        path = Path(environ[_CONFIG_FILE_VAR]).expanduser()
        layers.append(_read_toml(path, _CONFIG_FILE_VAR, problems))
    layers.append(_read_env(environ, problems))
    layers.append(_read_overrides(overrides or {}, problems))

    # The winning (given, value) per field; value is None-or-valid only when the rule passed.
    effective: dict[str, tuple[_Given, object, bool]] = {}
    schedules: tuple[Schedule, ...] = ()
    http_models: tuple[HttpModel, ...] = ()
    for layer in layers:
        for given in layer:
            if given.name == "schedules":
                assert isinstance(given.raw, list)
                schedules = tuple(given.raw)
                continue
            if given.name == "http_models":
                assert isinstance(given.raw, list)
                http_models = tuple(given.raw)
                continue
            info = _FIELDS[given.name]
            value = _convert(given.raw, info.attribute.type, text=given.text)
            rule = info.attribute.validator
            assert isinstance(rule, _Requirement)
            problem = rule.problem(value)
            if problem is not None:
                problems.append(
                    f"{given.name} = {_shown(given.name, given.raw)} ({given.origin}): {problem}"
                )
            effective[given.name] = (given, value, problem is None)

    values: dict[str, object] = {}
    shown: dict[str, str] = {}
    for name, info in _FIELDS.items():
        if name in effective:
            given, value, ok = effective[name]
            shown[name] = f"{name} = {_shown(name, given.raw)} ({given.origin})"
            if ok:
                values[name] = value
        else:
            values[name] = info.attribute.default
            shown[name] = f"{name} = {_shown(name, info.attribute.default)} (default)"
    for cross in _RULES:
        if all(n in values for n in cross.names) and not cross.holds(values):
            problems.append(", ".join(shown[n] for n in cross.names) + f": {cross.text}")

    if problems:
        raise ConfigError(problems)
    nested: dict[str, Any] = {section: {} for section in _SECTION_CLASSES}
    for name, value in values.items():
        section, _, key = name.rpartition(".")
        (nested[section] if section else nested)[key] = value
    return attrs.evolve(
        _converter.structure(nested, EngineConfig), schedules=schedules, http_models=http_models
    )


def config_as_dict(config: EngineConfig, *, redact: bool = True) -> dict[str, Any]:
    """The configuration as plain data (TOML-shaped), e.g. for ``engine config show``.

    With ``redact`` (the default) the passwords in database URLs are replaced by ``***``.
    """
    data: dict[str, Any] = _converter.unstructure(config)
    if redact:
        database = data["database"]
        for key, value in database.items():
            if key.endswith("url") and isinstance(value, str):
                database[key] = _redacted(value)
        dashboard = data["dashboard"]
        for key in ("token", "password"):
            if dashboard.get(key) is not None:
                dashboard[key] = "***"
    return data
