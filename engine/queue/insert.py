"""Inserting jobs: one statement for one job or twenty thousand, unique or not.

Every insert goes through ``job_insert_many`` (an ``unnest`` INSERT ... ON CONFLICT on the
partial unique index), or ``job_insert_one``, the same statement over scalars, for a single
job; so bulk inserts keep River's uniqueness and a duplicate returns the live
job flagged ``skipped``. The NOTIFY that wakes producers rides in the same statement (so it is
delivered at commit, or never on rollback), once per queue per statement, whenever an inserted
job is available. Unlike River's ``notifylimiter`` there is no rate limit on the insert side: a
NOTIFY held back there leaves the job waiting for a poll whenever the insert commits after the
producers' last fetch, and nothing could send it later (the caller's transaction may still be
open). Bursts are absorbed on the receiving side instead: a producer's wake-ups coalesce, and it
fetches at most once per ``fetch_cooldown``.

Jobs are invisible until the caller's transaction commits and vanish on rollback, because the
insert runs on whatever connection it is given (:func:`insert_tx`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

import attrs

from engine.db.bridge import Connection, Pool, Statements
from engine.db.jsontext import compact
from engine.db.sqlfiles import QUERIES
from engine.errors import JobError
from engine.queue.job import (
    InsertManyParams,
    InsertOpts,
    InsertResult,
    Job,
    args_kind,
    args_to_dict,
    check_kind,
    unique_arg_names,
)
from engine.queue.notifier import insert_payload
from engine.queue.states import JobState
from engine.queue.unique import unique_key

__all__ = [
    "DEFAULT_MAX_ATTEMPTS",
    "InsertManyItem",
    "InsertParams",
    "insert",
    "insert_many",
    "insert_tx",
    "job_columns",
    "prepare",
    "prepare_many",
]

#: Attempts of a job inserted without its own ``max_attempts`` and without a client default
#: (River's ``MaxAttempts`` default).
DEFAULT_MAX_ATTEMPTS = 25

#: One item of a bulk insert: args (an attrs instance whose class names its kind), an
#: ``(args, opts)`` pair, or an :class:`~engine.queue.job.InsertManyParams` (the form that can
#: carry a kind, so the one for mapping args).
InsertManyItem = Any | tuple[Any, InsertOpts | None] | InsertManyParams

_INSERT_MANY = QUERIES["job_insert_many"]
_INSERT_ONE = QUERIES["job_insert_one"]
#: Rows per statement: large enough to amortise the round trip, small enough to stay well under
#: Postgres's parameter and memory limits (River's completer uses the same sub-batch size).
CHUNK = 5000


@attrs.frozen
class InsertParams:
    """One job ready to insert: every column value, computed in Python."""

    kind: str
    args: dict[str, Any]
    queue: str
    priority: int
    max_attempts: int
    scheduled_at: datetime | None
    state: JobState
    tags: tuple[str, ...]
    metadata: Mapping[str, Any]
    unique_key: bytes | None
    unique_states: str | None


def prepare(
    args: Any,
    opts: InsertOpts | None = None,
    *,
    kind: str | None = None,
    default_max_attempts: int = DEFAULT_MAX_ATTEMPTS,
) -> InsertParams:
    """Turn args and options into column values, validating both before anything is stored.

    Args:
        args: an attrs instance whose class has ``kind``, or a mapping together with ``kind``.
        opts: insert options (River's defaults when omitted).
        kind: the job kind when ``args`` is a mapping.
        default_max_attempts: the attempts when ``opts.max_attempts`` is None (the queue
            client passes ``queue.default_max_attempts``).

    Raises:
        JobError: no kind (mapping args without ``kind``, or a class without one),
            unencodable args, bad unique options.
    """
    opts = opts or InsertOpts()
    kind = args_kind(args) if kind is None else check_kind(kind)
    values = args_to_dict(args)
    state = JobState.AVAILABLE
    if opts.pending:
        state = JobState.PENDING
    elif opts.scheduled_at is not None:
        # River: any ScheduledAt makes the job scheduled, even a past one.
        state = JobState.SCHEDULED
    key: bytes | None = None
    states: str | None = None
    if opts.unique is not None and not opts.unique.is_empty:
        unique = opts.unique
        if unique.by_args is True:
            tagged = unique_arg_names(args)
            if tagged is not None:
                unique = attrs.evolve(unique, by_args=tagged)
        key = unique_key(kind, values, opts.queue, unique, opts.scheduled_at or datetime.now(UTC))
        states = unique.states_bitmask()
    return InsertParams(
        kind=kind,
        args=values,
        queue=opts.queue,
        priority=opts.priority,
        max_attempts=default_max_attempts if opts.max_attempts is None else opts.max_attempts,
        scheduled_at=opts.scheduled_at,
        state=state,
        tags=opts.tags,
        metadata=opts.metadata,
        unique_key=key,
        unique_states=states,
    )


def prepare_many(
    items: Sequence[InsertManyItem], *, default_max_attempts: int = DEFAULT_MAX_ATTEMPTS
) -> list[InsertParams]:
    """:func:`prepare` each item of a bulk insert (see :data:`InsertManyItem`), checking them
    all before anything is stored.

    Raises:
        JobError: an item is not one of the three forms, a mapping comes without a kind, or
            :func:`prepare` refused it; the message names the item's index.
    """
    out: list[InsertParams] = []
    for index, item in enumerate(items):
        kind: str | None = None
        opts: InsertOpts | None = None
        if isinstance(item, InsertManyParams):
            args, opts, kind = item.args, item.opts, item.kind
        elif isinstance(item, tuple):
            if len(item) != 2 or not (item[1] is None or isinstance(item[1], InsertOpts)):
                raise JobError(
                    f"insert_many item {index}: a tuple must be (args, InsertOpts or None); "
                    "use InsertManyParams(args, opts, kind=...) for anything else"
                )
            args, opts = item
        else:
            args = item
        if kind is None and isinstance(args, Mapping):
            raise JobError(
                f"insert_many item {index}: job args given as a mapping have no kind: pass "
                "InsertManyParams(args, opts, kind=...) for it, or use an attrs class with a "
                "ClassVar[str] kind"
            )
        try:
            out.append(prepare(args, opts, kind=kind, default_max_attempts=default_max_attempts))
        except JobError as exc:
            raise JobError(f"insert_many item {index}: {exc}") from exc
    return out


def job_columns(jobs: Sequence[InsertParams]) -> list[list[Any]]:
    """``job_insert_many``'s first eleven parameters, the column arrays of ``jobs`` (also the
    job part of a task submission's one statement)."""
    return [
        [p.kind for p in jobs],
        [compact(p.args) for p in jobs],
        [p.queue for p in jobs],
        [p.priority for p in jobs],
        [p.max_attempts for p in jobs],
        [p.scheduled_at for p in jobs],
        [p.state.value for p in jobs],
        [compact(list(p.tags)) if p.tags else "[]" for p in jobs],
        [compact(dict(p.metadata)) if p.metadata else "{}" for p in jobs],
        [p.unique_key for p in jobs],
        [p.unique_states for p in jobs],
    ]


async def _insert_chunk(
    conn: Statements, chunk: Sequence[InsertParams], notify_channel: str | None
) -> list[InsertResult]:
    # Two rows with one live unique key in one statement would make ON CONFLICT touch a row
    # twice (an error); send the first and answer the rest with its result, flagged skipped.
    first_of: dict[bytes, int] = {}
    send: list[InsertParams] = []
    slot: list[tuple[int, bool]] = []
    for p in chunk:
        if p.unique_key is not None and p.unique_key in first_of:
            slot.append((first_of[p.unique_key], True))
            continue
        if p.unique_key is not None:
            first_of[p.unique_key] = len(send)
        slot.append((len(send), False))
        send.append(p)
    available = [p.queue for p in send if p.state is JobState.AVAILABLE]
    payloads = (
        [insert_payload(q) for q in dict.fromkeys(available)] if notify_channel is not None else []
    )
    columns = job_columns(send)
    if len(send) == 1:  # job_insert_one: the same statement over scalars, no arrays
        query, columns = _INSERT_ONE, [column[0] for column in columns]
    else:
        query = _INSERT_MANY
    rows = await conn.fetch(query, *columns, notify_channel or "", payloads)
    # RETURNING yields rows in the order INSERT ... SELECT ... ORDER BY produced them.
    results = [InsertResult(Job.from_record(r), bool(r["skipped"])) for r in rows]
    return [InsertResult(results[i].job, True) if dup else results[i] for i, dup in slot]


async def insert_tx(
    conn: Connection,
    params: Sequence[InsertParams],
    notify_channel: str | None = None,
) -> list[InsertResult]:
    """Insert on ``conn``, inside whatever transaction the caller holds; available jobs are
    announced on ``notify_channel`` (the insert channel; None announces nothing).

    The jobs become visible when that transaction commits and are gone if it rolls back.
    """
    out: list[InsertResult] = []
    for start in range(0, len(params), CHUNK):
        out.extend(await _insert_chunk(conn, params[start : start + CHUNK], notify_channel))
    return out


async def insert_many(
    pool: Pool, params: Sequence[InsertParams], notify_channel: str | None = None
) -> list[InsertResult]:
    """Insert many jobs in one transaction (one statement per :data:`CHUNK` rows)."""
    if len(params) <= CHUNK:
        async with pool.acquire() as conn:
            return await _insert_chunk(conn, params, notify_channel)
    async with pool.transaction() as conn:
        return await insert_tx(conn, params, notify_channel)


async def insert(
    pool: Pool, params: InsertParams, notify_channel: str | None = None
) -> InsertResult:
    """Insert one job in its own (implicit) transaction: one round trip."""
    (result,) = await _insert_chunk(pool, [params], notify_channel)
    return result
