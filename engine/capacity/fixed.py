"""A fixed capacity: one generation of a set size, no registry (``worker.capacity = "fixed"``).

For an app that runs alone and wants no instance registry: the same seam as the
:class:`~engine.capacity.refresher.CapacityRefresher` (a service that owns a
:class:`~engine.capacity.room.GenerationRoom`), with a size taken from configuration instead of
a share of the catalogue's capacity. Nothing registers, so other instances' recovery sees no
heartbeat of this one: run a fixed instance only where no registry instance shares the database,
or keep ``recovery.stale_after`` above the longest run (its leases still fence every task).
"""

from __future__ import annotations

from collections.abc import Callable

import trio

from engine.capacity.room import GenerationRoom, ShutdownPolicy
from engine.load.controller import LoadController
from engine.queue.client import QueueClient
from engine.queue.generation import MAX_WORKERS

__all__ = ["FixedCapacity"]


class FixedCapacity:
    """Runs one generation of ``size`` until cancelled, then closes it by ``policy``."""

    def __init__(
        self,
        queue: QueueClient,
        queue_name: str,
        size: int,
        *,
        policy: ShutdownPolicy,
        load: LoadController | None = None,
        args_filter: tuple[str, tuple[str, ...]] | None = None,
        on_change: Callable[[], None] | None = None,
    ) -> None:
        if not 1 <= size <= MAX_WORKERS:
            raise ValueError(f"a fixed capacity must be 1..{MAX_WORKERS} jobs, got {size}")
        self.room = GenerationRoom(queue, queue_name, args_filter=args_filter, on_change=on_change)
        self.size = size
        self.slots = queue.slots
        self.policy = policy
        self.load = load

    @property
    def capacity(self) -> int:
        """The jobs this process runs now (``size`` once started)."""
        return self.room.capacity

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Start the generation; ``started()`` once it is fetching. Only returns when
        cancelled (after the shutdown policy ran)."""
        async with trio.open_nursery() as nursery:
            await nursery.start(self.room.run)
            try:
                self.slots.total = self.size
                if self.load is not None:
                    self.load.set_claim_limit(self.size)
                if await self.room.resize(self.size) == "start_failed":
                    raise RuntimeError(f"the generation of {self.size} jobs could not start")
                task_status.started()
                await trio.sleep_forever()
            finally:
                await self.room.close(self.policy)
