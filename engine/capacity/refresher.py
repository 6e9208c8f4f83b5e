"""The capacity refresher: capacity follows the catalogue and is split across instances, and a
resize swaps generations without cancelling work.

Each tick (every ``worker.refresh_interval`` seconds, and at once when a model, group or instance
changes: NOTIFY on ``engine_catalog``):

1. compute the global capacity from the enabled models and groups;
2. register this instance (the heartbeat) and get its share of it;
3. set the claim limit — the bound on every generation of this process together — to the share;
4. if the share changed: the room (:class:`~engine.capacity.room.GenerationRoom`, which the
   refresher runs and owns) starts a generation of that size, makes it current, and lets the old
   one drain in the background (``worker.drain_timeout``, then cancel). Capacity 0: no
   generation.

At shutdown (or when the refresher itself crashes) it marks the instance draining, so the others
take its share at once, and closes the room by the shutdown policy (drain, then requeue).

Outcomes are counted as ``refresh_failed``, ``start_failed``, ``success``
(an unchanged share counts nothing). A failed refresh keeps the current generation.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import trio

from engine.capacity.config import WorkerConfig
from engine.capacity.observe import QUIET, CapacityObserver
from engine.capacity.registry import (
    Allocation,
    Registration,
    load_capacity,
    mark_draining,
    register_instance,
)
from engine.capacity.room import GenerationRoom, ShutdownPolicy
from engine.capacity.snapshot import CapacitySnapshot
from engine.db.channels import CATALOG
from engine.db.database import Database
from engine.db.listen import ListenHub, wakeup
from engine.db.sqlfiles import QUERIES
from engine.errors import DatabaseError
from engine.load.controller import LoadController
from engine.load.sampler import LoadSamplerService
from engine.queue.client import QueueClient
from engine.queue.generation import MAX_WORKERS
from engine.queue.slots import SlotPool

__all__ = ["FAILURES_NOT_READY", "CapacityRefresher"]

_NOTIFY_INSTANCES = "SELECT pg_notify($1, 'instances')"
_REACTIVATE = QUERIES["worker_instance_reactivate"]

log = logging.getLogger(__name__)

#: Failed refreshes in a row after which the instance reports itself not ready: one failure is
#: a blip (the current generation keeps running), three mean the share is no longer known.
FAILURES_NOT_READY = 3


class CapacityRefresher:
    """Keeps this instance's generation sized to its share; see the module docstring.

    Made afresh for every (re)start: a refresher restarted after a crash re-registers the
    instance as active, with no generation left over from the one that crashed.
    """

    def __init__(
        self,
        worker: WorkerConfig,
        db: Database,
        queue: QueueClient,
        slots: SlotPool,
        *,
        policy: ShutdownPolicy,
        load: LoadController | None = None,
        sampler: LoadSamplerService | None = None,
        observer: CapacityObserver = QUIET,
        args_filter: tuple[str, tuple[str, ...]] | None = None,
        models: tuple[str, ...] | None = None,
        on_state: Callable[[str, bool], None] | None = None,
        hub: ListenHub | None = None,
    ) -> None:
        """``on_state(condition, ok)`` after every refresh, for readiness: ``capacity_refresh``
        is false after :data:`FAILURES_NOT_READY` failed refreshes in a row, ``generation``
        while this instance has a share but no generation running it. ``hub``: the process's
        LISTEN connection, whose ``engine_catalog`` wakes a refresh (None: ticks only).
        ``observer`` is told of every share, split, resize and change of generations
        (:mod:`engine.capacity.observe`; nothing observes the refresher without one)."""
        self.hub = hub
        self.worker = worker
        self.db = db
        self.queue = queue
        self.slots = slots
        self.policy = policy
        self.load = load
        self.sampler = sampler
        self.observer = observer
        self.models = models
        self.room = GenerationRoom(
            queue,
            queue.config.name,
            resize_drain_timeout=worker.drain_timeout,
            args_filter=args_filter,
            on_change=self._generations_changed,
        )
        self.snapshot: CapacitySnapshot | None = None
        self.allocation: Allocation | None = None
        self.refreshes = 0
        self.on_state = on_state
        self._failures = 0
        self.changed = trio.Event()
        self._wake = trio.Event()

    @property
    def capacity(self) -> int:
        """The share this process runs now."""
        return self.room.capacity

    @property
    def stale_after(self) -> float:
        """Seconds without a heartbeat before an instance leaves the split (6 periods)."""
        return self.worker.refresh_interval * self.worker.heartbeat_stale_factor

    def wake(self) -> None:
        """Refresh now instead of at the next tick."""
        self._wake.set()

    async def _register(self) -> tuple[CapacitySnapshot, Allocation]:
        worker = self.worker
        snapshot = await load_capacity(self.db.coordination, worker.hard_limit)
        load_snapshot = None
        if self.sampler is not None:
            load_snapshot = self.sampler.sample_now()
        elif self.load is not None:
            load_snapshot = self.load.snapshot()
        registration = Registration.from_environment(
            self.queue.instance_id,
            desired_capacity=snapshot.capacity,
            # No share beyond what one generation can run, whatever the cluster-wide cap.
            capacity_limit=min(worker.instance_hard_limit or MAX_WORKERS, MAX_WORKERS),
            heartbeat_stale_after=self.stale_after,
            load=load_snapshot,
            load_clock_now=time.monotonic(),
            models=self.models,
        )
        first = self.allocation is None
        allocation = await register_instance(self.db.coordination, registration)
        if first or (
            self.allocation is not None
            and allocation.active_instances != self.allocation.active_instances
        ):
            # Others learn at once that the split changed (else they wait for their next tick).
            await self.db.coordination.execute(_NOTIFY_INSTANCES, CATALOG)
        return snapshot, allocation

    async def refresh_once(self) -> str:
        """One tick; returns the outcome (``unchanged``, ``success``, ``refresh_failed``,
        ``start_failed``), also reported to ``on_state``."""
        outcome = await self._refresh()
        self._failures = self._failures + 1 if outcome == "refresh_failed" else 0
        if self.on_state is not None:
            self.on_state("capacity_refresh", self._failures < FAILURES_NOT_READY)
            share = 0 if self.allocation is None else self.allocation.allocated
            current = self.room.current
            running = current is not None and not current.stopped.is_set()
            self.on_state("generation", share == 0 or running)
        return outcome

    async def _refresh(self) -> str:
        self.refreshes += 1
        try:
            snapshot, allocation = await self._register()
        except DatabaseError as exc:
            log.warning(
                "capacity refresh failed; keeping the current generation",
                extra={"event": "capacity_refresh_failed", "error": str(exc)},
            )
            self.observer.resized("refresh_failed")
            return "refresh_failed"
        self.snapshot, self.allocation = snapshot, allocation
        share = allocation.allocated
        # The claim limit bounds every generation together, so overlapping ones never run more
        # than the share (old jobs hold their slots until they finish).
        self.slots.total = share
        if self.load is not None:
            self.load.set_claim_limit(share)
        self.observer.capacity_changed(
            share, snapshot.desired, snapshot.hard_limit, snapshot.capped
        )
        self.observer.cluster_changed(allocation.active_instances, allocation.global_allocated)
        outcome = await self.room.resize(share)
        if outcome == "unchanged":
            return outcome
        if outcome == "start_failed":
            self.observer.resized(outcome)
            return outcome
        current = self.room.current
        log.info(
            "capacity changed",
            extra={
                "event": "capacity_changed",
                "allocated": share,
                "desired": snapshot.desired,
                "global_allocated": allocation.global_allocated,
                "active_instances": allocation.active_instances,
                "generation": None if current is None else current.number,
            },
        )
        self.observer.resized("success")
        self.changed.set()
        self.changed = trio.Event()
        return "success"

    def _generations_changed(self) -> None:
        self.observer.generations_changed(len(self.room.generations))

    async def _mark_draining(self) -> None:
        """Take this instance out of the split (shielded, ``worker.mark_draining_timeout``);
        the others are told through NOTIFY and take its share at once."""
        with trio.move_on_after(self.worker.mark_draining_timeout, shield=True):
            try:
                if await mark_draining(self.db.coordination, self.queue.instance_id):
                    await self.db.coordination.execute(_NOTIFY_INSTANCES, CATALOG)
            except DatabaseError as exc:
                log.warning(
                    "could not mark the instance draining",
                    extra={"event": "mark_draining_failed", "error": str(exc)},
                )

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Refresh until cancelled; ``started()`` after the first refresh (the instance is
        registered and its first generation, if any, is fetching). On the way out, by
        cancellation or a crash, the instance is marked draining and the room closed by the
        shutdown policy."""
        async with trio.open_nursery() as nursery:
            await nursery.start(self.room.run)
            try:
                await nursery.start(self._forward)
                await self.db.coordination.execute(_REACTIVATE, self.queue.instance_id)
                await self.refresh_once()
                task_status.started()
                while True:
                    with trio.move_on_after(self.worker.refresh_interval):
                        await self._wake.wait()
                    self._wake = trio.Event()
                    await self.refresh_once()
            finally:
                with trio.CancelScope(shield=True):
                    await self._mark_draining()
                    await self.room.close(self.policy)
                nursery.cancel_scope.cancel(reason="capacity refresher stopped")

    async def _forward(self, *, task_status: trio.TaskStatus[None]) -> None:
        """Wake a refresh on every ``engine_catalog`` notification (and after a reconnect of
        the hub); ``started()`` once subscribed."""
        with wakeup(self.hub, CATALOG) as catalog:
            task_status.started()
            while True:
                await catalog.wait()
                self.wake()
