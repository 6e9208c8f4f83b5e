"""A provider that simulates an upstream API: latency, failures, lost responses, polling.

Run mode ``simulation`` always uses it, and the demo catalogue serves its models with it. Every
behaviour is drawn from a seeded RNG so runs repeat. ``submissions`` counts the submissions per
task, which is how tests and the chaos scenarios prove that no task reaches the upstream twice;
like ``cancelled``, it remembers the latest ``memory`` tasks only (100,000 by default), so a
service that runs simulation tasks for months does not grow with them.
"""

from __future__ import annotations

import collections
import random
import time
import uuid
from collections.abc import Callable
from typing import Any, Literal

import attrs
import trio

from engine.domain.tasks import Task
from engine.providers.base import AmbiguousSubmission, PollResult

__all__ = ["Latency", "SimulatedProvider", "SimulationConfig"]


@attrs.frozen
class Latency:
    """A latency distribution in seconds: ``fixed`` a; ``uniform`` a..b; ``lognormal`` with
    median a and shape b (sigma)."""

    kind: Literal["fixed", "uniform", "lognormal"] = "fixed"
    a: float = 0.0
    b: float = 0.0

    def draw(self, rng: random.Random) -> float:
        """One sample, never negative."""
        if self.kind == "fixed":
            return max(0.0, self.a)
        if self.kind == "uniform":
            return rng.uniform(self.a, self.b)
        return rng.lognormvariate(0, self.b) * self.a


@attrs.frozen
class SimulationConfig:
    """How the simulated upstream behaves."""

    prepare: Latency = Latency()
    submit: Latency = Latency()
    poll: Latency = Latency()
    finalize: Latency = Latency()
    polls: int = 1
    """Polls until the upstream reports done (the last one returns the result)."""
    poll_interval: float = 0.0
    failure_rate: float = 0.0
    """Fraction of tasks whose upstream job fails (reported by the last poll)."""
    ambiguous_rate: float = 0.0
    """Fraction of submissions whose response is lost after the upstream accepted them."""
    cpu_seconds: float = 0.0
    """CPU burnt in each of prepare and finalize (heavy phases), for load scenarios."""
    seed: int | None = None


def _burn(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def _forget_oldest(remembered: dict[Any, Any], memory: int) -> None:
    """Drop the oldest entry of ``remembered`` once it holds more than ``memory``."""
    if len(remembered) > memory:
        del remembered[next(iter(remembered))]


class SimulatedProvider:
    """The simulated upstream; see the module docstring."""

    def __init__(
        self,
        config: SimulationConfig = SimulationConfig(),
        *,
        on_submit: Callable[[Task], None] | None = None,
        memory: int = 100_000,
    ) -> None:
        self.config = config
        self.poll_interval = config.poll_interval
        self._rng = random.Random(config.seed)
        #: Submissions per task, of the latest ``memory`` tasks submitted.
        self.submissions: collections.Counter[uuid.UUID] = collections.Counter()
        #: The latest ``memory`` tasks cancelled (a dict for its order: the oldest go first).
        self.cancelled: dict[uuid.UUID, None] = {}
        self.memory = memory
        self._on_submit = on_submit
        self._polls: dict[str, int] = {}
        self._fails: set[str] = set()

    async def _wait(self, latency: Latency) -> None:
        seconds = latency.draw(self._rng)
        if seconds > 0:
            await trio.sleep(seconds)

    async def prepare(self, task: Task) -> Any:
        """Burn the configured CPU and wait the prepare latency."""
        if self.config.cpu_seconds:
            _burn(self.config.cpu_seconds)
        await self._wait(self.config.prepare)
        return {"model": task.model, "payload": task.payload}

    async def submit(self, task: Task, prepared: Any) -> str:
        """Accept the request (counted), possibly losing the response."""
        await self._wait(self.config.submit)
        self.submissions[task.id] += 1
        _forget_oldest(self.submissions, self.memory)
        if self._on_submit is not None:
            self._on_submit(task)
        ref = f"sim-{random.getrandbits(64):016x}"
        self._polls[ref] = 0
        if self._rng.random() < self.config.failure_rate:
            self._fails.add(ref)
        if self._rng.random() < self.config.ambiguous_rate:
            raise AmbiguousSubmission("simulated: the upstream's response was lost")
        return ref

    async def poll(self, task: Task, upstream_ref: str) -> PollResult:
        """Done after ``polls`` polls; a reference this process never issued (a resumed task
        from another process) is treated as accepted and finishes on its first poll."""
        await self._wait(self.config.poll)
        count = self._polls.get(upstream_ref, self.config.polls - 1) + 1
        self._polls[upstream_ref] = count
        if count < self.config.polls:
            return PollResult(False, progress=0.4 + 0.4 * count / self.config.polls)
        self._polls.pop(upstream_ref, None)
        if upstream_ref in self._fails:
            self._fails.discard(upstream_ref)
            return PollResult(True, error="simulated upstream failure")
        return PollResult(True, result={"upstream_ref": upstream_ref, "output": "simulated"})

    async def finalize(self, task: Task, result: Any) -> Any:
        """Burn the configured CPU and wait the finalize latency."""
        if self.config.cpu_seconds:
            _burn(self.config.cpu_seconds)
        await self._wait(self.config.finalize)
        return result

    async def cancel(self, task: Task, upstream_ref: str) -> None:
        """Forget the request."""
        self.cancelled[task.id] = None
        _forget_oldest(self.cancelled, self.memory)
        self._polls.pop(upstream_ref, None)
