"""What an HTTP model is: :class:`HttpModel`, built in Python or read from TOML tables.

In TOML, one ``[[http_models]]`` table per model (in a file of its own, read by
:func:`load_http_models`; the engine's own configuration file does not take this table)::

    [[http_models]]
    model = "acme-video"
    poll_interval = 10
    idempotency_header = "Idempotency-Key"
    id_path = "job.id"
    status_path = "status"
    progress_path = "progress"
    result_path = "output"
    error_path = "error.message"
    status_map = { queued = "pending", running = "pending", done = "succeeded", error = "failed" }

    [http_models.submit]
    url = "https://api.acme.example/v1/jobs"
    headers = { Authorization = "Bearer {{ env.ACME_API_KEY }}" }
    body = { prompt = "{{ payload.prompt }}", seconds = "{{ payload.seconds }}" }

    [http_models.poll]
    method = "GET"
    url = "https://api.acme.example/v1/jobs/{{ upstream_id }}"
    headers = { Authorization = "Bearer {{ env.ACME_API_KEY }}" }

    [http_models.callback]            # optional: the upstream calls back when a job ends
    secret_env = "ACME_WEBHOOK_SECRET"
    base_url = "{{ env.ENGINE_PUBLIC_URL }}"
    poll_interval = 60

(with ``callback_url = "{{ callback_url }}"`` in the submit body). Templates are described in
:mod:`engine.providers.http.template`.
"""

from __future__ import annotations

import enum
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs

from engine.errors import ConfigError
from engine.providers.http.template import ROOTS, names_in

__all__ = [
    "HttpCallback",
    "HttpModel",
    "HttpRequestSpec",
    "StatusKind",
    "http_model_from_table",
    "http_models_from_tables",
    "load_http_models",
]

_METHODS = frozenset({"GET", "POST", "PUT", "PATCH", "DELETE"})


class StatusKind(enum.StrEnum):
    """What an upstream status means to the engine: keep polling, or done either way."""

    PENDING = "pending"
    SUCCEEDED = "succeeded"
    FAILED = "failed"


#: The status mapping of a model that does not give one.
DEFAULT_STATUS_MAP: Mapping[str, StatusKind] = {
    "queued": StatusKind.PENDING,
    "pending": StatusKind.PENDING,
    "running": StatusKind.PENDING,
    "processing": StatusKind.PENDING,
    "succeeded": StatusKind.SUCCEEDED,
    "completed": StatusKind.SUCCEEDED,
    "failed": StatusKind.FAILED,
    "error": StatusKind.FAILED,
}


def _status_map(value: Mapping[str, Any]) -> Mapping[str, StatusKind]:
    return {str(k): StatusKind(v) for k, v in value.items()}


def _upper(value: str) -> str:
    return value.upper()


def _headers(value: Mapping[str, Any]) -> Mapping[str, str]:
    return {str(k): str(v) for k, v in value.items()}


@attrs.frozen
class HttpRequestSpec:
    """One request of a model: method, URL and headers (templates), and a JSON body template.

    Attributes:
        url: the URL template (``…/jobs/{{ upstream_id }}`` for a poll).
        method: the HTTP method.
        headers: header templates; secrets come from ``{{ env.NAME }}``.
        body: the JSON body template, or None for no body.
        timeout: seconds to wait for the answer once the request is sent (None: the model's
            ``read_timeout``).
    """

    url: str
    method: str = attrs.field(default="POST", converter=_upper)
    headers: Mapping[str, str] = attrs.field(factory=dict, converter=_headers)
    body: Any = None
    timeout: float | None = None

    def names(self) -> set[str]:
        """Every template name the request uses."""
        return names_in(self.url) | names_in(dict(self.headers)) | names_in(self.body)


#: The longest timestamp tolerance of a callback: its delivery is remembered (to refuse a
#: replay) for a day, so a tolerance beyond that would let an old delivery through again.
MAX_CALLBACK_TOLERANCE = 86_400.0


@attrs.frozen
class HttpCallback:
    """How an upstream that calls back when a job ends is heard (``POST /hooks/<task id>``).

    The submit request tells the upstream where to call: ``{{ callback_url }}`` in its body or
    headers is ``<base_url>/hooks/<task id>``. The callback is signed: an HMAC-SHA256 of
    ``timestamp + "." + body`` under the secret (:mod:`engine.providers.http.signing`).

    Attributes:
        secret_env: the environment variable holding the shared secret.
        signature_header: the header carrying the hex signature (``sha256=`` prefix allowed).
        timestamp_header: the header carrying the Unix time it was signed at.
        tolerance: seconds a timestamp may be off (old or ahead); at most a day.
        id_path: where the job's id is in the callback body (None: the model's ``id_path``);
            a callback about another job than the task's is ignored.
        status_path, progress_path, result_path, error_path: where those are in the callback
            body (None: the model's, as for a poll answer).
        poll_interval: seconds between the fallback polls while a callback is expected
            (instead of the model's ``poll_interval``), so a lost callback never strands a
            task.
        base_url: the engine's address as the upstream reaches it (a template: ``{{ env.X
            }}``); None: the address this process serves its HTTP server on
            (``metrics.host``, ``metrics.port``).
    """

    secret_env: str
    signature_header: str = "X-Webhook-Signature"
    timestamp_header: str = "X-Webhook-Timestamp"
    tolerance: float = 300.0
    id_path: str | None = None
    status_path: str | None = None
    progress_path: str | None = None
    result_path: str | None = None
    error_path: str | None = None
    poll_interval: float = 60.0
    base_url: str | None = None

    def problems(self) -> list[str]:
        """What is wrong with this section (empty when it can run)."""
        found: list[str] = []
        if not self.secret_env:
            found.append("callback.secret_env: must name an environment variable")
        if not 0 < self.tolerance <= MAX_CALLBACK_TOLERANCE:
            found.append(f"callback.tolerance: must be > 0 and <= {MAX_CALLBACK_TOLERANCE:g}")
        if self.poll_interval < 0:
            found.append("callback.poll_interval: must be >= 0")
        for header in ("signature_header", "timestamp_header"):
            if not getattr(self, header):
                found.append(f"callback.{header}: must be a header name")
        for used in sorted(names_in(self.base_url)):
            if used.partition(".")[0] != "env":
                found.append(f"callback.base_url: only {{{{ env.NAME }}}} may be used, not {used}")
        return found


def _callback(value: Any) -> HttpCallback | None:
    if value is None or isinstance(value, HttpCallback):
        return value
    return HttpCallback(**value)


@attrs.frozen
class HttpModel:
    """How one model's upstream is called and read (see the module docstring for TOML).

    Attributes:
        model: the model name tasks give (the key of the provider mapping).
        submit: the request that starts a job.
        poll: the request that asks how it is doing (``{{ upstream_id }}`` names the job).
        cancel: the request that stops it, if the upstream has one.
        id_path: where the job's id is in the submit answer (dotted path).
        status_path: where the status is in the poll answer.
        status_map: upstream status → pending / succeeded / failed; a status missing from
            it fails the task (a mapping that does not know it would poll forever).
        progress_path: where a 0..1 progress is in the poll answer, if anywhere.
        result_path: the part of a succeeded poll answer that is the result ("" = all of it).
        error_path: where the upstream's message is in a failed poll or a 4xx answer.
        poll_interval: seconds between polls.
        connect_timeout: seconds to open a connection (then: not submitted, safe to retry).
        read_timeout: seconds to wait for an answer once the request is sent.
        idempotency_header: the header the upstream reads an idempotency key from; set, the
            engine sends the task's key on every submission and resubmits after an
            ambiguous answer (``idempotent`` then defaults to True).
        idempotent: the upstream recognises a repeated submission of the task (by the header,
            or by a key the body template carries as ``{{ idempotency_key }}``).
        busy_delay: seconds to hold back after a 429 or 503 without ``Retry-After``.
        max_retry_after: the longest ``Retry-After`` honoured, in seconds.
        poll_retries: transient poll failures in a row before the task fails.
        poll_backoff: first backoff between those retries (doubling, with jitter).
        callback: how the upstream calls back when a job ends, if it does
            (:class:`HttpCallback`); polls then come every ``callback.poll_interval``.
    """

    model: str
    submit: HttpRequestSpec
    poll: HttpRequestSpec
    cancel: HttpRequestSpec | None = None
    id_path: str = "id"
    status_path: str = "status"
    status_map: Mapping[str, StatusKind] = attrs.field(
        factory=lambda: dict(DEFAULT_STATUS_MAP), converter=_status_map
    )
    progress_path: str | None = None
    result_path: str = "result"
    error_path: str = "error"
    poll_interval: float = 5.0
    connect_timeout: float = 5.0
    read_timeout: float = 30.0
    idempotency_header: str | None = None
    idempotent: bool = attrs.field()
    busy_delay: float = 1.0
    max_retry_after: float = 300.0
    poll_retries: int = 8
    poll_backoff: float = 0.5
    callback: HttpCallback | None = attrs.field(default=None, converter=_callback)

    @idempotent.default
    def _idempotent_default(self) -> bool:
        return self.idempotency_header is not None

    def problems(self) -> list[str]:
        """What is wrong with this description (empty when it can run)."""
        found: list[str] = []
        if not self.model:
            found.append("model: must be a non-empty name")
        for name, spec in (("submit", self.submit), ("poll", self.poll), ("cancel", self.cancel)):
            if spec is None:
                continue
            if spec.method not in _METHODS:
                found.append(f"{name}.method = {spec.method!r}: one of {sorted(_METHODS)}")
            if not spec.url:
                found.append(f"{name}.url: must be set")
            for used in sorted(spec.names()):
                root = used.partition(".")[0]
                if root not in ROOTS:
                    found.append(f"{name}: unknown template value {{{{ {used} }}}}")
                elif root == "upstream_id" and name == "submit":
                    found.append("submit: {{ upstream_id }} is known only after the submit")
                elif root == "callback_url" and self.callback is None:
                    found.append(
                        f"{name}: {{{{ callback_url }}}} needs a callback section (how the "
                        "upstream's callbacks are verified)"
                    )
        if "upstream_id" not in self.poll.names():
            found.append("poll: the URL, headers or body must use {{ upstream_id }}")
        for name in ("poll_interval", "connect_timeout", "read_timeout", "busy_delay"):
            if getattr(self, name) < 0:
                found.append(f"{name}: must be >= 0")
        if self.max_retry_after <= 0:
            found.append("max_retry_after: must be > 0")
        if self.poll_retries < 0:
            found.append("poll_retries: must be >= 0")
        if self.callback is not None:
            found += self.callback.problems()
        return found

    def env_names(self) -> set[str]:
        """The environment variables the requests read (checked when the provider is made)."""
        specs = [s for s in (self.submit, self.poll, self.cancel) if s is not None]
        names = {
            used.partition(".")[2]
            for spec in specs
            for used in spec.names()
            if used.startswith("env.")
        }
        if self.callback is not None:
            names.add(self.callback.secret_env)
            names |= {
                used.partition(".")[2]
                for used in names_in(self.callback.base_url)
                if used.startswith("env.")
            }
        return names


_SPEC_KEYS = frozenset(a.name for a in attrs.fields(HttpRequestSpec))
_MODEL_KEYS = frozenset(a.name for a in attrs.fields(HttpModel))
_SPECS = ("submit", "poll", "cancel")
_NUMBERS = {
    "poll_interval",
    "connect_timeout",
    "read_timeout",
    "busy_delay",
    "max_retry_after",
    "poll_backoff",
}
_TEXTS = {"model", "id_path", "status_path", "progress_path", "result_path", "error_path"}
_CALLBACK_KEYS = frozenset(a.name for a in attrs.fields(HttpCallback))
_CALLBACK_NUMBERS = {"tolerance", "poll_interval"}


def _callback_from_table(table: object, where: str, problems: list[str]) -> HttpCallback | None:
    if not isinstance(table, Mapping):
        problems.append(f"{where}: must be a table")
        return None
    problems += [f"{where}.{k}: unknown key" for k in table if k not in _CALLBACK_KEYS]
    values = {k: v for k, v in table.items() if k in _CALLBACK_KEYS}
    for name, value in list(values.items()):
        if name in _CALLBACK_NUMBERS:
            if isinstance(value, bool) or not isinstance(value, int | float):
                problems.append(f"{where}.{name}: must be a number of seconds")
                del values[name]
        elif not isinstance(value, str):
            problems.append(f"{where}.{name}: must be a string")
            del values[name]
    if "secret_env" not in values:
        if "secret_env" not in table:
            problems.append(f"{where}.secret_env: must be set")
        return None
    return HttpCallback(**values)


def _spec_from_table(table: object, where: str, problems: list[str]) -> HttpRequestSpec | None:
    if not isinstance(table, Mapping):
        problems.append(f"{where}: must be a table")
        return None
    problems += [f"{where}.{k}: unknown key" for k in table if k not in _SPEC_KEYS]
    values = {k: v for k, v in table.items() if k in _SPEC_KEYS}
    if not isinstance(values.get("url"), str):
        problems.append(f"{where}.url: must be a string")
        return None
    if not isinstance(values.get("method", ""), str):
        problems.append(f"{where}.method: must be a string")
        values.pop("method")
    if not isinstance(values.get("headers", {}), Mapping):
        problems.append(f"{where}.headers: must be a table of strings")
        values.pop("headers")
    timeout = values.get("timeout")
    if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, int | float)):
        problems.append(f"{where}.timeout: must be a number of seconds")
        values.pop("timeout")
    return HttpRequestSpec(**values)


def http_model_from_table(table: object, where: str) -> tuple[HttpModel | None, list[str]]:
    """An :class:`HttpModel` from an ``[[http_models]]`` table, or None and the problems
    found (each naming ``where`` and the key)."""
    if not isinstance(table, Mapping):
        return None, [f"{where}: must be a table; write [[http_models]] and its keys under it"]
    problems = [f"{where}.{k}: unknown key" for k in table if k not in _MODEL_KEYS]
    values: dict[str, Any] = {k: v for k, v in table.items() if k in _MODEL_KEYS}
    for name in _SPECS:
        if name in values:
            values[name] = _spec_from_table(values[name], f"{where}.{name}", problems)
    if "callback" in values:
        values["callback"] = _callback_from_table(values["callback"], f"{where}.callback", problems)
    for required in ("model", "submit", "poll"):
        if values.get(required) is None:
            if required not in table:
                problems.append(f"{where}.{required}: must be set")
            values.pop(required, None)
    for name in _NUMBERS & values.keys():
        if isinstance(values[name], bool) or not isinstance(values[name], int | float):
            problems.append(f"{where}.{name}: must be a number")
            del values[name]
    for name in _TEXTS & values.keys():
        if not isinstance(values[name], str):
            problems.append(f"{where}.{name}: must be a string")
            del values[name]
    if "idempotent" in values and not isinstance(values["idempotent"], bool):
        problems.append(f"{where}.idempotent: true or false")
        del values["idempotent"]
    if "poll_retries" in values and (
        isinstance(values["poll_retries"], bool) or not isinstance(values["poll_retries"], int)
    ):
        problems.append(f"{where}.poll_retries: must be an integer")
        del values["poll_retries"]
    status_map = values.get("status_map")
    if status_map is not None:
        kinds = {k.value for k in StatusKind}
        if not isinstance(status_map, Mapping) or any(v not in kinds for v in status_map.values()):
            problems.append(f"{where}.status_map: a table of status = pending|succeeded|failed")
            del values["status_map"]
    if problems or not {"model", "submit", "poll"} <= values.keys():
        return None, problems
    model = HttpModel(**values)
    return model, [f"{where}.{p}" for p in model.problems()]


def http_models_from_tables(tables: object, origin: str) -> tuple[list[HttpModel], list[str]]:
    """The models of an ``http_models`` array of tables, and every problem found (a model
    with problems is left out; duplicate model names are a problem)."""
    if not isinstance(tables, list):
        return [], [f"http_models ({origin}): must be an array of tables; write [[http_models]]"]
    models: list[HttpModel] = []
    problems: list[str] = []
    for n, table in enumerate(tables):
        name = table.get("model") if isinstance(table, Mapping) else None
        where = f"http_models[{n}]" + (f" ({name})" if isinstance(name, str) and name else "")
        model, found = http_model_from_table(table, where)
        problems += [f"{p} ({origin})" for p in found]
        if model is not None and not found:
            models.append(model)
    seen: set[str] = set()
    for model in models:
        if model.model in seen:
            problems.append(f"http_models: model {model.model!r} is described twice ({origin})")
        seen.add(model.model)
    return models, problems


def load_http_models(path: str | Path) -> list[HttpModel]:
    """The ``[[http_models]]`` of the TOML file at ``path``.

    Raises:
        ConfigError: the file cannot be read, is not TOML, or describes a model wrongly
            (every problem at once).
    """
    path = Path(path)
    try:
        with path.open("rb") as file:
            data = tomllib.load(file)
    except OSError as exc:
        raise ConfigError([f"{path}: cannot read the HTTP models: {exc.strerror or exc}"]) from exc
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError([f"{path}: not valid TOML: {exc}"]) from exc
    models, problems = http_models_from_tables(data.get("http_models", []), f"from {path}")
    problems += [f"{k} (from {path}): unknown key" for k in data if k != "http_models"]
    if problems:
        raise ConfigError(problems)
    return models
