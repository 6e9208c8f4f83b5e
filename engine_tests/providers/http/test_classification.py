"""The kit's failure classification, row by row, against the fake upstream on loopback.

Each submit row says what the engine may do next: NotSubmitted (safe to submit again),
UpstreamBusy (safe, and slow the model), AmbiguousSubmission (the upstream may run it),
ProviderError (refused). The ledger shows what the upstream really accepted.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime
from typing import Any

import httpx
import pytest

from engine.domain.tasks import Task
from engine.providers.base import AmbiguousSubmission, NotSubmitted, ProviderError, UpstreamBusy
from engine.providers.http.classify import (
    TransientPollFailure,
    poll_exception,
    poll_response_problem,
    retry_after,
    submit_exception,
    submit_response_id,
)
from engine.providers.http.fake import fake_http_model
from engine.providers.http.provider import HttpProvider
from engine.testing.factories import make_task
from engine_tests.providers.http.conftest import Served


def task(**payload: Any) -> Task:
    return make_task(model="fake-model", payload=payload or {"prompt": "a cat"})


async def submit(provider: HttpProvider, t: Task) -> str:
    return await provider.submit(t, await provider.prepare(t))


@pytest.fixture
def closed_port() -> Iterator[int]:
    """A loopback port bound by nobody who listens: connections to it are refused."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    try:
        yield int(sock.getsockname()[1])
    finally:
        sock.close()


# ---- submit: the request never left ------------------------------------------------------------


async def test_a_refused_connection_is_not_submitted(closed_port: int) -> None:
    async with HttpProvider(fake_http_model(f"http://127.0.0.1:{closed_port}")) as provider:
        with pytest.raises(NotSubmitted) as raised:
            await submit(provider, task())
    assert type(raised.value) is NotSubmitted  # not busy: nothing asked us to slow down
    assert "ConnectError" in str(raised.value)


async def test_a_name_that_does_not_resolve_is_not_submitted() -> None:
    async with HttpProvider(fake_http_model("http://upstream.invalid:9")) as provider:
        with pytest.raises(NotSubmitted, match="ConnectError"):
            await submit(provider, task())


@pytest.mark.parametrize(
    "exc",
    [
        httpx.ConnectError("refused"),
        httpx.ConnectTimeout("slow handshake"),
        httpx.PoolTimeout("no free connection"),
    ],
)
def test_errors_before_any_byte_was_sent_are_not_submitted(exc: httpx.HTTPError) -> None:
    assert type(submit_exception(exc)) is NotSubmitted


# ---- submit: the answer was lost after the request was sent --------------------------------------


async def test_a_timeout_after_the_request_was_sent_is_ambiguous(upstream: Served) -> None:
    upstream.fake.dials.drop_next, upstream.fake.dials.drop_mode = 1, "hang"
    model = fake_http_model(upstream.url, read_timeout=0.3)
    async with HttpProvider(model) as provider:
        with pytest.raises(AmbiguousSubmission, match="ReadTimeout"):
            await submit(provider, task())
    assert len(upstream.fake.accepted) == 1  # it was accepted: resubmitting would run it twice


async def test_a_reset_after_the_request_was_sent_is_ambiguous(upstream: Served) -> None:
    upstream.fake.dials.drop_next = 1  # reset: the connection is cut mid-answer
    async with HttpProvider(fake_http_model(upstream.url)) as provider:
        with pytest.raises(AmbiguousSubmission, match="RemoteProtocolError"):
            await submit(provider, task())
    assert len(upstream.fake.accepted) == 1


@pytest.mark.parametrize(
    "exc",
    [
        httpx.ReadTimeout("no answer"),
        httpx.WriteTimeout("stuck sending"),
        httpx.ReadError("reset"),
        httpx.WriteError("broken pipe"),
        httpx.RemoteProtocolError("peer closed"),
    ],
)
def test_errors_once_the_request_was_on_its_way_are_ambiguous(exc: httpx.HTTPError) -> None:
    assert isinstance(submit_exception(exc), AmbiguousSubmission)


def test_a_request_that_cannot_be_made_is_a_provider_error() -> None:
    refused = submit_exception(httpx.UnsupportedProtocol("ftp://"))
    assert isinstance(refused, ProviderError) and refused.code == "invalid_request"


# ---- submit: the upstream's answer ---------------------------------------------------------------


async def test_a_4xx_is_a_provider_error_with_the_upstreams_message(upstream: Served) -> None:
    upstream.fake.dials.reject_next = 1
    async with HttpProvider(fake_http_model(upstream.url)) as provider:
        with pytest.raises(ProviderError) as raised:
            await submit(provider, task())
    assert str(raised.value) == "HTTP 422: the prompt was refused"
    assert raised.value.code == "upstream_rejected"
    assert upstream.fake.accepted == []


@pytest.mark.parametrize("idempotent", [False, True])
async def test_a_5xx_on_submit_is_ambiguous(upstream: Served, idempotent: bool) -> None:
    """Ambiguous either way; an idempotent model's provider says so, and the engine then
    submits again with the same key instead of sending the task to manual review."""
    upstream.fake.dials.error_after_accept_next = 1  # accepted, then a 500
    async with HttpProvider(fake_http_model(upstream.url, idempotent=idempotent)) as provider:
        with pytest.raises(AmbiguousSubmission, match="HTTP 500: internal error"):
            await submit(provider, task())
        assert provider.idempotent_submit is idempotent
    assert len(upstream.fake.accepted) == 1


async def test_a_429_is_busy_with_its_retry_after(upstream: Served) -> None:
    upstream.fake.dials.busy_next, upstream.fake.dials.retry_after = 1, 2.5
    async with HttpProvider(fake_http_model(upstream.url)) as provider:
        with pytest.raises(UpstreamBusy) as raised:
            await submit(provider, task())
        assert raised.value.retry_after == 2.5
        assert await submit(provider, task()) == "job-1"  # the next one is taken
    assert len(upstream.fake.accepted) == 1


async def test_a_503_is_busy_and_without_retry_after_waits_the_models_delay(
    upstream: Served,
) -> None:
    upstream.fake.dials.unavailable_next, upstream.fake.dials.retry_after = 1, None
    model = fake_http_model(upstream.url, busy_delay=0.75)
    async with HttpProvider(model) as provider:
        with pytest.raises(UpstreamBusy) as raised:
            await submit(provider, task())
    assert raised.value.retry_after == 0.75
    assert upstream.fake.accepted == []


def response(status: int, **kw: Any) -> httpx.Response:
    return httpx.Response(status, request=httpx.Request("POST", "http://u/jobs"), **kw)


def test_a_408_is_not_submitted() -> None:
    with pytest.raises(NotSubmitted) as raised:
        submit_response_id(fake_http_model("http://u"), response(408, text="slow body"))
    assert type(raised.value) is NotSubmitted


@pytest.mark.parametrize("answer", [{}, {"id": ""}, {"id": None}, {"id": True}, "not json"])
def test_a_2xx_without_an_id_is_ambiguous(answer: Any) -> None:
    kw = {"text": answer} if isinstance(answer, str) else {"json": answer}
    with pytest.raises(AmbiguousSubmission, match="no id at 'id'"):
        submit_response_id(fake_http_model("http://u"), response(201, **kw))


def test_the_id_is_read_at_its_path() -> None:
    model = fake_http_model("http://u", id_path="data.jobs.0.id")
    answer = response(202, json={"data": {"jobs": [{"id": 42}]}})
    assert submit_response_id(model, answer) == "42"


def test_a_409_is_ambiguous_only_for_an_idempotent_model() -> None:
    conflict = response(409, json={"error": {"message": "key in use"}})
    with pytest.raises(AmbiguousSubmission):
        submit_response_id(fake_http_model("http://u", idempotent=True), conflict)
    with pytest.raises(ProviderError, match="HTTP 409: key in use"):
        submit_response_id(fake_http_model("http://u"), conflict)


def test_retry_after_reads_seconds_and_dates_and_is_capped() -> None:
    def after(value: str | None) -> float:
        headers = {} if value is None else {"retry-after": value}
        return retry_after(response(429, headers=headers), default=1.0, cap=60.0)

    assert after("7") == 7.0
    assert after(None) == 1.0 and after("soon") == 1.0
    assert after("-3") == 0.0 and after("3600") == 60.0
    later = format_datetime(datetime.now(UTC) + timedelta(seconds=30), usegmt=True)
    assert 25 < after(later) <= 30


# ---- what the submit sends -----------------------------------------------------------------------


async def test_the_submit_sends_the_payload_secrets_and_the_idempotency_key(
    upstream: Served,
) -> None:
    model = fake_http_model(
        upstream.url,
        idempotent=True,
        submit=fake_http_model(upstream.url).submit.__class__(
            url=f"{upstream.url}/jobs",
            headers={"Authorization": "Bearer {{ env.FAKE_KEY }}"},
            body={"prompt": "{{ payload.prompt }}", "steps": "{{ payload.steps }}", "v": 2},
        ),
    )
    t = task(prompt="a cat", steps=30)
    async with HttpProvider(model, environ={"FAKE_KEY": "s3cret"}) as provider:
        assert await submit(provider, t) == "job-1"
    job = upstream.fake.accepted[0]
    assert job.body == {"prompt": "a cat", "steps": 30, "v": 2}  # the number stays a number
    assert job.headers["authorization"] == "Bearer s3cret"
    assert job.idempotency_key == str(t.id)


async def test_a_repeated_key_returns_the_first_job(upstream: Served) -> None:
    t = task()
    async with HttpProvider(fake_http_model(upstream.url, idempotent=True)) as provider:
        first = await submit(provider, t)
        assert await submit(provider, t) == first
    assert len(upstream.fake.accepted) == 1
    assert [r.replayed for r in upstream.fake.received] == [False, True]


async def test_a_payload_without_the_bodys_value_fails_in_prepare(upstream: Served) -> None:
    model = fake_http_model(
        upstream.url,
        submit=fake_http_model(upstream.url).submit.__class__(
            url=f"{upstream.url}/jobs", body={"prompt": "{{ payload.prompt }}"}
        ),
    )
    async with HttpProvider(model) as provider:
        with pytest.raises(ProviderError, match="no 'prompt'") as raised:
            await provider.prepare(task(text="no prompt here"))
    assert raised.value.code == "invalid_payload"


# ---- poll ----------------------------------------------------------------------------------------


def test_poll_failures_worth_repeating() -> None:
    model = fake_http_model("http://u")
    for status in (408, 429, 500, 502, 503, 504):
        assert isinstance(poll_response_problem(model, response(status)), TransientPollFailure)
    for exc in (httpx.ConnectError("x"), httpx.ReadTimeout("x"), httpx.RemoteProtocolError("x")):
        assert isinstance(poll_exception(exc), TransientPollFailure)
    refused = poll_response_problem(model, response(404, json={"error": {"message": "gone"}}))
    assert isinstance(refused, ProviderError) and "HTTP 404: gone" in str(refused)
    assert poll_response_problem(model, response(200)) is None


async def test_a_poll_retries_transient_failures_with_backoff(upstream: Served) -> None:
    dials = upstream.fake.dials
    dials.poll_busy_next, dials.poll_error_next, dials.retry_after = 2, 1, 0.05
    t = task()
    async with HttpProvider(fake_http_model(upstream.url, poll_backoff=0.01)) as provider:
        ref = await submit(provider, t)
        polled = await provider.poll(t, ref)
    assert polled.done and polled.error is None
    assert polled.result == {"url": "https://fake.invalid/job-1.bin", "request": t.payload}
    assert upstream.fake.polls == 1  # the three failed attempts were answered before the job


async def test_a_poll_that_keeps_failing_fails_the_task(upstream: Served) -> None:
    upstream.fake.dials.poll_error_next = 10
    model = fake_http_model(upstream.url, poll_backoff=0.01, poll_retries=2)
    t = task()
    async with HttpProvider(model) as provider:
        ref = await submit(provider, t)
        with pytest.raises(ProviderError, match="3 attempts in a row failed") as raised:
            await provider.poll(t, ref)
    assert raised.value.code == "poll_failed"
    assert upstream.fake.dials.poll_error_next == 7


async def test_a_poll_of_an_unknown_job_is_refused(upstream: Served) -> None:
    async with HttpProvider(fake_http_model(upstream.url)) as provider:
        with pytest.raises(ProviderError, match="HTTP 404"):
            await provider.poll(task(), "job-404")


async def test_poll_reads_progress_status_and_error(upstream: Served) -> None:
    upstream.fake.dials.polls_to_finish, upstream.fake.dials.failure_rate = 2, 1.0
    t = task()
    async with HttpProvider(fake_http_model(upstream.url)) as provider:
        ref = await submit(provider, t)
        first = await provider.poll(t, ref)
        second = await provider.poll(t, ref)
    assert not first.done and first.progress == 0.5
    assert second.done and second.error == "the upstream job failed"


async def test_a_status_the_mapping_does_not_know_fails(upstream: Served) -> None:
    upstream.fake.dials.polls_to_finish = 5
    model = fake_http_model(upstream.url, status_map={"succeeded": "succeeded"})
    t = task()
    async with HttpProvider(model) as provider:
        ref = await submit(provider, t)
        with pytest.raises(ProviderError, match="unknown upstream status 'running'"):
            await provider.poll(t, ref)


async def test_cancel_sends_the_cancel_request(upstream: Served) -> None:
    t = task()
    async with HttpProvider(fake_http_model(upstream.url)) as provider:
        ref = await submit(provider, t)
        await provider.cancel(t, ref)
    assert upstream.fake.accepted[0].cancelled
