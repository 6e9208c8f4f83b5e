"""A fake upstream HTTP API, for tests, benchmarks and demos: :class:`FakeUpstream`.

An ASGI application with the shape real generation APIs have, served on loopback by
hypercorn's trio worker (:func:`serve_upstream`)::

    POST /jobs                  start a job: 201 {"id": "...", "status": "queued"}
    GET  /jobs/{id}             {"status": "running", "progress": 0.5}, then
                                {"status": "succeeded", "result": {...}} or
                                {"status": "failed", "error": {"message": "..."}}
    POST /jobs/{id}/cancel      {"status": "cancelled"}

Its :class:`Dials` make it misbehave on purpose: latency, a failure rate, 429 with
``Retry-After`` (a count, or for a while), 503, 500 before or after accepting, 4xx refusals,
and "accept, then drop the answer" (the connection is cut mid-answer, or the answer never
comes). It honours an idempotency key header (a repeated key answers the first job). Its
ledger records every job it accepted (:attr:`FakeUpstream.accepted`) and every submit request
it received with how it answered (:attr:`FakeUpstream.received`), which is how tests prove
that nothing ran twice. :func:`fake_http_model` is the :class:`HttpModel` that calls it.

With ``Dials.callback_secret`` set, a job submitted with an ``X-Callback-Url`` header is also
reported by callback: once the job is done (``job_seconds`` after it was accepted) the fake
posts ``{"id", "status", "result" | "error"}`` to that URL, signed as
:mod:`engine.providers.http.signing` says; ``callback_drop_next`` loses callbacks on purpose.
Every callback is in :attr:`FakeUpstream.callbacks`, with how the engine answered it. The
callbacks are sent from a nursery the ASGI lifespan opens (hypercorn runs it).
"""

from __future__ import annotations

import json
import logging
import random
import socket
import time
from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping
from contextlib import asynccontextmanager
from typing import Any

import attrs
import httpx
import trio
from hypercorn.config import Config, Sockets
from hypercorn.trio.run import worker_serve
from hypercorn.utils import wrap_app

from engine.providers.http.description import HttpCallback, HttpModel, HttpRequestSpec
from engine.providers.http.signing import sign

__all__ = [
    "CALLBACK_URL_HEADER",
    "AcceptedJob",
    "Dials",
    "FakeUpstream",
    "ReceivedRequest",
    "SentCallback",
    "fake_http_model",
    "serve_upstream",
]

#: The submit header a job's callback URL is read from.
CALLBACK_URL_HEADER = "X-Callback-Url"

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

log = logging.getLogger(__name__)

#: Connections (and so callbacks in flight at once) of the client that sends the callbacks.
_CALLBACK_CONNECTIONS = 32


@attrs.define
class Dials:
    """How the fake misbehaves; change them at any time (counts are used up one per request).

    Attributes:
        submit_latency: seconds before a submit is answered (after it is accepted).
        poll_latency: seconds before a poll is answered.
        job_seconds: a job finishes no sooner than this many seconds after it was accepted.
        polls_to_finish: ...and not before this many polls of it.
        failure_rate: the share of jobs that end ``failed``.
        busy_next: the next this many submits are answered 429 (nothing accepted).
        busy_until: submits are answered 429 until this trio time (a storm).
        retry_after: the ``Retry-After`` seconds sent with a 429 or 503 (None: no header).
        unavailable_next: the next this many submits are answered 503.
        error_next: the next this many submits are answered 500, nothing accepted.
        error_after_accept_next: the next this many submits are accepted, then answered 500.
        reject_next: the next this many submits are refused with 422 and a message.
        drop_next: the next this many submits are accepted and their answer dropped.
        drop_mode: ``reset``: the connection is cut mid-answer; ``hang``: no answer comes
            until the client gives up.
        poll_busy_next: the next this many polls are answered 429.
        poll_error_next: the next this many polls are answered 500.
        idempotency_header: the header an idempotency key is read from (None: ignored).
        callback_secret: the shared secret callbacks are signed with; None: no callbacks.
        callback_drop_next: the next this many callbacks are lost (never sent).
        callback_signature_header, callback_timestamp_header: where the signature and the
            timestamp go (the defaults of :class:`HttpCallback`).
    """

    submit_latency: float = 0.0
    poll_latency: float = 0.0
    job_seconds: float = 0.0
    polls_to_finish: int = 1
    failure_rate: float = 0.0
    busy_next: int = 0
    busy_until: float = float("-inf")
    retry_after: float | None = 1.0
    unavailable_next: int = 0
    error_next: int = 0
    error_after_accept_next: int = 0
    reject_next: int = 0
    drop_next: int = 0
    drop_mode: str = "reset"
    poll_busy_next: int = 0
    poll_error_next: int = 0
    idempotency_header: str | None = "Idempotency-Key"
    callback_secret: str | None = None
    callback_drop_next: int = 0
    callback_signature_header: str = "X-Webhook-Signature"
    callback_timestamp_header: str = "X-Webhook-Timestamp"


@attrs.define
class AcceptedJob:
    """One job the fake accepted: the ledger's row."""

    id: str
    body: Any
    headers: dict[str, str]
    idempotency_key: str | None
    accepted_at: float
    fails: bool
    polls: int = 0
    cancelled: bool = False


@attrs.frozen
class SentCallback:
    """One callback the fake made (or dropped): the request, and the engine's answer
    (``status``: the HTTP status; 0 when dropped on purpose; -1 when it could not be sent)."""

    job_id: str
    url: str
    body: bytes
    headers: dict[str, str]
    status: int


@attrs.frozen
class ReceivedRequest:
    """One submit request the fake received, and its answer (``status``; 0 when dropped)."""

    idempotency_key: str | None
    status: int
    job_id: str | None
    replayed: bool = False


class FakeUpstream:
    """The fake upstream: an ASGI application (see the module docstring).

    Args:
        dials: how it misbehaves (a default :class:`Dials` when None).
        seed: the seed of its random choices (which jobs fail).
    """

    def __init__(self, dials: Dials | None = None, *, seed: int = 0) -> None:
        self.dials = dials or Dials()
        self._rng = random.Random(seed)
        #: Every accepted job, in order: the ledger.
        self.accepted: list[AcceptedJob] = []
        #: Every submit request received, in order, with its answer.
        self.received: list[ReceivedRequest] = []
        #: Polls answered, of any job.
        self.polls = 0
        self._jobs: dict[str, AcceptedJob] = {}
        self._by_key: dict[str, AcceptedJob] = {}
        self._changed = trio.Event()
        #: Every callback made or dropped, in order.
        self.callbacks: list[SentCallback] = []
        self._callbacks_changed = trio.Event()
        self._nursery: trio.Nursery | None = None
        self._client: httpx.AsyncClient | None = None
        # As many callbacks in flight as the client has connections: a request queued inside
        # httpcore's pool costs a scan of the whole queue on every release.
        self._sending = trio.Semaphore(_CALLBACK_CONNECTIONS)

    # ---- reading the ledger -------------------------------------------------------------------

    def accepted_for(self, idempotency_key: str) -> list[AcceptedJob]:
        """The jobs accepted under ``idempotency_key`` (by the header or ``key`` in the body)."""
        return [j for j in self.accepted if j.idempotency_key == idempotency_key]

    def answered(self, status: int) -> int:
        """How many submit requests were answered with HTTP ``status`` (0: dropped)."""
        return sum(1 for r in self.received if r.status == status)

    async def wait_received(self, count: int) -> None:
        """Wait until at least ``count`` submit requests were received (use a deadline)."""
        while len(self.received) < count:
            await self._changed.wait()

    async def wait_callbacks(self, count: int) -> None:
        """Wait until at least ``count`` callbacks were made or dropped (use a deadline)."""
        while len(self.callbacks) < count:
            await self._callbacks_changed.wait()

    def _record(self, request: ReceivedRequest) -> None:
        self.received.append(request)
        self._changed.set()
        self._changed = trio.Event()

    # ---- ASGI ---------------------------------------------------------------------------------

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Serve one ASGI connection scope."""
        if scope["type"] == "lifespan":
            # The lifespan lasts as long as the server: its nursery sends the callbacks.
            async with (
                httpx.AsyncClient(
                    timeout=httpx.Timeout(10.0, pool=None),
                    limits=httpx.Limits(max_connections=_CALLBACK_CONNECTIONS),
                ) as client,
                trio.open_nursery() as nursery,
            ):
                self._nursery, self._client = nursery, client
                try:
                    await _lifespan(receive, send)
                finally:
                    self._nursery = self._client = None
                    nursery.cancel_scope.cancel()
            return
        if scope["type"] != "http":
            return
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        method, parts = scope["method"], [p for p in scope["path"].split("/") if p]
        if method == "POST" and parts == ["jobs"]:
            await self._submit(body, headers, receive, send)
        elif method == "GET" and len(parts) == 2 and parts[0] == "jobs":
            await self._poll(parts[1], send)
        elif method == "POST" and len(parts) == 3 and parts[0] == "jobs" and parts[2] == "cancel":
            await self._cancel(parts[1], send)
        else:
            await _answer(send, 404, {"error": {"message": f"no route {method} {scope['path']}"}})

    async def _submit(
        self, raw: bytes, headers: dict[str, str], receive: Receive, send: Send
    ) -> None:
        dials = self.dials
        header = dials.idempotency_header
        key = headers.get(header.lower()) if header else None
        try:
            body = json.loads(raw) if raw else None
        except ValueError:
            self._record(ReceivedRequest(key, 400, None))
            await _answer(send, 400, {"error": {"message": "the body is not JSON"}})
            return
        if key is None and isinstance(body, dict) and isinstance(body.get("key"), str):
            key = body["key"]
        busy = dials.busy_next > 0 or trio.current_time() < dials.busy_until
        if busy or dials.unavailable_next > 0:
            status = 429 if busy else 503
            if dials.busy_next > 0 and busy:
                dials.busy_next -= 1
            elif not busy:
                dials.unavailable_next -= 1
            self._record(ReceivedRequest(key, status, None))
            extra = [] if dials.retry_after is None else [("retry-after", f"{dials.retry_after:g}")]
            await _answer(send, status, {"error": {"message": "slow down"}}, extra)
            return
        if dials.error_next > 0:
            dials.error_next -= 1
            self._record(ReceivedRequest(key, 500, None))
            await _answer(send, 500, {"error": {"message": "internal error"}})
            return
        if dials.reject_next > 0:
            dials.reject_next -= 1
            self._record(ReceivedRequest(key, 422, None))
            await _answer(send, 422, {"error": {"message": "the prompt was refused"}})
            return
        if key is not None and key in self._by_key:
            job = self._by_key[key]
            self._record(ReceivedRequest(key, 200, job.id, replayed=True))
            await trio.sleep(dials.submit_latency)
            await _answer(send, 200, {"id": job.id, "status": "queued"})
            return
        job = AcceptedJob(
            id=f"job-{len(self.accepted) + 1}",
            body=body,
            headers=headers,
            idempotency_key=key,
            accepted_at=trio.current_time(),
            fails=self._rng.random() < dials.failure_rate,
        )
        self.accepted.append(job)
        self._jobs[job.id] = job
        if key is not None:
            self._by_key[key] = job
        await trio.sleep(dials.submit_latency)
        if dials.drop_next > 0:
            dials.drop_next -= 1
            self._record(ReceivedRequest(key, 0, job.id))
            await _drop(dials.drop_mode, receive, send)
            return
        if dials.error_after_accept_next > 0:
            dials.error_after_accept_next -= 1
            self._record(ReceivedRequest(key, 500, job.id))
            await _answer(send, 500, {"error": {"message": "internal error"}})
            return
        self._record(ReceivedRequest(key, 201, job.id))
        callback_url = headers.get(CALLBACK_URL_HEADER.lower())
        if dials.callback_secret is not None and callback_url and self._nursery is not None:
            self._nursery.start_soon(self._call_back, job, callback_url, dials.callback_secret)
        await _answer(send, 201, {"id": job.id, "status": "queued"})

    async def _poll(self, job_id: str, send: Send) -> None:
        dials = self.dials
        await trio.sleep(dials.poll_latency)
        if dials.poll_busy_next > 0:
            dials.poll_busy_next -= 1
            extra = [] if dials.retry_after is None else [("retry-after", f"{dials.retry_after:g}")]
            await _answer(send, 429, {"error": {"message": "slow down"}}, extra)
            return
        if dials.poll_error_next > 0:
            dials.poll_error_next -= 1
            await _answer(send, 500, {"error": {"message": "internal error"}})
            return
        job = self._jobs.get(job_id)
        if job is None:
            await _answer(send, 404, {"error": {"message": f"no job {job_id}"}})
            return
        self.polls += 1
        job.polls += 1
        if job.cancelled:
            await _answer(send, 200, {"id": job.id, "status": "cancelled"})
            return
        elapsed = trio.current_time() - job.accepted_at
        if job.polls < dials.polls_to_finish or elapsed < dials.job_seconds:
            progress = min(job.polls / max(1, dials.polls_to_finish), 0.99)
            await _answer(send, 200, {"id": job.id, "status": "running", "progress": progress})
        else:
            await _answer(send, 200, self._outcome(job))

    def _outcome(self, job: AcceptedJob) -> dict[str, Any]:
        """The finished job as a poll answers it."""
        if job.fails:
            error = {"message": "the upstream job failed"}
            return {"id": job.id, "status": "failed", "error": error}
        result = {"url": f"https://fake.invalid/{job.id}.bin", "request": job.body}
        return {"id": job.id, "status": "succeeded", "result": result}

    async def _call_back(self, job: AcceptedJob, url: str, secret: str) -> None:
        """Once ``job`` is done, post its outcome to ``url``, signed with ``secret``."""
        dials = self.dials
        await trio.sleep_until(job.accepted_at + dials.job_seconds)
        if job.cancelled:
            return
        body = json.dumps(self._outcome(job)).encode()
        timestamp = str(int(time.time()))
        headers = {
            "content-type": "application/json",
            dials.callback_timestamp_header: timestamp,
            dials.callback_signature_header: sign(secret, timestamp, body),
        }
        status = 0
        if dials.callback_drop_next > 0:
            dials.callback_drop_next -= 1
        elif self._client is not None:
            try:
                async with self._sending:
                    response = await self._client.post(url, content=body, headers=headers)
                status = response.status_code
            except httpx.HTTPError as exc:
                log.warning("fake upstream: callback not delivered: %s", exc)
                status = -1
        self.callbacks.append(SentCallback(job.id, url, body, headers, status))
        self._callbacks_changed.set()
        self._callbacks_changed = trio.Event()

    async def _cancel(self, job_id: str, send: Send) -> None:
        job = self._jobs.get(job_id)
        if job is None:
            await _answer(send, 404, {"error": {"message": f"no job {job_id}"}})
            return
        job.cancelled = True
        await _answer(send, 200, {"id": job.id, "status": "cancelled"})


async def _lifespan(receive: Receive, send: Send) -> None:
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return


async def _answer(
    send: Send, status: int, body: Any, extra: list[tuple[str, str]] | None = None
) -> None:
    data = json.dumps(body).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())]
    headers += [(k.encode(), v.encode()) for k, v in extra or []]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": data})


async def _drop(mode: str, receive: Receive, send: Send) -> None:
    """Lose the answer: cut the connection mid-answer (``reset``: the server promises a body
    it never sends, so the connection is closed under the client), or send nothing until the
    client disconnects (``hang``)."""
    if mode == "hang":
        while (await receive())["type"] != "http.disconnect":
            pass
        return
    await send(
        {"type": "http.response.start", "status": 201, "headers": [(b"content-length", b"64")]}
    )
    await send({"type": "http.response.body", "body": b'{"id": "', "more_body": False})


def fake_http_model(
    base_url: str,
    model: str = "fake-model",
    *,
    idempotent: bool = False,
    **overrides: Any,
) -> HttpModel:
    """The :class:`HttpModel` of a :class:`FakeUpstream` at ``base_url``: the payload is the
    body, ``idempotent`` sends the ``Idempotency-Key`` header; ``overrides`` set any other
    field (``read_timeout=0.5`` …). With a ``callback`` (an :class:`HttpCallback`) the submit
    request also sends ``{{ callback_url }}`` in the ``X-Callback-Url`` header."""
    fields: dict[str, Any] = {
        "model": model,
        "submit": HttpRequestSpec(url=f"{base_url}/jobs", body="{{ payload }}"),
        "poll": HttpRequestSpec(url=f"{base_url}/jobs/{{{{ upstream_id }}}}", method="GET"),
        "cancel": HttpRequestSpec(url=f"{base_url}/jobs/{{{{ upstream_id }}}}/cancel"),
        "poll_interval": 0.05,
        "error_path": "error.message",
        "progress_path": "progress",
        "idempotency_header": "Idempotency-Key" if idempotent else None,
    }
    fields.update(overrides)
    callback = fields.get("callback")
    if callback is not None and "submit" not in overrides:
        callback = callback if isinstance(callback, HttpCallback) else HttpCallback(**callback)
        fields["submit"] = HttpRequestSpec(
            url=f"{base_url}/jobs",
            body="{{ payload }}",
            headers={CALLBACK_URL_HEADER: "{{ callback_url }}"},
        )
    return HttpModel(**fields)


@asynccontextmanager
async def serve_upstream(
    app: Any, *, host: str = "127.0.0.1", port: int = 0, sock: socket.socket | None = None
) -> AsyncIterator[str]:
    """Serve the ASGI ``app`` on a real socket for the block; yields its base URL.

    Args:
        app: the ASGI application (a :class:`FakeUpstream`).
        host, port: where to listen (port 0: any free port).
        sock: a socket bound already (listened on here), e.g. one that refused connections
            until now.
    """
    if sock is None:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
    sock.listen(128)
    sock.setblocking(False)
    bound_host, bound_port = sock.getsockname()[:2]
    config = Config()
    config.accesslog = None
    config.errorlog = logging.getLogger(__name__ + ".server")
    config.graceful_timeout = 0.5
    sockets = Sockets(secure_sockets=[], insecure_sockets=[sock], quic_sockets=[])
    served = wrap_app(app, config.wsgi_max_body_size, "asgi")
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(
                lambda task_status: worker_serve(
                    served, config, sockets=sockets, task_status=task_status
                )
            )
            yield f"http://{bound_host}:{bound_port}"
            nursery.cancel_scope.cancel()
    finally:
        sock.close()
