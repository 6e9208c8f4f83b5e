"""The producer: claims jobs of one queue for one generation and starts them (§4.2).

It never claims more than its free slots (``max_workers`` minus running, and the process-wide
:class:`~engine.queue.slots.SlotPool`), all in one statement (``FOR UPDATE SKIP LOCKED``).
It fetches when woken by an insert NOTIFY, by a poll timer with jitter (the fallback when
notifications are lost, e.g. behind PgBouncer), and when slots free up after a fetch came back
full or was skipped for lack of room. Fetches are at least ``cooldown`` apart; after a fetch that
found jobs it fetches once more after the cooldown, catching inserts whose NOTIFY the insert
side's rate limiter held back.

The claim runs shielded with a deadline: a claim the server committed but we never read would
leave jobs running with no one working them.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Awaitable, Callable

import attrs
import trio

from engine.db.bridge import Connection, Pool
from engine.db.sqlfiles import QUERIES
from engine.errors import ConnectionLost, DatabaseError
from engine.queue.job import Job
from engine.queue.notifier import Wakeup
from engine.queue.slots import SlotPool

__all__ = ["Producer", "ProducerConfig"]

log = logging.getLogger(__name__)

_CLAIM = QUERIES["job_get_available"]
_QUEUE_UPSERT = QUERIES["queue_upsert"]


@attrs.frozen
class ProducerConfig:
    """How one producer fetches."""

    queue: str
    max_workers: int
    client_id: str
    cooldown: float = 0.005
    poll_interval: float = 1.0
    claim_timeout: float = 10.0


class Producer:
    """Claims and starts jobs for one queue; see the module docstring."""

    def __init__(
        self,
        config: ProducerConfig,
        pool: Pool,
        wakeup: Wakeup,
        slots: SlotPool,
        start_job: Callable[[Job], Awaitable[None]],
        wait_for_room: Callable[[], Awaitable[None]],
    ) -> None:
        self.config = config
        self.pool = pool
        self.wakeup = wakeup
        self.slots = slots
        self._start_job = start_job
        self._wait_for_room = wait_for_room
        self.running = 0
        self.claimed = 0
        self.fetches = 0
        self._fetch_when_free = False

    def free_slots(self) -> int:
        """How many jobs this producer may claim now."""
        return max(0, min(self.config.max_workers - self.running, self.slots.available()))

    def job_finished(self) -> None:
        """Bookkeeping when one of our jobs is done (called by the generation)."""
        self.running -= 1
        self.slots.give_back(1)
        if self._fetch_when_free:
            self._fetch_when_free = False
            self.wakeup.set()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Fetch until cancelled (the generation's fetch scope); ``started()`` once registered.

        Holds one pooled connection for its claims (``dependencies.md``: a held connection
        answers in ~290 µs, a fresh acquire in ~720 µs); a lost connection is replaced.
        """
        await self.pool.execute(_QUEUE_UPSERT, self.config.queue)
        task_status.started()
        backoff = 0.05
        with self.slots.waiting(self.wakeup):
            while True:
                try:
                    async with self.pool.acquire() as conn:
                        backoff = 0.05
                        await self._serve(conn)
                except ConnectionLost as exc:
                    log.warning(
                        "producer lost its connection",
                        extra={"event": "producer_reconnect", "queue": self.config.queue,
                               "error": str(exc)},
                    )
                    await trio.sleep(backoff)
                    backoff = min(backoff * 2, 2.0)

    async def _serve(self, conn: Connection) -> None:
        rng = random.Random()
        next_poll = trio.current_time()
        last_fetch = -1e9
        followup: float | None = None
        while True:
            wake_at = next_poll if followup is None else min(next_poll, followup)
            with trio.move_on_at(wake_at):
                await self.wakeup.wait()
            now = trio.current_time()
            if now >= next_poll:
                jitter = rng.uniform(0, max(0.1 * self.config.poll_interval, 0.01))
                next_poll = now + self.config.poll_interval + jitter
            if followup is not None and now >= followup:
                followup = None
            if now < last_fetch + self.config.cooldown:
                await trio.sleep_until(last_fetch + self.config.cooldown)
            limit = self.free_slots()
            if limit <= 0:
                self._fetch_when_free = True
                continue
            await self._wait_for_room()
            limit = self.free_slots()
            if limit <= 0:
                self._fetch_when_free = True
                continue
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
            if len(jobs) >= limit:
                self._fetch_when_free = True
            elif jobs:
                followup = last_fetch + self.config.cooldown
            for job in jobs:
                await self._start_job(job)

    async def _claim(self, conn: Connection, limit: int) -> list[Job]:
        # Reserve the slots before the round trip: another generation's producer may claim at
        # the same time, and the sum must never pass the process's bound.
        self.slots.take(limit)
        self.running += limit
        self.fetches += 1
        rows = []
        try:
            with trio.move_on_after(self.config.claim_timeout, shield=True):
                rows = await conn.fetch(_CLAIM, self.config.queue, limit, self.config.client_id, None)
        finally:
            unused = limit - len(rows)
            self.running -= unused
            self.slots.give_back(unused)
        self.claimed += len(rows)
        return [Job.from_record(r) for r in rows]
