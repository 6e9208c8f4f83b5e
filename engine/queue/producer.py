"""The producer: claims jobs of one queue for one generation and starts them.

It never claims more than its free slots (``max_workers`` minus running, and the process-wide
:class:`~engine.queue.slots.SlotPool`), all in one statement (``FOR UPDATE SKIP LOCKED``).
It fetches when woken by an insert NOTIFY, by a poll timer with jitter (the fallback when
notifications are lost, e.g. behind PgBouncer), and when slots free up after a fetch came back
full or was skipped for lack of room. Fetches that found the queue drained are at least
``cooldown`` apart. A wake-up is never lost: one that arrives during a claim or a cooldown is kept
(:class:`~engine.db.listen.Wakeup`) and served by the next fetch, and every insert of an
available job notifies (:mod:`engine.queue.insert`).

After a fetch that found jobs, a loop fetches once more one cooldown later. Nothing depends on it
for correctness; it is there for latency: with it the queue benchmark's pickup latency is p50
~2.2 ms, without it ~2.9 ms (a steady trickle of jobs finds the claim connection and its server
process warm).

The claim runs shielded with a deadline: a claim the server committed but we never read would
leave jobs running with no one working them.

An optional args filter narrows what the producer claims (``ProducerConfig.args_filter``,
``(key, values)``): a job is claimable when its args lack ``key`` (or hold null there) or hold
one of ``values``. The queue knows nothing of what the key means; the task layer routes jobs by
model with it (:func:`engine.tasks.jobs.model_claim_filter`). Without a filter every job is
claimable, as before.
"""

from __future__ import annotations

import logging
import math
import random
from collections.abc import Callable, Iterable

import attrs
import trio

from engine.db.bridge import Connection, Pool
from engine.db.listen import Wakeup
from engine.db.sqlfiles import QUERIES
from engine.errors import ConnectionLost, DatabaseError
from engine.queue.completer import Completer
from engine.queue.job import Job
from engine.queue.observe import QUIET, QueueObserver
from engine.queue.slots import SlotPool

__all__ = ["Producer", "ProducerConfig", "normalize_args_filter"]

log = logging.getLogger(__name__)

_CLAIM = QUERIES["job_get_available_completing"]
_QUEUE_UPSERT = QUERIES["queue_upsert"]


def normalize_args_filter(
    value: tuple[str, Iterable[str]] | None,
) -> tuple[str, tuple[str, ...]] | None:
    """Check an args filter ``(key, values)`` and return it with ``values`` as a sorted tuple.

    Raises:
        ValueError: an empty key, a bare string for ``values`` (it would filter on its
            letters), or a value that is not a string.
    """
    if value is None:
        return None
    key, values = value
    if not isinstance(key, str) or not key:
        raise ValueError(f"args filter key must be a non-empty str, got {key!r}")
    if isinstance(values, str):
        raise ValueError("args filter values must be a collection of str, not a str")
    listed = list(values)
    for item in listed:
        if not isinstance(item, str):
            raise ValueError(f"args filter values must be str, got {item!r}")
    return (key, tuple(sorted(set(listed))))


@attrs.frozen
class ProducerConfig:
    """How one producer fetches; its generation fills in the timing from its own
    :class:`~engine.queue.generation.GenerationConfig` (the ``[queue]`` section)."""

    queue: str
    max_workers: int
    client_id: str
    cooldown: float
    """Least time between two fetches that found the queue drained (``queue.fetch_cooldown``)."""
    poll_interval: float
    """Fallback fetch period, before jitter (``queue.fetch_poll_interval``)."""
    claim_timeout: float
    """Deadline of one claim statement (``queue.hot_operation_timeout``)."""
    #: Claim loops, each with its own connection (see :meth:`Producer.run`).
    fetchers: int = 2
    #: Most completions one claim carries for the completer.
    carry_limit: int = 5000
    #: Most jobs one claim takes; None: :attr:`claim_limit` decides.
    claim_max: int | None = None
    #: ``(key, values)``: claim only jobs whose args lack ``key`` or hold one of ``values``;
    #: None claims every job.
    args_filter: tuple[str, tuple[str, ...]] | None = attrs.field(
        default=None, converter=normalize_args_filter
    )

    @property
    def claim_limit(self) -> int:
        """Most jobs one claim takes: ``claim_max``, or a quarter of ``max_workers``, from 32
        to 128.

        Smaller claims start their first jobs sooner: 32 measured best for 100 workers of 50 ms
        jobs (sleepy benchmark) without costing the no-op burn-down at 32. With hundreds of
        workers a claim of 32 is a statement per 32 jobs for no gain in latency: at 600 (the
        task drain) claims of 128 or 150 cost 40 % fewer statements, 0-7 % less Python and up
        to 15 % less PostgreSQL CPU a task. Claims of 256 did no better there, and held 10,000
        tasks in flight at 10.0 KB of RSS a task against 9.7 at 128 (docs/benchmarks.md).
        """
        if self.claim_max is not None:
            return self.claim_max
        return min(max(32, self.max_workers // 4), 128)


class Producer:
    """Claims and starts jobs for one queue; see the module docstring."""

    def __init__(
        self,
        config: ProducerConfig,
        pool: Pool,
        wakeup: Wakeup,
        slots: SlotPool,
        start_job: Callable[[Job], None],
        completer: Completer,
        *,
        observer: QueueObserver = QUIET,
    ) -> None:
        self.config = config
        self.pool = pool
        self.wakeup = wakeup
        self.slots = slots
        self._start_job = start_job
        self.completer = completer
        self.observer = observer
        self.running = 0
        self.claimed = 0
        self.fetches = 0
        self._fetch_when_free = False
        self._in_flight = 0
        key, values = config.args_filter or (None, None)
        self._filter_key: str | None = key
        self._filter_values: list[str] | None = None if values is None else list(values)

    def free_slots(self) -> int:
        """How many jobs this producer may claim now."""
        return max(0, min(self.config.max_workers - self.running, self.slots.available()))

    def job_finished(self) -> None:
        """Bookkeeping when one of our jobs is done (called by the generation)."""
        self.running -= 1
        self.slots.give_back(1)
        if self._fetch_when_free or self._in_flight:
            # After a full fetch, or while a claim is in flight (so a second loop can claim
            # the slot now instead of after that round trip).
            self._fetch_when_free = False
            self.wakeup.set()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Fetch until cancelled (the generation's fetch scope); ``started()`` once registered.

        Runs ``fetchers`` claim loops, each holding one pooled connection (measured:
        a held connection answers in ~290 µs, a fresh acquire in ~720 µs). With two, slots that
        free up while one claim is in flight are claimed by the other loop at once instead of
        after the round trip; both only ever claim free slots. A lost connection is replaced.
        """
        await self.pool.execute(_QUEUE_UPSERT, self.config.queue)
        async with trio.open_nursery() as nursery:
            for index in range(self.config.fetchers):
                nursery.start_soon(self._fetcher, index == 0)
            task_status.started()

    async def _has_room(self) -> bool:
        """True when a claim may go ahead; otherwise arrange to be woken when it may."""
        if not self.completer.has_room():
            await self.completer.wait_for_room()
        if self.running >= self.config.max_workers:
            self._fetch_when_free = True  # job_finished() wakes us
            return False
        if self.slots.available() <= 0:
            self.slots.notify_when_free(self.wakeup)  # another generation holds the slots
            return False
        return True

    async def _fetcher(self, leader: bool) -> None:
        backoff = 0.05
        while True:
            try:
                async with self.pool.acquire() as conn:
                    backoff = 0.05
                    await self._serve(conn, leader)
            except ConnectionLost as exc:
                log.warning(
                    "producer lost its connection",
                    extra={
                        "event": "producer_reconnect",
                        "queue": self.config.queue,
                        "error": str(exc),
                    },
                )
                await trio.sleep(backoff)
                backoff = min(backoff * 2, 2.0)

    async def _serve(self, conn: Connection, leader: bool) -> None:
        """One claim loop; only the ``leader`` loop polls; after a claim that found jobs it
        fetches once more one cooldown later (see the module docstring)."""
        rng = random.Random()
        next_poll = trio.current_time() if leader else math.inf
        last_fetch = -1e9
        last_full = False
        followup: float | None = None
        while True:
            wake_at = next_poll if followup is None else min(next_poll, followup)
            with trio.move_on_at(wake_at):
                await self.wakeup.wait()
            now = trio.current_time()
            if leader and now >= next_poll:
                jitter = rng.uniform(0, max(0.1 * self.config.poll_interval, 0.01))
                next_poll = now + self.config.poll_interval + jitter
            if followup is not None and now >= followup:
                followup = None
            # The cooldown spaces out fetches that found the queue drained (a burst of
            # notifications then costs one fetch); after a full fetch there is more work
            # waiting, and fetching again as soon as slots free up is what keeps workers busy.
            if not last_full and now < last_fetch + self.config.cooldown:
                await trio.sleep_until(last_fetch + self.config.cooldown)
            if not await self._has_room():
                continue
            limit = min(self.free_slots(), self.config.claim_limit)
            try:
                jobs = await self._claim(conn, limit)
            except ConnectionLost:
                raise
            except DatabaseError as exc:
                # One failed claim is not fatal: log it and try again at the next poll.
                log.warning(
                    "claim failed",
                    extra={"event": "claim_failed", "queue": self.config.queue, "error": str(exc)},
                )
                jobs = []
            last_fetch = trio.current_time()
            last_full = len(jobs) >= limit
            if last_full:
                if self.free_slots() > 0:
                    self.wakeup.set()  # the claim was capped, not the room: fetch again now
                else:
                    self._fetch_when_free = True
            elif jobs:
                followup = last_fetch + self.config.cooldown
            for job in jobs:
                self._start_job(job)

    async def _claim(self, conn: Connection, limit: int) -> list[Job]:
        # Reserve the slots before the round trip: another generation's producer may claim at
        # the same time, and the sum must never pass the process's bound.
        self.slots.take(limit)
        self.running += limit
        self.fetches += 1
        # Carry the plain completions waiting in the completer: one round trip for both.
        carried = self.completer.take_plain(self.config.carry_limit)
        rows = []
        self._in_flight += 1
        started = trio.current_time()
        try:
            with trio.move_on_after(self.config.claim_timeout, shield=True) as timer:
                rows = await conn.fetch(
                    _CLAIM,
                    self.config.queue,
                    limit,
                    self.config.client_id,
                    None,
                    carried,
                    self._filter_key,
                    self._filter_values,
                )
        except BaseException:
            self.completer.return_plain(carried)
            raise
        finally:
            self._in_flight -= 1
            unused = limit - len(rows)
            self.running -= unused
            self.slots.give_back(unused)
            if unused and self._fetch_when_free:
                # Another loop found no room while this claim held the reservation (and
                # consumed a wake-up meant for an insert): the room is back, so fetch again.
                self._fetch_when_free = False
                self.wakeup.set()
        if carried:
            if timer.cancelled_caught:  # the statement was cancelled: nothing was written
                self.completer.return_plain(carried)
            else:
                self.completer.plain_written(carried)
        self.claimed += len(rows)
        self.observer.claimed(trio.current_time() - started)
        return [Job.from_record(r) for r in rows]
