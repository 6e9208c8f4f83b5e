"""The queue's observer is handed over when the client is built, so it sees the first claim
and the first completion batch."""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

import attrs
import trio

from engine.db.database import Database
from engine.queue import Job, JobState, Workers
from engine.queue.client import make_queue_client
from engine.queue.config import QueueConfig
from engine.queue.executor import Completion
from engine.queue.observe import QueueObserver


@attrs.frozen
class Noop:
    kind: ClassVar[str] = "noop"
    n: int


class Recording:
    """A queue observer that keeps every event, and their order."""

    def __init__(self) -> None:
        self.order: list[str] = []
        self.claims: list[float] = []
        self.batches: list[tuple[list[tuple[int, JobState]], float | None]] = []

    def claimed(self, seconds: float) -> None:
        self.order.append("claimed")
        self.claims.append(seconds)

    def completions_flushed(self, batch: Sequence[Completion], seconds: float | None) -> None:
        self.order.append("flushed")
        self.batches.append(([(c.job_id, c.state) for c in batch], seconds))

    def written(self) -> list[tuple[int, JobState]]:
        return [item for batch, _ in self.batches for item in batch]


async def test_a_queue_built_with_an_observer_reports_its_first_claim_and_batch(
    database: Database,
) -> None:
    recording = Recording()
    observer: QueueObserver = recording
    workers = Workers()

    async def handle(job: Job, args: Noop) -> None:
        return None

    workers.register(Noop, handle)
    config = QueueConfig(fetch_poll_interval=0.2, completer_tick=0.01)
    client = await make_queue_client(database, config, workers=workers, observer=observer)
    # In before anything runs: the generation's very first claim takes it.
    job = (await client.insert(Noop(1))).job
    async with trio.open_nursery() as services:
        await services.start(client.run_completer)
        try:
            await services.start(client.run_notifier)
            generation = client.make_generation({"default": 2})
            async with trio.open_nursery() as generations:
                await generations.start(generation.run)
                try:
                    with trio.fail_after(10):
                        while not recording.written():
                            await trio.sleep(0.01)
                finally:
                    generation.stop_and_cancel("test over")
        finally:
            # The completer is shielded: it ends once closed, whatever ended the test.
            with trio.CancelScope(shield=True):
                await client.close_completer()
            services.cancel_scope.cancel()

    # The first event is the claim that took the job, timed like every claim.
    assert recording.order[0] == "claimed"
    assert all(seconds >= 0 for seconds in recording.claims)
    # The first batch written is the job's outcome, reported once (by the completer, timed, or
    # carried by a later claim, untimed).
    assert recording.written() == [(job.id, JobState.COMPLETED)]
