"""Templates of the HTTP kit's requests, and dotted paths into JSON answers.

A template is any JSON value (a URL, a header value, a request body). In its strings,
``{{ name }}`` is replaced with a value from the context:

=====================  ==================================================================
``payload.a.b``        the task's payload, by dotted path (list items by index: ``x.0``)
``task.id``            the task id (also ``task.model``, ``task.group_key``)
``idempotency_key``    the key derived from the task (:func:`idempotency_key`)
``upstream_id``        the upstream's id of the job (poll and cancel requests)
``callback_url``       where the upstream calls back to finish the task (models with a
                       ``callback`` section): ``<base>/hooks/<task id>``
``env.NAME``           the environment variable ``NAME`` (secrets: API keys, tokens)
=====================  ==================================================================

A string that is a single ``{{ … }}`` and nothing else takes the value itself, with its JSON
type (``"{{ payload.steps }}"`` stays a number); inside a longer string the value is written
as text. ``{{{{`` is a literal ``{{``.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from typing import Any

from engine.domain.tasks import Task

__all__ = [
    "MissingValue",
    "TemplateContext",
    "idempotency_key",
    "is_missing",
    "names_in",
    "read_path",
    "render",
]

_FIELD = re.compile(r"\{\{\s*([A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z0-9_-]+)*)\s*\}\}")
_ONLY = re.compile(r"\s*" + _FIELD.pattern + r"\s*")
_ESCAPED = "\x00"
#: The names a template may start with.
ROOTS = frozenset({"payload", "task", "idempotency_key", "upstream_id", "env", "callback_url"})
_TASK_FIELDS = frozenset({"id", "model", "group_key"})
_MISSING = object()


class MissingValue(LookupError):
    """A template names a value the context does not have (e.g. a payload key)."""


def idempotency_key(task: Task) -> str:
    """The idempotency key of ``task``'s submissions: its id, the same in every attempt and on
    every instance, so a repeated submission names the same upstream job."""
    return str(task.id)


class TemplateContext:
    """The values a template may name, for one task (and its upstream job, once known)."""

    def __init__(
        self,
        task: Task,
        *,
        upstream_id: str | None = None,
        environ: Mapping[str, str] | None = None,
        callback_url: str | None = None,
    ) -> None:
        self.task = task
        self.upstream_id = upstream_id
        self.environ = os.environ if environ is None else environ
        self.callback_url = callback_url

    def lookup(self, name: str) -> Any:
        """The value of ``name`` (``payload.prompt``, ``env.API_KEY`` …).

        Raises:
            MissingValue: there is no such value.
        """
        root, _, rest = name.partition(".")
        if root == "payload":
            value = read_path(self.task.payload, rest) if rest else self.task.payload
            if value is _MISSING:
                raise MissingValue(f"the task's payload has no {rest!r}")
            return value
        if root == "task" and rest in _TASK_FIELDS:
            value = getattr(self.task, rest)
            return str(value) if rest == "id" else value
        if root == "idempotency_key" and not rest:
            return idempotency_key(self.task)
        if root == "upstream_id" and not rest:
            if self.upstream_id is None:
                raise MissingValue("no upstream id yet (only poll and cancel requests have one)")
            return self.upstream_id
        if root == "callback_url" and not rest:
            if self.callback_url is None:
                raise MissingValue(
                    "no callback URL: set the model's callback.base_url, or run the task in an "
                    "engine that serves /hooks/ (its HTTP server)"
                )
            return self.callback_url
        if root == "env" and rest:
            try:
                return self.environ[rest]
            except KeyError:
                raise MissingValue(f"environment variable {rest} is not set") from None
        raise MissingValue(f"unknown template value {name!r}")


def render(template: Any, context: TemplateContext) -> Any:
    """``template`` with every ``{{ name }}`` replaced from ``context``.

    Raises:
        MissingValue: a name has no value.
    """
    if isinstance(template, str):
        return _render_text(template, context)
    if isinstance(template, Mapping):
        return {str(k): render(v, context) for k, v in template.items()}
    if isinstance(template, list | tuple):
        return [render(v, context) for v in template]
    return template


def _render_text(text: str, context: TemplateContext) -> Any:
    whole = _ONLY.fullmatch(text)
    if whole is not None:
        return context.lookup(whole.group(1))
    escaped = text.replace("{{{{", _ESCAPED)

    def one(match: re.Match[str]) -> str:
        value = context.lookup(match.group(1))
        return value if isinstance(value, str) else json.dumps(value)

    return _FIELD.sub(one, escaped).replace(_ESCAPED, "{{")


def names_in(template: Any) -> set[str]:
    """Every name ``template`` uses (to check a description before anything runs)."""
    if isinstance(template, str):
        return {m.group(1) for m in _FIELD.finditer(template.replace("{{{{", _ESCAPED))}
    if isinstance(template, Mapping):
        return set().union(*(names_in(v) for v in template.values())) if template else set()
    if isinstance(template, list | tuple):
        return set().union(*(names_in(v) for v in template)) if template else set()
    return set()


def read_path(document: Any, path: str) -> Any:
    """The value at dotted ``path`` in a JSON document (``data.items.0.id``), or a private
    "missing" marker (check with :func:`is_missing`); an empty path is the whole document."""
    value = document
    for part in path.split(".") if path else ():
        if isinstance(value, Mapping) and part in value:
            value = value[part]
        elif (
            isinstance(value, list)
            and part.lstrip("-").isdigit()
            and -len(value) <= int(part) < len(value)
        ):
            value = value[int(part)]
        else:
            return _MISSING
    return value


def is_missing(value: object) -> bool:
    """True for :func:`read_path`'s "no such path" answer."""
    return value is _MISSING
