"""What an HTTP failure means to the engine: the classification of the HTTP provider kit.

Submit (the engine may run the job twice if it gets this wrong, so doubt is ambiguous):

====================================================  ===========================================
the request never left: connect error (refused,       :class:`NotSubmitted`: safe to submit again
unreachable, name not resolved), connect timeout,
no free pooled connection; HTTP 408
HTTP 429, HTTP 503 (``Retry-After`` read)             :class:`UpstreamBusy`: nothing accepted
a timeout or a reset after the request was sent       :class:`AmbiguousSubmission`
(read/write timeout, connection closed or broken
mid-exchange, malformed answer)
HTTP 5xx but 503                                      :class:`AmbiguousSubmission` (the model's
                                                      idempotency decides whether it is retried)
HTTP 409 on an idempotent model (the key's first      :class:`AmbiguousSubmission`
request is still in progress)
HTTP 4xx                                              :class:`ProviderError` with the upstream's
                                                      message (``code: upstream_rejected``)
a request the client cannot even make (bad URL,       :class:`ProviderError`
unsupported scheme)                                   (``code: invalid_request``)
HTTP 2xx with no id at ``id_path``, or not JSON       :class:`AmbiguousSubmission`
anything else                                         :class:`AmbiguousSubmission`
====================================================  ===========================================

Poll (safe to repeat): transport errors, 408, 429, 5xx are :class:`TransientPollFailure`
(retried with backoff and jitter, ``Retry-After`` honoured); any other 4xx, or a request that
cannot be made, is a :class:`ProviderError`.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from typing import Any

import httpx

from engine.providers.base import AmbiguousSubmission, NotSubmitted, ProviderError, UpstreamBusy
from engine.providers.http.description import HttpModel
from engine.providers.http.template import is_missing, read_path

__all__ = [
    "TransientPollFailure",
    "poll_exception",
    "poll_response_problem",
    "retry_after",
    "submit_exception",
    "submit_response_id",
    "upstream_message",
]

#: Characters of an upstream's answer kept in a message.
_MESSAGE_LIMIT = 500

#: Transport errors raised before any byte of the request was sent.
_NEVER_SENT = (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout)
#: Requests the client cannot make at all: retrying changes nothing.
_UNSENDABLE = (httpx.UnsupportedProtocol, httpx.InvalidURL, httpx.LocalProtocolError)


class TransientPollFailure(Exception):
    """A poll failed in a way worth repeating; ``retry_after`` is the upstream's wish, if any."""

    def __init__(self, message: str, *, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after


def retry_after(response: httpx.Response, *, default: float, cap: float) -> float:
    """Seconds the upstream asks to wait (``Retry-After``: seconds or an HTTP date), else
    ``default``; never below 0 nor above ``cap``."""
    raw = response.headers.get("retry-after")
    seconds: float | None = None
    if raw is not None:
        raw = raw.strip()
        try:
            seconds = float(raw)
        except ValueError:
            try:
                when = parsedate_to_datetime(raw)
            except (TypeError, ValueError):
                when = None
            if when is not None:
                if when.tzinfo is None:
                    when = when.replace(tzinfo=UTC)
                seconds = (when - datetime.now(UTC)).total_seconds()
    if seconds is None or seconds != seconds:  # absent, unreadable or NaN
        seconds = default
    return min(cap, max(0.0, seconds))


def _json(response: httpx.Response) -> Any:
    try:
        return response.json()
    except (json.JSONDecodeError, UnicodeDecodeError):
        return None


def upstream_message(response: httpx.Response, error_path: str) -> str:
    """``HTTP 422: <the upstream's message>``: the text at ``error_path`` of a JSON answer (an
    object there is shown as JSON), else the start of the body."""
    message: str | None = None
    body = _json(response)
    if body is not None:
        found = read_path(body, error_path)
        if not is_missing(found) and found is not None:
            message = found if isinstance(found, str) else json.dumps(found)
    if message is None:
        message = response.text.strip()
    if len(message) > _MESSAGE_LIMIT:
        message = message[:_MESSAGE_LIMIT] + "…"
    status = f"HTTP {response.status_code}"
    return f"{status}: {message}" if message else status


def submit_exception(exc: httpx.HTTPError | httpx.InvalidURL) -> Exception:
    """The engine's answer for a submit that raised ``exc`` (see the module table)."""
    if isinstance(exc, _NEVER_SENT):
        return NotSubmitted(f"the request did not reach the upstream: {_describe(exc)}")
    if isinstance(exc, _UNSENDABLE):
        return ProviderError(
            f"the request cannot be sent: {_describe(exc)}", code="invalid_request"
        )
    return AmbiguousSubmission(f"the answer was lost after the request was sent: {_describe(exc)}")


def submit_response_id(model: HttpModel, response: httpx.Response) -> str:
    """The upstream's id of the job a submit answer started.

    Raises:
        NotSubmitted, UpstreamBusy, AmbiguousSubmission, ProviderError: see the module table.
    """
    status = response.status_code
    if 200 <= status < 300:
        body = _json(response)
        found = None if body is None else read_path(body, model.id_path)
        if is_missing(found) or isinstance(found, bool) or not isinstance(found, str | int):
            found = None
        if found is None or found == "":
            raise AmbiguousSubmission(
                f"the upstream accepted the request (HTTP {status}) but its answer has no id "
                f"at {model.id_path!r}"
            )
        return str(found)
    message = upstream_message(response, model.error_path)
    if status in (429, 503):
        delay = retry_after(response, default=model.busy_delay, cap=model.max_retry_after)
        raise UpstreamBusy(f"the upstream is busy ({message})", retry_after=delay)
    if status == 408:
        raise NotSubmitted(f"the upstream did not take the request ({message})")
    if status == 409 and model.idempotent:
        raise AmbiguousSubmission(f"the key's first submission is still in progress ({message})")
    if 400 <= status < 500:
        raise ProviderError(message, code="upstream_rejected")
    raise AmbiguousSubmission(f"the upstream's answer says nothing certain ({message})")


def poll_exception(exc: httpx.HTTPError | httpx.InvalidURL) -> Exception:
    """The answer for a poll that raised ``exc``: transient unless the request cannot be made."""
    if isinstance(exc, _UNSENDABLE):
        return ProviderError(f"the poll cannot be sent: {_describe(exc)}", code="invalid_request")
    return TransientPollFailure(f"poll failed: {_describe(exc)}")


def poll_response_problem(model: HttpModel, response: httpx.Response) -> Exception | None:
    """None for a 2xx poll answer; else the failure it is (transient, or a ProviderError)."""
    status = response.status_code
    if 200 <= status < 300:
        return None
    message = upstream_message(response, model.error_path)
    if status in (408, 429) or status >= 500:
        delay = None
        if status in (429, 503):
            delay = retry_after(response, default=model.busy_delay, cap=model.max_retry_after)
        return TransientPollFailure(f"poll failed ({message})", retry_after=delay)
    return ProviderError(f"the upstream refused the poll ({message})", code="upstream_rejected")


def _describe(exc: BaseException) -> str:
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
