"""The HTTP kit in a running engine, on a real database, against the fake upstream on loopback.

What the runner does with the kit's answers: an ambiguous submission is submitted again with
the same idempotency key when the model declares one (one job upstream, the task succeeds) and
goes to manual review when it does not (one job upstream, a human decides); a request that
never reached the upstream is sent again; a 429 storm holds the model back instead of failing
its tasks.
"""

from __future__ import annotations

import socket
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
import pytest
import trio

from engine.db.database import DatabaseUrls
from engine.domain.tasks import RunMode, Task, TaskStatus
from engine.providers.http.fake import FakeUpstream, fake_http_model, serve_upstream
from engine.providers.http.provider import HttpProvider
from engine.service.engine import Engine
from engine.service.root import open as open_engine
from engine.tasks.jobs import TaskRunArgs
from engine_tests.providers.http.conftest import Served
from engine_tests.tasks.conftest import make_config, request

MODEL = "fake-model"


@asynccontextmanager
async def http_engine(db_url: str, provider: HttpProvider) -> AsyncIterator[Engine]:
    """An engine serving MODEL with ``provider``, with short resubmission backoffs."""
    config = make_config(**{"worker.hard_limit": 16})
    async with (
        provider,
        open_engine(config, urls=DatabaseUrls.single(db_url), providers={MODEL: provider}) as eng,
    ):
        await eng.set_model(MODEL)
        eng.runner.resubmit_backoff = 0.05
        yield eng


async def run_one(eng: Engine, **payload: Any) -> Task:
    task_id = await eng.submit(
        request(model=MODEL, run_mode=RunMode.LIVE, payload=payload or {"prompt": "a cat"})
    )
    return await eng.wait(task_id, timeout=30)


async def event_types(eng: Engine, task_id: uuid.UUID) -> list[str]:
    return [e.type for e in await eng.events(task_id)]


async def wait_for_event(eng: Engine, task_id: uuid.UUID, kind: str) -> None:
    with trio.fail_after(15):
        while kind not in await event_types(eng, task_id):
            await trio.sleep(0.05)  # events are written in batches


# ---- idempotent resubmission -----------------------------------------------------------------


@pytest.mark.parametrize("drop_mode", ["reset", "hang"])
async def test_accept_then_drop_with_an_idempotency_key_succeeds_with_one_job(
    db_url: str, upstream: Served, drop_mode: str
) -> None:
    upstream.fake.dials.drop_next, upstream.fake.dials.drop_mode = 1, drop_mode
    provider = HttpProvider(fake_http_model(upstream.url, idempotent=True, read_timeout=0.5))
    async with http_engine(db_url, provider) as eng:
        task = await run_one(eng)
        events = await event_types(eng, task.id)
    assert task.status is TaskStatus.SUCCEEDED, task.error
    assert len(upstream.fake.accepted) == 1  # the ledger: one job upstream
    assert upstream.fake.accepted[0].idempotency_key == str(task.id)
    assert [(r.status, r.replayed) for r in upstream.fake.received] == [(0, False), (200, True)]
    assert task.upstream_ref == "job-1"
    assert "task.resubmitting" in events and "task.manual_review" not in events


@pytest.mark.parametrize("drop_mode", ["reset", "hang"])
async def test_accept_then_drop_without_a_key_goes_to_manual_review_with_one_job(
    db_url: str, upstream: Served, drop_mode: str
) -> None:
    upstream.fake.dials.drop_next, upstream.fake.dials.drop_mode = 1, drop_mode
    provider = HttpProvider(fake_http_model(upstream.url, read_timeout=0.5))
    async with http_engine(db_url, provider) as eng:
        task = await run_one(eng)
        events = await event_types(eng, task.id)
    assert task.status is TaskStatus.MANUAL_REVIEW
    assert task.error["code"] == "ambiguous_submission"
    assert len(upstream.fake.accepted) == 1 and len(upstream.fake.received) == 1
    assert "task.resubmitting" not in events


async def test_a_5xx_after_accepting_is_resubmitted_on_an_idempotent_model(
    db_url: str, upstream: Served
) -> None:
    upstream.fake.dials.error_after_accept_next = 1
    provider = HttpProvider(fake_http_model(upstream.url, idempotent=True))
    async with http_engine(db_url, provider) as eng:
        task = await run_one(eng)
    assert task.status is TaskStatus.SUCCEEDED
    assert len(upstream.fake.accepted) == 1


async def test_resubmissions_are_bounded_then_manual_review(db_url: str, upstream: Served) -> None:
    upstream.fake.dials.error_next = 100  # every submit: a 500
    provider = HttpProvider(fake_http_model(upstream.url, idempotent=True))
    async with http_engine(db_url, provider) as eng:
        eng.runner.ambiguous_resubmits = 2
        task = await run_one(eng)
    assert task.status is TaskStatus.MANUAL_REVIEW
    assert task.error == {
        "code": "ambiguous_submission",
        "message": "the upstream's answer says nothing certain (HTTP 500: internal error)",
    }
    assert len(upstream.fake.received) == 3  # the first submission and two more


# ---- not submitted: safe to send again -----------------------------------------------------------


@pytest.fixture
def unlistened() -> Iterator[socket.socket]:
    """A bound loopback socket that does not listen yet: connections to it are refused."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    try:
        yield sock
    finally:
        sock.close()


async def test_a_refused_connection_is_sent_again_once_the_upstream_listens(
    db_url: str, unlistened: socket.socket
) -> None:
    port = unlistened.getsockname()[1]
    fake = FakeUpstream()
    provider = HttpProvider(fake_http_model(f"http://127.0.0.1:{port}"))
    async with http_engine(db_url, provider) as eng:
        task_id = await eng.submit(request(model=MODEL, run_mode=RunMode.LIVE, payload={}))
        await wait_for_event(eng, task_id, "task.not_submitted")
        async with serve_upstream(fake, sock=unlistened):
            task = await eng.wait(task_id, timeout=30)
    assert task.status is TaskStatus.SUCCEEDED, task.error
    assert len(fake.accepted) == 1


async def test_not_submitted_past_the_patience_fails_the_task(
    db_url: str, unlistened: socket.socket
) -> None:
    port = unlistened.getsockname()[1]
    provider = HttpProvider(fake_http_model(f"http://127.0.0.1:{port}"))
    async with http_engine(db_url, provider) as eng:
        eng.runner.submit_patience = 0.3
        task = await run_one(eng)
    assert task.status is TaskStatus.FAILED  # nothing runs upstream: failing it is safe
    assert task.error["code"] == "upstream_unavailable"
    assert "ConnectError" in task.error["message"]


# ---- busy upstream -------------------------------------------------------------------------------


async def test_a_429_storm_slows_the_model_instead_of_failing_tasks(
    db_url: str, upstream: Served
) -> None:
    tasks = 10
    dials = upstream.fake.dials
    dials.retry_after = 0.25
    provider = HttpProvider(fake_http_model(upstream.url))
    async with http_engine(db_url, provider) as eng:
        dials.busy_until = trio.current_time() + 1.0  # every submit refused for a second
        ids = [
            await eng.submit(request(model=MODEL, run_mode=RunMode.LIVE, payload={"n": n}))
            for n in range(tasks)
        ]
        done = [await eng.wait(task_id, timeout=30) for task_id in ids]
        held = [
            e.payload
            for task_id in ids
            for e in await eng.events(task_id)
            if e.type == "task.not_submitted"
        ]
    assert [t.status for t in done] == [TaskStatus.SUCCEEDED] * tasks
    assert len(upstream.fake.accepted) == tasks
    refused = upstream.fake.answered(429)
    # Each task may be refused once when the storm starts; after that only one probe per
    # Retry-After reaches the upstream (about 4 in the second), where every task retrying on
    # its own would have been refused about 4 times each (40).
    assert 1 <= refused <= tasks + 6, refused
    assert len(held) == refused and all(p["busy"] and p["delay"] == 0.25 for p in held)


async def test_a_4xx_fails_the_task_with_the_upstreams_message(
    db_url: str, upstream: Served
) -> None:
    upstream.fake.dials.reject_next = 1
    async with http_engine(db_url, HttpProvider(fake_http_model(upstream.url))) as eng:
        task = await run_one(eng)
    assert task.status is TaskStatus.FAILED
    assert task.error == {
        "code": "upstream_rejected",
        "message": "HTTP 422: the prompt was refused",
    }
    assert upstream.fake.accepted == []


async def test_an_upstream_failure_fails_the_task_and_a_success_keeps_the_result(
    db_url: str, upstream: Served
) -> None:
    provider = HttpProvider(fake_http_model(upstream.url))
    async with http_engine(db_url, provider) as eng:
        upstream.fake.dials.polls_to_finish = 3
        good = await run_one(eng, prompt="a dog")
        upstream.fake.dials.failure_rate = 1.0
        bad = await run_one(eng, prompt="a cat")
    assert good.status is TaskStatus.SUCCEEDED
    assert good.result == {"url": "https://fake.invalid/job-1.bin", "request": {"prompt": "a dog"}}
    assert bad.status is TaskStatus.FAILED
    assert bad.error == {"code": "upstream_failed", "message": "the upstream job failed"}


@pytest.mark.parametrize("idempotent", [True, False])
async def test_a_dead_owners_unknown_submission_is_made_again_only_with_a_key(
    db_url: str, upstream: Served, idempotent: bool
) -> None:
    """An owner died between the call and its answer (the upstream has the job; the task has
    ``submitted_at`` and no reference). The next execution submits again with the same key if
    the call carried one (one job upstream, the task succeeds), else manual review (one job)."""
    provider = HttpProvider(fake_http_model(upstream.url, idempotent=idempotent))
    config = make_config(**{"worker.hard_limit": 4})
    async with (
        provider,
        open_engine(
            config, urls=DatabaseUrls.single(db_url), providers={MODEL: provider}, control=False
        ) as eng,
    ):
        await eng.set_model(MODEL)
        task_id = await eng.submit(
            request(model=MODEL, run_mode=RunMode.LIVE, payload={"prompt": "a cat"})
        )
        # The lost call: it reached the upstream, its answer died with its owner.
        headers = {"Idempotency-Key": str(task_id)} if idempotent else {}
        async with httpx.AsyncClient() as client:
            reply = await client.post(
                f"{upstream.url}/jobs", json={"prompt": "a cat"}, headers=headers
            )
        assert reply.status_code == 201
        await eng.db.tasks.execute(
            "UPDATE engine_task SET status = 'running', submitted_at = now(), attempts = 1,"
            " submitted_idempotently = $2, execution_token = gen_random_uuid(),"
            " execution_owner = 'dead', lease_expires_at = now() - interval '1 s'"
            " WHERE id = $1",
            task_id,
            idempotent,
        )
        task = await eng.get(task_id)
        assert task is not None and task.river_job_id is not None
        job = await eng.queue.get(task.river_job_id)
        assert job is not None
        await eng.runner.work(job, TaskRunArgs(str(task_id)))
        final = await eng.wait(task_id, timeout=15)
    assert len(upstream.fake.accepted) == 1  # the ledger: one job, whatever happened
    if idempotent:
        assert final.status is TaskStatus.SUCCEEDED, final.error
        assert [r.replayed for r in upstream.fake.received] == [False, True]
        assert final.upstream_ref == upstream.fake.accepted[0].id
    else:
        assert final.status is TaskStatus.MANUAL_REVIEW
        assert len(upstream.fake.received) == 1  # never sent again
