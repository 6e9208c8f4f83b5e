"""The capacity refresher: capacity follows the catalogue and is split across instances, and a
resize swaps generations without cancelling work (§5.4, §6.1-§6.3, §10.5).

Each tick (every ``worker.refresh_interval`` seconds, and at once when a model, group or instance
changes: NOTIFY on ``engine_catalog``):

1. compute the global capacity from the enabled models and groups (§6.1);
2. register this instance (the heartbeat) and get its share of it (§6.2);
3. set the claim limit — the bound on every generation of this process together — to the share;
4. if the share changed: start a generation of that size, make it current, and let the old one
   drain in the background (``worker.drain_timeout``, then cancel). Capacity 0: no generation.

Outcomes are counted as the reference does: ``refresh_failed``, ``start_failed``, ``success``
(an unchanged share counts nothing). A failed refresh keeps the current generation.
"""

from __future__ import annotations

import logging
import time

import trio

from engine.capacity.registry import (
    Allocation,
    Registration,
    load_capacity,
    mark_draining,
    register_instance,
)
from engine.capacity.snapshot import CapacitySnapshot
from engine.config import EngineConfig
from engine.db.database import Database
from engine.db.listen import Listener
from engine.errors import DatabaseError
from engine.load.controller import LoadController
from engine.load.sampler import LoadSamplerService
from engine.metrics import Metrics
from engine.queue.client import QueueClient
from engine.queue.generation import Generation
from engine.queue.slots import SlotPool

__all__ = ["CATALOG_CHANNEL", "CapacityRefresher"]

log = logging.getLogger(__name__)

#: NOTIFY channel: the catalogue or the set of instances changed; refresh now.
CATALOG_CHANNEL = "engine_catalog"


class CapacityRefresher:
    """Keeps this instance's generation sized to its share; see the module docstring."""

    def __init__(
        self,
        config: EngineConfig,
        db: Database,
        queue: QueueClient,
        slots: SlotPool,
        *,
        load: LoadController | None = None,
        sampler: LoadSamplerService | None = None,
        metrics: Metrics | None = None,
    ) -> None:
        self.config = config
        self.db = db
        self.queue = queue
        self.slots = slots
        self.load = load
        self.sampler = sampler
        self.metrics = metrics
        self.current: Generation | None = None
        self.capacity = 0
        self.snapshot: CapacitySnapshot | None = None
        self.allocation: Allocation | None = None
        self.draining: set[Generation] = set()
        self.refreshes = 0
        self.changed = trio.Event()
        self._wake = trio.Event()
        self._nursery: trio.Nursery | None = None

    @property
    def stale_after(self) -> float:
        """Seconds without a heartbeat before an instance leaves the split (6 periods)."""
        return self.config.worker.refresh_interval * self.config.worker.heartbeat_stale_factor

    def wake(self) -> None:
        """Refresh now instead of at the next tick."""
        self._wake.set()

    async def _register(self) -> tuple[CapacitySnapshot, Allocation]:
        worker = self.config.worker
        snapshot = await load_capacity(self.db.coordination, worker.hard_limit)
        load_snapshot = None
        if self.sampler is not None:
            load_snapshot = self.sampler.sample_now()
        elif self.load is not None:
            load_snapshot = self.load.snapshot()
        registration = Registration.from_environment(
            self.queue.instance_id,
            desired_capacity=snapshot.capacity,
            capacity_limit=worker.instance_hard_limit,
            heartbeat_stale_after=self.stale_after,
            load=load_snapshot,
            load_clock_now=time.monotonic(),
        )
        first = self.allocation is None
        allocation = await register_instance(self.db.coordination, registration)
        if first or (
            self.allocation is not None
            and allocation.active_instances != self.allocation.active_instances
        ):
            # Others learn at once that the split changed (the reference only polls).
            await self.db.coordination.execute("SELECT pg_notify($1, 'instances')", CATALOG_CHANNEL)
        return snapshot, allocation

    async def refresh_once(self) -> str:
        """One tick; returns the outcome (``unchanged``, ``success``, ``refresh_failed``,
        ``start_failed``)."""
        self.refreshes += 1
        try:
            snapshot, allocation = await self._register()
        except DatabaseError as exc:
            log.warning(
                "capacity refresh failed; keeping the current generation",
                extra={"event": "capacity_refresh_failed", "error": str(exc)},
            )
            self._observe("refresh_failed")
            return "refresh_failed"
        self.snapshot, self.allocation = snapshot, allocation
        share = allocation.allocated
        # The claim limit bounds every generation together, so overlapping ones never run more
        # than the share (old jobs hold their slots until they finish).
        self.slots.total = share
        if self.load is not None:
            self.load.set_claim_limit(share)
        if self.metrics is not None:
            self.metrics.set_async_worker_capacity(
                share, snapshot.desired, snapshot.hard_limit, snapshot.capped
            )
            self.metrics.set_distributed_worker_capacity(
                allocation.active_instances, allocation.global_allocated, share
            )
        if share == self.capacity:
            return "unchanged"
        new: Generation | None = None
        if share > 0:
            try:
                new = await self.queue.start_generation({self.config.queue.name: share})
            except Exception as exc:
                log.warning(
                    "new generation failed to start; keeping the current one",
                    extra={"event": "generation_start_failed", "error": repr(exc)},
                )
                self._observe("start_failed")
                return "start_failed"
        old, self.current, self.capacity = self.current, new, share
        if old is not None:
            self._drain(old, f"resize to {share}")
        log.info(
            "capacity changed",
            extra={
                "event": "capacity_changed",
                "allocated": share,
                "desired": snapshot.desired,
                "global_allocated": allocation.global_allocated,
                "active_instances": allocation.active_instances,
                "generation": None if new is None else new.number,
            },
        )
        self._observe("success")
        self.changed.set()
        self.changed = trio.Event()
        return "success"

    def _observe(self, outcome: str) -> None:
        if self.metrics is not None:
            self.metrics.observe_resize(outcome)
            self.metrics.set_generations(len(self.queue.generations))

    def _drain(self, generation: Generation, reason: str) -> None:
        assert self._nursery is not None
        self.draining.add(generation)
        self._nursery.start_soon(self._drain_one, generation, reason)

    async def _drain_one(self, generation: Generation, reason: str) -> None:
        generation.stop(f"draining: {reason}")
        with trio.move_on_after(self.config.worker.drain_timeout):
            await generation.stopped.wait()
        generation.stop_and_cancel(f"drain timed out: {reason}")
        await generation.stopped.wait()
        self.draining.discard(generation)
        if self.metrics is not None:
            self.metrics.set_generations(len(self.queue.generations))

    async def shutdown(self) -> None:
        """Mark this instance draining (5 s) and stop-and-cancel every generation (10 s each),
        all shielded: interrupted tasks are requeued so others take them at once (§5.5)."""
        worker = self.config.worker
        with trio.move_on_after(worker.mark_draining_timeout, shield=True):
            try:
                if await mark_draining(self.db.coordination, self.queue.instance_id):
                    await self.db.coordination.execute(
                        "SELECT pg_notify($1, 'instances')", CATALOG_CHANNEL
                    )
            except DatabaseError as exc:
                log.warning(
                    "could not mark the instance draining",
                    extra={"event": "mark_draining_failed", "error": str(exc)},
                )
        generations = [g for g in (self.current, *self.draining) if g is not None]
        self.current = None
        for generation in generations:
            generation.stop_and_cancel("shutdown")
            with trio.move_on_after(worker.stop_timeout, shield=True):
                await generation.stopped.wait()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Refresh until cancelled; ``started()`` after the first refresh (the instance is
        registered and its first generation, if any, is fetching)."""
        listener = Listener(self.db.coordination.dsn, [CATALOG_CHANNEL])
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                await nursery.start(listener.run)
                nursery.start_soon(self._forward, listener)
                await self.refresh_once()
                task_status.started()
                while True:
                    with trio.move_on_after(self.config.worker.refresh_interval):
                        await self._wake.wait()
                    self._wake = trio.Event()
                    await self.refresh_once()
        finally:
            with trio.CancelScope(shield=True):
                await self.shutdown()

    async def _forward(self, listener: Listener) -> None:
        async for _note in listener.receive:
            self.wake()
