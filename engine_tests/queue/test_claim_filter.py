"""The producer's args filter: a generation claims only the jobs its filter lets through."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any, ClassVar

import attrs
import pytest
import trio

from engine.db.database import Database
from engine.queue import Job, JobState, QueueClient, Workers, open_queue
from engine.queue.config import QueueConfig
from engine.queue.generation import Generation, GenerationConfig
from engine.queue.insert import insert_many, prepare

DEADLINE = 10.0


@attrs.frozen
class Routed:
    """Args with an optional routing key; ``None`` is stored as JSON null."""

    kind: ClassVar[str] = "routed"
    n: int
    model: str | None = None


class Ran:
    """Which client claimed each job, by job id."""

    def __init__(self) -> None:
        self.by: dict[int, str] = {}

    async def handle(self, job: Job, _args: Routed) -> None:
        self.by[job.id] = job.attempted_by[-1]


@pytest.fixture
async def queue(database: Database) -> AsyncIterator[tuple[QueueClient, Ran]]:
    ran = Ran()
    workers = Workers()
    workers.register(Routed, ran.handle)
    config = QueueConfig(fetch_poll_interval=0.2, completer_tick=0.01)
    async with open_queue(database, config, workers=workers, stop_timeout=2) as client:
        yield client, ran


def generation(
    client: QueueClient, name: str, args_filter: tuple[str, tuple[str, ...]] | None
) -> Generation:
    """A generation of 4 workers on ``default`` with ``args_filter``, not started."""
    return Generation(
        GenerationConfig.from_section(
            client.config, client_id=name, queues={"default": 4}, args_filter=args_filter
        ),
        pool=client.db.queue,
        workers=client.workers or Workers(),
        notifier=client.notifier,
        completer=client.completer,
        slots=client.slots,
        cancel_scopes=client.cancel_scopes,
    )


async def insert(client: QueueClient, args: list[Any]) -> list[int]:
    params = [prepare(a, kind="routed") for a in args]
    results = await insert_many(client.db.queue, params, client.channels.insert)
    return [r.job.id for r in results]


async def wait_completed(client: QueueClient, ids: list[int]) -> None:
    with trio.fail_after(DEADLINE):
        while True:
            states = {j.id: j.state for j in await client.list(limit=1000)}
            if all(states.get(i) is JobState.COMPLETED for i in ids):
                return
            await trio.sleep(0.02)


async def test_generations_with_disjoint_filters_each_get_exactly_their_jobs(
    queue: tuple[QueueClient, Ran],
) -> None:
    client, ran = queue
    # Jobs of a model nobody serves go in first: at the head of the queue, so every claim below
    # had to pass over them.
    nobody = await insert(client, [Routed(n, "c") for n in range(3)])
    a = await insert(client, [Routed(n, "a") for n in range(10)])
    b = await insert(client, [Routed(n, "b") for n in range(10)])
    null = await insert(client, [Routed(n) for n in range(5)])  # {"model": null}
    bare = await insert(client, [{"n": n} for n in range(5)])  # no "model" key at all
    gen_a = generation(client, "serves-a", ("model", ("a",)))
    gen_b = generation(client, "serves-b", ("model", ("b",)))
    async with trio.open_nursery() as nursery:
        await nursery.start(gen_a.run)
        await nursery.start(gen_b.run)
        await wait_completed(client, a + b + null + bare)
        gen_a.stop()
        gen_b.stop()
    assert {ran.by[i] for i in a} == {"serves-a"}
    assert {ran.by[i] for i in b} == {"serves-b"}
    assert {ran.by[i] for i in null + bare} <= {"serves-a", "serves-b"}
    # Nobody serves "c": never claimed, still available.
    assert not set(nobody) & set(ran.by)
    states = {j.id: j.state for j in await client.list(limit=1000)}
    assert {states[i] for i in nobody} == {JobState.AVAILABLE}


async def test_without_a_filter_a_generation_claims_every_job(
    queue: tuple[QueueClient, Ran],
) -> None:
    client, ran = queue
    ids = await insert(client, [Routed(1, "a"), Routed(2, "b"), Routed(3), {"n": 4}])
    gen = generation(client, "everything", None)
    async with trio.open_nursery() as nursery:
        await nursery.start(gen.run)
        await wait_completed(client, ids)
        gen.stop()
    assert {ran.by[i] for i in ids} == {"everything"}


async def test_an_empty_value_set_claims_only_jobs_without_the_key(
    queue: tuple[QueueClient, Ran],
) -> None:
    client, ran = queue
    keyed = await insert(client, [Routed(1, "a"), Routed(2, "b")])
    plain = await insert(client, [Routed(3), {"n": 4}])
    gen = generation(client, "plain-only", ("model", ()))
    async with trio.open_nursery() as nursery:
        await nursery.start(gen.run)
        await wait_completed(client, plain)
        gen.stop()
    assert set(ran.by) == set(plain)
    states = {j.id: j.state for j in await client.list(limit=1000)}
    assert {states[i] for i in keyed} == {JobState.AVAILABLE}


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (("", ("a",)), "non-empty str"),
        (("model", "a"), "not a str"),
        (("model", ("a", 1)), "must be str"),
    ],
)
def test_a_bad_filter_is_refused(value: Any, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        GenerationConfig.from_section(
            QueueConfig(), client_id="c", queues={"default": 1}, args_filter=value
        )


def test_filter_values_are_sorted_without_repeats() -> None:
    config = GenerationConfig.from_section(
        QueueConfig(), client_id="c", queues={"default": 1}, args_filter=("model", ["b", "a", "b"])
    )
    assert config.args_filter == ("model", ("a", "b"))
