"""The generation room: the one owner of this process's worker generations.

A capacity source (:class:`~engine.capacity.refresher.CapacityRefresher`, which follows the
registry's share, or :class:`~engine.capacity.fixed.FixedCapacity`) decides how many jobs this
process runs; the room turns that number into generations and runs them in its own nursery::

    room (shielded from outside cancels: it stops only by the shutdown policy)
    ├── generation N      current: claims up to the share
    └── generation N-1    draining after a resize (up to worker.drain_timeout, then cancelled)

A resize starts the new generation *before* the old one drains, so work in flight is never
cancelled by a resize; the process-wide slot bound (:class:`~engine.queue.slots.SlotPool`) keeps
old and new together within the share.

Shutdown (:meth:`GenerationRoom.close`) is one policy for every way a process stops: no
generation claims any more; running tasks get ``drain_timeout`` seconds to finish; what still
runs then is cancelled, and each interrupted task is requeued (a task already submitted upstream
keeps its upstream reference, so the next run resumes polling). :meth:`ShutdownPolicy.hurry`
ends the drain at once (the service's second signal).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import attrs
import trio

from engine.queue.client import QueueClient
from engine.queue.generation import Generation

__all__ = ["GenerationRoom", "ShutdownPolicy"]

log = logging.getLogger(__name__)


@attrs.define
class ShutdownPolicy:
    """How generations stop when the process stops.

    Attributes:
        drain_timeout: seconds running jobs get to finish (``worker.shutdown_drain_timeout``).
        stop_timeout: seconds cancelled jobs get to record their outcome
            (``worker.stop_timeout``); past it the room stops waiting for them.
        hurried: set to end a drain at once (see :meth:`hurry`).
    """

    drain_timeout: float
    stop_timeout: float
    hurried: trio.Event = attrs.field(factory=trio.Event)

    def hurry(self) -> None:
        """End the drain now: what still runs is requeued at once."""
        self.hurried.set()


class GenerationRoom:
    """Runs this process's generations for one queue; see the module docstring."""

    def __init__(
        self,
        queue: QueueClient,
        queue_name: str,
        *,
        resize_drain_timeout: float = 3600.0,
        args_filter: tuple[str, tuple[str, ...]] | None = None,
        on_change: Callable[[], None] | None = None,
    ) -> None:
        self.queue = queue
        self.queue_name = queue_name
        #: Seconds a generation replaced by a resize may finish its jobs before they are
        #: cancelled (``worker.drain_timeout``, 1 h by default).
        self.resize_drain_timeout = resize_drain_timeout
        self.args_filter = args_filter
        #: Called whenever the set of generations changes (metrics).
        self.on_change = on_change
        #: The generation that claims; None while the capacity is 0.
        self.current: Generation | None = None
        #: Its size: the number of jobs this process may run.
        self.capacity = 0
        #: Generations replaced by a resize that still finish their jobs.
        self.draining: set[Generation] = set()
        self._scope = trio.CancelScope(shield=True)
        self._nursery: trio.Nursery | None = None
        self._closed = trio.Event()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Hold the generations' nursery until :meth:`close` has stopped them all.

        Shielded from outside cancellation, so a stop runs the shutdown policy instead of
        cancelling running jobs outright; the capacity source calls :meth:`close` from its
        ``finally``.
        """
        with self._scope:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                task_status.started()
                await self._closed.wait()
        self._nursery = None

    async def resize(self, share: int) -> str:
        """Make ``share`` the number of jobs this process runs; returns the outcome
        (``unchanged``, ``success``, ``start_failed``). Raising starts a new generation, then
        the old one drains; 0 leaves no generation claiming."""
        if share == self.capacity:
            return "unchanged"
        if self._nursery is None:
            raise RuntimeError("resize needs the room running (await nursery.start(room.run))")
        new: Generation | None = None
        if share > 0:
            try:
                new = self.queue.make_generation(
                    {self.queue_name: share}, args_filter=self.args_filter
                )
                await self._nursery.start(new.run)
            except Exception as exc:
                log.warning(
                    "new generation failed to start; keeping the current one",
                    extra={"event": "generation_start_failed", "error": repr(exc)},
                )
                return "start_failed"
        old, self.current, self.capacity = self.current, new, share
        if old is not None:
            self.draining.add(old)
            self._nursery.start_soon(self._drain_one, old, f"resize to {share}")
        self._changed()
        return "success"

    async def _drain_one(self, generation: Generation, reason: str) -> None:
        generation.stop(f"draining: {reason}")
        with trio.move_on_after(self.resize_drain_timeout):
            await generation.stopped.wait()
        generation.stop_and_cancel(f"drain timed out: {reason}")
        await generation.stopped.wait()
        self.draining.discard(generation)
        self._changed()

    def _changed(self) -> None:
        if self.on_change is not None:
            self.on_change()

    @property
    def generations(self) -> list[Generation]:
        """Every generation that still runs: the current one first."""
        return [g for g in (self.current, *self.draining) if g is not None]

    async def close(self, policy: ShutdownPolicy, reason: str = "shutdown") -> None:
        """Stop every generation by ``policy`` and end :meth:`run`. Shielded and bounded:
        ``policy.drain_timeout`` plus ``policy.stop_timeout`` at most."""
        generations = self.generations
        self.current, self.capacity = None, 0
        with trio.CancelScope(shield=True):
            for generation in generations:
                generation.stop(f"{reason}: draining")
            if generations:
                log.info(
                    "draining running jobs",
                    extra={
                        "event": "shutdown_draining",
                        "running": sum(g.running for g in generations),
                        "drain_timeout": policy.drain_timeout,
                    },
                )
            with trio.move_on_after(policy.drain_timeout):
                await _first_of(policy.hurried, generations)
            for generation in generations:
                generation.stop_and_cancel(f"{reason}: requeued")
            with trio.move_on_after(policy.stop_timeout):
                for generation in generations:
                    await generation.stopped.wait()
            if not all(g.stopped.is_set() for g in generations):
                log.error(
                    "generations did not stop in time; cancelling them outright",
                    extra={"event": "shutdown_stop_timeout", "stop_timeout": policy.stop_timeout},
                )
                self._scope.cancel(reason=f"{reason}: stop timed out")
        self._closed.set()


async def _first_of(hurried: trio.Event, generations: list[Generation]) -> None:
    """Return once every generation has stopped, or ``hurried`` is set."""
    async with trio.open_nursery() as nursery:

        async def all_stopped() -> None:
            for generation in generations:
                await generation.stopped.wait()
            nursery.cancel_scope.cancel()

        async def hurry() -> None:
            await hurried.wait()
            nursery.cancel_scope.cancel()

        nursery.start_soon(all_stopped)
        nursery.start_soon(hurry)
