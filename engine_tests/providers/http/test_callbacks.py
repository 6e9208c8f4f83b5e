"""Webhook completion: the fake upstream calls back the engine's real HTTP server, signed.

Everything runs on loopback sockets: the fake upstream on hypercorn, the engine's own server
(``POST /hooks/<task id>``), a real database. The fallback poll interval is long (30 s) in the
tests that expect a callback to finish the task, so a task finished within their deadline was
finished by the callback; the fake's ledger shows it was not polled.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
import pytest
import trio

from engine.db.database import DatabaseUrls
from engine.domain.tasks import RunMode, Task, TaskStatus
from engine.providers.http.description import HttpCallback
from engine.providers.http.fake import fake_http_model
from engine.providers.http.provider import HttpProvider
from engine.providers.http.signing import sign
from engine.service.engine import Engine
from engine.service.root import open as open_engine
from engine.tasks.callbacks import Recorded, record_callback
from engine_tests.providers.http.conftest import Served
from engine_tests.tasks.conftest import make_config, request

MODEL = "fake-model"
SECRET = "shared-secret"
ENVIRON = {"FAKE_WEBHOOK_SECRET": SECRET}


def callback_provider(
    url: str, *, fallback: float = 30.0, tolerance: float = 300.0
) -> HttpProvider:
    """A provider of the fake whose upstream calls back, polling every ``fallback`` s."""
    callback = HttpCallback(
        secret_env="FAKE_WEBHOOK_SECRET", poll_interval=fallback, tolerance=tolerance
    )
    return HttpProvider(fake_http_model(url, callback=callback), environ=ENVIRON)


@asynccontextmanager
async def hook_engine(
    db_url: str, provider: HttpProvider, **settings: Any
) -> AsyncIterator[Engine]:
    """An engine serving MODEL with ``provider``; its HTTP server on any free loopback port
    (started for the hooks, metrics and dashboard off unless ``settings`` say)."""
    config = make_config(**{"worker.hard_limit": 16, "metrics.port": 0, **settings})
    async with open_engine(
        config, urls=DatabaseUrls.single(db_url), providers={MODEL: provider}
    ) as eng:
        await eng.set_model(MODEL)
        assert eng.runner.hooks_base_url is not None
        yield eng


async def submit(eng: Engine, **payload: Any) -> uuid.UUID:
    return await eng.submit(
        request(model=MODEL, run_mode=RunMode.LIVE, payload=payload or {"prompt": "a cat"})
    )


async def get(eng: Engine, task_id: uuid.UUID) -> Task:
    task = await eng.get(task_id)
    assert task is not None
    return task


async def submitted(eng: Engine, task_id: uuid.UUID) -> Task:
    """The task once its upstream reference is recorded."""
    with trio.fail_after(15):
        while True:
            task = await get(eng, task_id)
            if task.upstream_ref is not None:
                return task
            await trio.sleep(0.02)


async def wait_for_event(eng: Engine, task_id: uuid.UUID, kind: str) -> None:
    with trio.fail_after(10):
        while kind not in [e.type for e in await eng.events(task_id)]:
            await trio.sleep(0.02)  # events are written in batches


def signed(
    body: Any, *, at: float | None = None, secret: str = SECRET
) -> tuple[bytes, dict[str, str]]:
    """A callback body and its headers, signed at Unix time ``at`` (now by default)."""
    raw = json.dumps(body).encode()
    timestamp = str(int(time.time() if at is None else at))
    return raw, {
        "content-type": "application/json",
        "X-Webhook-Timestamp": timestamp,
        "X-Webhook-Signature": sign(secret, timestamp, raw),
    }


async def post_hook(
    eng: Engine, task_id: uuid.UUID, raw: bytes, headers: dict[str, str]
) -> httpx.Response:
    async with httpx.AsyncClient() as client:
        return await client.post(
            f"{eng.runner.hooks_base_url}/hooks/{task_id}", content=raw, headers=headers
        )


async def callback_rows(eng: Engine, task_id: uuid.UUID) -> int:
    return int(
        await eng.db.tasks.fetchval(
            "SELECT count(*) FROM engine_task_callback WHERE task_id = $1", task_id
        )
    )


def done_body(ref: str) -> dict[str, Any]:
    return {"id": ref, "status": "succeeded", "result": {"url": "https://example.invalid/x"}}


# ---- a signed callback finishes the task -------------------------------------------------------


async def test_a_signed_callback_finishes_the_task_before_any_poll(
    db_url: str, upstream: Served
) -> None:
    fake = upstream.fake
    fake.dials.callback_secret, fake.dials.job_seconds = SECRET, 0.2
    async with hook_engine(db_url, callback_provider(upstream.url)) as eng:
        started = trio.current_time()
        task = await eng.wait(await submit(eng), timeout=10)
        took = trio.current_time() - started
        await wait_for_event(eng, task.id, "task.callback")
    assert task.status is TaskStatus.SUCCEEDED, task.error
    assert task.result == {
        "url": "https://fake.invalid/job-1.bin",
        "request": {"prompt": "a cat"},
    }
    assert took < 10  # the fallback poll is 30 s away
    assert fake.polls == 0  # finished by the callback alone
    assert [c.status for c in fake.callbacks] == [202]
    assert fake.callbacks[0].url.endswith(f"/hooks/{task.id}")


async def test_a_failed_job_reported_by_callback_fails_the_task(
    db_url: str, upstream: Served
) -> None:
    fake = upstream.fake
    fake.dials.callback_secret, fake.dials.failure_rate = SECRET, 1.0
    async with hook_engine(db_url, callback_provider(upstream.url)) as eng:
        task = await eng.wait(await submit(eng), timeout=10)
    assert task.status is TaskStatus.FAILED
    assert task.error == {"code": "upstream_failed", "message": "the upstream job failed"}
    assert fake.polls == 0


async def test_the_hook_needs_no_dashboard_credentials(db_url: str, upstream: Served) -> None:
    fake = upstream.fake
    fake.dials.callback_secret = SECRET
    settings = {
        "dashboard.enabled": "true",
        "dashboard.token": "a-long-enough-t0ken",
        "metrics.enabled": "true",
    }
    async with hook_engine(db_url, callback_provider(upstream.url), **settings) as eng:
        async with httpx.AsyncClient() as client:
            page = await client.get(f"{eng.runner.hooks_base_url}/tasks")
        task = await eng.wait(await submit(eng), timeout=10)
    assert page.status_code in (303, 401)  # the dashboard is behind its token
    assert task.status is TaskStatus.SUCCEEDED
    assert [c.status for c in fake.callbacks] == [202]


# ---- refused callbacks change nothing ----------------------------------------------------------


async def test_a_bad_signature_is_refused_and_changes_nothing(
    db_url: str, upstream: Served
) -> None:
    async with hook_engine(db_url, callback_provider(upstream.url)) as eng:
        task = await submitted(eng, await submit(eng))
        raw, headers = signed(done_body(task.upstream_ref or ""), secret="not-the-secret")
        answer = await post_hook(eng, task.id, raw, headers)
        unsigned = await post_hook(eng, task.id, raw, {"content-type": "application/json"})
        after = await get(eng, task.id)
        rows = await callback_rows(eng, task.id)
    assert (answer.status_code, answer.text) == (401, "bad signature\n")
    assert unsigned.status_code == 401 and "no signature" in unsigned.text
    assert after.status is TaskStatus.RUNNING and after.result is None
    assert rows == 0


async def test_a_replayed_callback_is_refused(db_url: str, upstream: Served) -> None:
    async with hook_engine(db_url, callback_provider(upstream.url)) as eng:
        task = await submitted(eng, await submit(eng))
        # Not final (a progress report), so the task stays live for the replay.
        raw, headers = signed({"id": task.upstream_ref, "status": "running", "progress": 0.5})
        first = await post_hook(eng, task.id, raw, headers)
        replay = await post_hook(eng, task.id, raw, headers)
        after = await get(eng, task.id)
        rows = await callback_rows(eng, task.id)
    assert first.status_code == 202
    assert replay.status_code == 409 and replay.text.startswith("replayed")
    assert after.status is TaskStatus.RUNNING
    assert rows == 1


@pytest.mark.parametrize(
    ("offset", "reason"), [(-310, "stale timestamp"), (310, "timestamp in the future")]
)
async def test_a_timestamp_outside_the_tolerance_is_refused(
    db_url: str, upstream: Served, offset: float, reason: str
) -> None:
    async with hook_engine(db_url, callback_provider(upstream.url)) as eng:
        task = await submitted(eng, await submit(eng))
        raw, headers = signed(done_body(task.upstream_ref or ""), at=time.time() + offset)
        answer = await post_hook(eng, task.id, raw, headers)
        within = signed(done_body(task.upstream_ref or ""), at=time.time() + offset / 2)
        accepted = await post_hook(eng, task.id, *within)
        finished = await eng.wait(task.id, timeout=10)
    assert answer.status_code == 401 and answer.text.startswith(reason)
    assert accepted.status_code == 202  # the same callback, within the tolerance
    assert finished.status is TaskStatus.SUCCEEDED


async def test_an_unknown_task_is_404(db_url: str, upstream: Served) -> None:
    async with hook_engine(db_url, callback_provider(upstream.url)) as eng:
        raw, headers = signed(done_body("job-1"))
        answer = await post_hook(eng, uuid.uuid4(), raw, headers)
        malformed = await post_hook(eng, "not-a-task", raw, headers)  # type: ignore[arg-type]
    assert answer.status_code == 404
    assert malformed.status_code == 404


async def test_a_callback_for_a_final_task_changes_nothing(db_url: str, upstream: Served) -> None:
    fake = upstream.fake
    fake.dials.callback_secret = SECRET
    async with hook_engine(db_url, callback_provider(upstream.url)) as eng:
        task = await eng.wait(await submit(eng), timeout=10)
        assert task.status is TaskStatus.SUCCEEDED
        rows_before = await callback_rows(eng, task.id)
        body = {"id": task.upstream_ref, "status": "failed", "error": {"message": "late"}}
        answer = await post_hook(eng, task.id, *signed(body))
        after = await get(eng, task.id)
        rows_after = await callback_rows(eng, task.id)
    assert answer.status_code == 200 and answer.text.startswith("ignored")
    assert after == task  # the row is untouched, updated_at included
    assert rows_after == rows_before


async def test_a_callback_while_another_token_holds_the_task_changes_nothing(
    db_url: str, upstream: Served
) -> None:
    provider = callback_provider(upstream.url)
    # Renewal far away: only the callback can end this process's execution within the test.
    async with hook_engine(
        db_url, provider, **{"tasks.lease_ttl": 120, "tasks.lease_renew_interval": 60}
    ) as eng:
        task = await submitted(eng, await submit(eng))
        assert task.id in eng.keeper.running
        # Another execution takes the task over (as recovery would hand it to another
        # instance): this process's execution still runs, with a stale token.
        other = uuid.uuid4()
        await eng.db.tasks.execute(
            "UPDATE engine_task SET execution_token = $2, execution_owner = 'elsewhere'"
            " WHERE id = $1",
            task.id,
            other,
        )
        answer = await post_hook(eng, task.id, *signed(done_body(task.upstream_ref or "")))
        # The stale execution is woken, reads the callback, and its fenced finish fails.
        with trio.fail_after(10):
            while task.id in eng.keeper.running:
                await trio.sleep(0.02)
        after = await get(eng, task.id)
    assert answer.status_code == 202  # recorded: the holder's own run reads it
    assert after.status is TaskStatus.RUNNING
    assert after.execution_token == other and after.result is None
    assert upstream.fake.polls == 0


# ---- a lost callback ---------------------------------------------------------------------------


async def test_a_dropped_callback_is_covered_by_the_fallback_poll(
    db_url: str, upstream: Served
) -> None:
    fake = upstream.fake
    fake.dials.callback_secret, fake.dials.callback_drop_next = SECRET, 1
    fake.dials.job_seconds = 0.1
    async with hook_engine(db_url, callback_provider(upstream.url, fallback=0.5)) as eng:
        task = await eng.wait(await submit(eng), timeout=15)
    assert task.status is TaskStatus.SUCCEEDED, task.error
    assert [c.status for c in fake.callbacks] == [0]  # never sent
    assert fake.polls >= 1


async def test_a_callback_recorded_while_nobody_runs_the_task_is_read_by_the_next_run(
    db_url: str, upstream: Served
) -> None:
    # The owner stops after the submission; the callback lands while the task is queued; the
    # next run reads it at once instead of waiting for a poll.
    provider = callback_provider(upstream.url)
    async with hook_engine(db_url, provider) as eng:
        task = await submitted(eng, await submit(eng))
    config = make_config(**{"worker.hard_limit": 16, "metrics.port": 0})
    async with open_engine(config, urls=DatabaseUrls.single(db_url), control=False) as client:
        queued = await get(client, task.id)
        assert queued.status is TaskStatus.QUEUED and queued.upstream_ref is not None
        # What the hook does once the signature checks out (the hook itself is tested above).
        raw, headers = signed(done_body(task.upstream_ref or ""))
        verified = provider.parse_callback(headers, raw)
        assert await record_callback(client.db.tasks, task.id, verified) is Recorded.RECORDED
    async with hook_engine(db_url, callback_provider(upstream.url)) as eng:
        finished = await eng.wait(task.id, timeout=10)
    assert finished.status is TaskStatus.SUCCEEDED
    assert finished.result == {"url": "https://example.invalid/x"}
    assert upstream.fake.polls == 0  # the resumed run read the callback before polling
