"""The provider an :class:`~engine.providers.http.description.HttpModel` describes, on httpx.

``prepare`` renders the submit request from the task (nothing is sent), ``submit`` sends it
and reads the job's id, ``poll`` asks how the job is doing, retrying transient failures with
backoff and jitter, ``finalize`` hands back the result the poll read, and ``cancel`` sends the
cancel request if the model has one. Every failure is classified by
:mod:`engine.providers.http.classify`.

A provider made without a client makes its own: the service opens it once at start through
:meth:`HttpProvider.lifespan` and closes it at shutdown (outside a service,
:meth:`HttpProvider.aclose` or ``async with`` close it); :func:`open_http_providers` shares one
client between the providers of several models, for the ``app`` setting.

A model with a ``callback`` section finishes by callback: the submit request carries
``{{ callback_url }}``, :meth:`HttpProvider.parse_callback` verifies and reads what the
upstream posts to it, and the engine polls only every ``callback.poll_interval`` seconds
meanwhile. Progress read at the model's ``progress_path`` is reported to the task
(``engine.current_task_context().report_progress``).
"""

from __future__ import annotations

import json
import logging
import os
import random
import time
from collections.abc import AsyncIterator, Iterable, Mapping
from contextlib import asynccontextmanager
from types import TracebackType
from typing import Any

import attrs
import httpx
import trio

from engine.domain.tasks import Task
from engine.errors import ConfigError
from engine.providers.base import Callback, CallbackRefused, PollResult, ProviderError
from engine.providers.context import current_task_context
from engine.providers.http.classify import (
    TransientPollFailure,
    poll_exception,
    poll_response_problem,
    submit_exception,
    submit_response_id,
)
from engine.providers.http.description import HttpModel, HttpRequestSpec, StatusKind
from engine.providers.http.signing import verify
from engine.providers.http.template import (
    MissingValue,
    TemplateContext,
    idempotency_key,
    is_missing,
    read_path,
    render,
)

__all__ = ["HttpProvider", "PreparedRequest", "open_http_providers"]

log = logging.getLogger(__name__)

#: The longest backoff between two attempts of one poll, in seconds.
_MAX_POLL_BACKOFF = 30.0


@attrs.frozen
class PreparedRequest:
    """A request rendered for one task, ready to send (what ``prepare`` hands ``submit``)."""

    method: str
    url: str
    headers: Mapping[str, str]
    body: Any
    timeout: float


class HttpProvider:
    """A provider for one model of an HTTP upstream (see the package docstring).

    Args:
        model: the description.
        client: the httpx client to send with (shared, not closed here); None makes one.
        environ: where ``{{ env.NAME }}`` is read (``os.environ`` by default).
        rng: the random source of the poll backoff's jitter.

    Raises:
        ConfigError: the description has problems, or an environment variable it reads is
            not set (checked now, so a missing API key stops the start, not a task).
    """

    def __init__(
        self,
        model: HttpModel,
        client: httpx.AsyncClient | None = None,
        *,
        environ: Mapping[str, str] | None = None,
        rng: random.Random | None = None,
    ) -> None:
        self.environ = os.environ if environ is None else environ
        problems = [f"http model {model.model!r}: {p}" for p in model.problems()]
        problems += [
            f"http model {model.model!r}: environment variable {name} is not set"
            for name in sorted(model.env_names())
            if name not in self.environ
        ]
        if problems:
            raise ConfigError(problems)
        self.model = model
        #: Seconds between polls (the engine reads it).
        self.poll_interval = model.poll_interval
        #: Whether a repeated submission is recognised upstream: the engine then resubmits
        #: after an ambiguous answer (see engine.providers.base.submits_idempotently).
        self.idempotent_submit = model.idempotent
        #: Seconds between fallback polls while a callback is expected; None: the model's
        #: upstream does not call back (see engine.providers.base.callback_poll_interval).
        self.callback_poll_interval = (
            None if model.callback is None else model.callback.poll_interval
        )
        self._client = client
        self._owns_client = client is None
        self._rng = rng or random.Random()

    # ---- the client ---------------------------------------------------------------------------

    @property
    def client(self) -> httpx.AsyncClient:
        """The client requests go through (made on first use when none was given)."""
        if self._client is None:
            self._client = httpx.AsyncClient()
        return self._client

    @asynccontextmanager
    async def lifespan(self) -> AsyncIterator[httpx.AsyncClient]:
        """What the service enters once at start and exits at shutdown: opens the client
        (when this provider makes its own) and closes it on the way out; yields it (each
        task's ``TaskContext.resources``). A shared client is left to its owner."""
        client = self.client
        try:
            yield client
        finally:
            with trio.CancelScope(shield=True):
                await self.aclose()

    async def aclose(self) -> None:
        """Close the client if this provider made it."""
        if self._owns_client and self._client is not None:
            await self._client.aclose()
            self._client = None

    async def __aenter__(self) -> HttpProvider:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    # ---- requests -----------------------------------------------------------------------------

    def _render(
        self, spec: HttpRequestSpec, task: Task, upstream_id: str | None, *, submit: bool
    ) -> PreparedRequest:
        context = TemplateContext(
            task,
            upstream_id=upstream_id,
            environ=self.environ,
            callback_url=self._callback_url(task),
        )
        try:
            url = render(spec.url, context)
            headers = {k: str(v) for k, v in render(dict(spec.headers), context).items()}
            body = render(spec.body, context)
        except MissingValue as exc:
            raise ProviderError(
                f"cannot build the request for {self.model.model!r}: {exc}", code="invalid_payload"
            ) from None
        if submit and self.model.idempotency_header is not None:
            headers[self.model.idempotency_header] = idempotency_key(task)
        timeout = self.model.read_timeout if spec.timeout is None else spec.timeout
        return PreparedRequest(spec.method, str(url), headers, body, timeout)

    def _callback_url(self, task: Task) -> str | None:
        """Where the upstream calls back for ``task``: the model's ``callback.base_url``, or
        the engine's own hooks address (from the task's context); None without either."""
        callback = self.model.callback
        if callback is None:
            return None
        if callback.base_url is not None:
            base = render(callback.base_url, TemplateContext(task, environ=self.environ))
            return f"{str(base).rstrip('/')}/hooks/{task.id}"
        try:
            return current_task_context().callback_url
        except RuntimeError:
            return None

    async def _send(self, request: PreparedRequest) -> httpx.Response:
        return await self.client.request(
            request.method,
            request.url,
            headers=dict(request.headers),
            json=request.body,
            timeout=httpx.Timeout(
                request.timeout,
                connect=self.model.connect_timeout,
                pool=self.model.connect_timeout,
            ),
        )

    # ---- the provider methods -----------------------------------------------------------------

    async def prepare(self, task: Task) -> PreparedRequest:
        """Render the submit request from the task (nothing is sent).

        Raises:
            ProviderError: the payload lacks a value the body or URL needs
                (``code: invalid_payload``).
        """
        return self._render(self.model.submit, task, None, submit=True)

    async def submit(self, task: Task, prepared: PreparedRequest) -> str:
        """Send the submit request; the upstream's id of the job.

        Raises:
            NotSubmitted, UpstreamBusy, AmbiguousSubmission, ProviderError: as classified by
                :mod:`engine.providers.http.classify`.
        """
        try:
            response = await self._send(prepared)
        except (httpx.HTTPError, httpx.InvalidURL) as exc:
            raise submit_exception(exc) from exc
        return submit_response_id(self.model, response)

    async def poll(self, task: Task, upstream_ref: str) -> PollResult:
        """Ask how the job is doing; transient failures are retried here, up to the model's
        ``poll_retries`` in a row, with backoff and jitter (``Retry-After`` honoured).

        Raises:
            ProviderError: the upstream refused the poll (4xx), answered a status the
                mapping does not know, or kept failing (``code: poll_failed``).
        """
        request = self._render(self.model.poll, task, upstream_ref, submit=False)
        failures = 0
        while True:
            problem: Exception | None
            try:
                response = await self._send(request)
            except (httpx.HTTPError, httpx.InvalidURL) as exc:
                problem = poll_exception(exc)
            else:
                problem = poll_response_problem(self.model, response)
                if problem is None:
                    try:
                        polled = self._read_poll(response)
                    except TransientPollFailure as unreadable:
                        problem = unreadable
                    else:
                        if not polled.done and polled.progress is not None:
                            _report_progress(polled.progress)
                        return polled
            if not isinstance(problem, TransientPollFailure):
                raise problem
            failures += 1
            if failures > self.model.poll_retries:
                raise ProviderError(
                    f"{problem} ({failures} attempts in a row failed)", code="poll_failed"
                ) from problem
            delay = problem.retry_after
            if delay is None:
                base = min(_MAX_POLL_BACKOFF, self.model.poll_backoff * 2.0 ** (failures - 1))
                delay = base * (0.5 + self._rng.random())  # jitter: 50–150 %
            log.info(
                "upstream poll failed; retrying",
                extra={
                    "event": "http_poll_retry",
                    "model": self.model.model,
                    "task_id": str(task.id),
                    "error": str(problem),
                    "delay": delay,
                },
            )
            await trio.sleep(delay)

    def _read_poll(self, response: httpx.Response) -> PollResult:
        try:
            body = response.json()
        except ValueError:
            raise TransientPollFailure(
                f"poll answer is not JSON (HTTP {response.status_code})"
            ) from None
        model = self.model
        return self._read_answer(
            body,
            "poll answer",
            status_path=model.status_path,
            progress_path=model.progress_path,
            result_path=model.result_path,
            error_path=model.error_path,
        )

    def _read_answer(
        self,
        body: Any,
        what: str,
        *,
        status_path: str,
        progress_path: str | None,
        result_path: str,
        error_path: str,
    ) -> PollResult:
        """What a poll answer (or a callback body) says about the job."""
        status = read_path(body, status_path)
        if is_missing(status):
            raise ProviderError(
                f"the {what} has no status at {status_path!r}",
                code="upstream_unreadable",
            )
        kind = self.model.status_map.get(str(status))
        if kind is None:
            raise ProviderError(
                f"unknown upstream status {status!r} (not in the model's status_map)",
                code="upstream_unknown_status",
            )
        progress = None
        if progress_path is not None:
            found = read_path(body, progress_path)
            if isinstance(found, int | float) and not isinstance(found, bool):
                progress = min(1.0, max(0.0, float(found)))
        if kind is StatusKind.PENDING:
            return PollResult(done=False, progress=progress)
        if kind is StatusKind.SUCCEEDED:
            result = read_path(body, result_path)
            return PollResult(done=True, result=None if is_missing(result) else result)
        error = read_path(body, error_path)
        if is_missing(error) or error is None or error == "":
            message = f"the upstream reports {status!r}"
        else:
            message = error if isinstance(error, str) else str(error)
        return PollResult(done=True, error=message)

    def parse_callback(
        self, headers: Mapping[str, str], body: bytes, *, now: float | None = None
    ) -> Callback:
        """Verify a callback of this model's upstream and read it (``POST /hooks/<task id>``
        calls it): the signature and timestamp as the model's ``callback`` section says, then
        the job's id, status, progress, result and error at its paths (the poll's by
        default).

        Args:
            headers: the request's headers (looked up as given, then lower case).
            body: the request's body, exactly as received (the signature covers it).
            now: the Unix time to check the timestamp against (default: the clock).

        Raises:
            CallbackRefused: 401 for a missing or wrong signature or a timestamp outside the
                tolerance; 400 for a body that is not JSON or says no known status; 404 when
                the model takes no callbacks.
        """
        callback = self.model.callback
        if callback is None:
            raise CallbackRefused(f"model {self.model.model!r} takes no callbacks", status=404)
        delivery = verify(
            self.environ.get(callback.secret_env, ""),
            headers,
            body,
            signature_header=callback.signature_header,
            timestamp_header=callback.timestamp_header,
            tolerance=callback.tolerance,
            now=time.time() if now is None else now,
        )
        try:
            document = json.loads(body)
        except ValueError:
            raise CallbackRefused("the callback body is not JSON", status=400) from None
        model = self.model
        try:
            result = self._read_answer(
                document,
                "callback",
                status_path=callback.status_path or model.status_path,
                progress_path=callback.progress_path or model.progress_path,
                result_path=model.result_path
                if callback.result_path is None
                else callback.result_path,
                error_path=callback.error_path or model.error_path,
            )
        except ProviderError as exc:
            raise CallbackRefused(str(exc), status=400) from None
        found = read_path(document, callback.id_path or model.id_path)
        upstream_id = None if is_missing(found) or found is None else str(found)
        return Callback(result, delivery, upstream_id)

    async def finalize(self, task: Task, result: Any) -> Any:
        """The result the last poll read (at the model's ``result_path``)."""
        return result

    async def cancel(self, task: Task, upstream_ref: str) -> None:
        """Send the model's cancel request, if it has one (best effort: failures are logged)."""
        if self.model.cancel is None:
            return
        request = self._render(self.model.cancel, task, upstream_ref, submit=False)
        try:
            response = await self._send(request)
        except (httpx.HTTPError, httpx.InvalidURL) as exc:
            log.warning(
                "upstream cancel failed",
                extra={"event": "http_cancel_failed", "model": self.model.model, "error": str(exc)},
            )
            return
        if response.is_error:
            log.warning(
                "upstream refused the cancel",
                extra={
                    "event": "http_cancel_refused",
                    "model": self.model.model,
                    "status": response.status_code,
                },
            )


def _report_progress(fraction: float) -> None:
    """Report ``fraction`` to the running task, if the engine runs one here."""
    try:
        context = current_task_context()
    except RuntimeError:
        return  # called outside the engine (a test calling poll directly)
    context.report_progress(fraction)


@asynccontextmanager
async def open_http_providers(
    models: Iterable[HttpModel],
    *,
    client: httpx.AsyncClient | None = None,
    environ: Mapping[str, str] | None = None,
) -> AsyncIterator[dict[str, HttpProvider]]:
    """The providers of ``models`` by model name, sharing one client (``client``, or one made
    here and closed on the way out): what the ``app`` setting takes, e.g.::

        def providers():  # app = "myapp.upstreams:providers"
            return open_http_providers(load_http_models("upstreams.toml"))

    Raises:
        ConfigError: every problem of every model at once (duplicate names included).
    """
    models = list(models)
    problems: list[str] = []
    seen: set[str] = set()
    for model in models:
        if model.model in seen:
            problems.append(f"http model {model.model!r}: described twice")
        seen.add(model.model)
    shared = client or httpx.AsyncClient()
    try:
        providers: dict[str, HttpProvider] = {}
        for model in models:
            try:
                providers[model.model] = HttpProvider(model, shared, environ=environ)
            except ConfigError as exc:
                problems += exc.problems
        if problems:
            raise ConfigError(problems)
        yield providers
    finally:
        if client is None:
            with trio.CancelScope(shield=True):
                await shared.aclose()
