"""The HTTP provider kit: a provider for an upstream HTTP API from a description, no code.

Most upstreams of a generation gateway work the same way: a POST starts a job and answers its
id, and a GET on the job says how it is doing until it is done. :class:`HttpModel` describes
one model's upstream (the requests, where the id, status, progress, result and error are in
the answers, the status mapping, timeouts, and whether the upstream honours an idempotency
key); :class:`HttpProvider` runs it on httpx (which runs on trio), classifying every failure
the way the engine needs it (:mod:`engine.providers.http.classify`):

=========================================  ==============================================
what happened on submit                    the provider raises
=========================================  ==============================================
connect error, name not resolved, 408      ``NotSubmitted``: safe to submit again
429, 503 (``Retry-After`` honoured)        ``UpstreamBusy``: the model is held back
timeout or reset after the request left    ``AmbiguousSubmission``
5xx (other than 503)                       ``AmbiguousSubmission`` (resubmitted with the
                                           same key when the model is idempotent)
4xx                                        ``ProviderError`` with the upstream's message
2xx without an id at ``id_path``           ``AmbiguousSubmission``
=========================================  ==============================================

Polls are safe to repeat: a transient failure is retried with backoff and jitter. Models come
from Python (``HttpModel(...)``) or from ``[[http_models]]`` tables in a TOML file
(:func:`load_http_models`); :func:`open_http_providers` opens one shared client for them and
yields the mapping the ``app`` setting wants. :mod:`engine.providers.http.fake` is an upstream
of this shape for tests and benchmarks. A model with an :class:`HttpCallback` section finishes
by signed callback (``POST /hooks/<task id>``), polling only as a slow fallback. See
docs/http-providers.md.
"""

from typing import TYPE_CHECKING, Any

from engine.providers.http.description import (
    HttpCallback,
    HttpModel,
    HttpRequestSpec,
    StatusKind,
    http_model_from_table,
    http_models_from_tables,
    load_http_models,
)

if TYPE_CHECKING:
    from engine.providers.http.provider import HttpProvider, open_http_providers


def __getattr__(name: str) -> Any:
    # The providers (and httpx) load on first use: the configuration reads descriptions at
    # every start, most of which serve no HTTP model.
    if name in ("HttpProvider", "open_http_providers"):
        from engine.providers.http import provider

        return getattr(provider, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

__all__ = [
    "HttpCallback",
    "HttpModel",
    "HttpProvider",
    "HttpRequestSpec",
    "StatusKind",
    "http_model_from_table",
    "http_models_from_tables",
    "load_http_models",
    "open_http_providers",
]
