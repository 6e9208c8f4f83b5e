"""The building blocks of configuration sections: fields with a default, a doc and a rule.

Each service declares its settings in its own ``config`` module (``engine/queue/config.py``
holds :class:`~engine.queue.config.QueueConfig`, and so on) as a frozen attrs class whose fields
are made with :func:`setting`; :class:`~engine.config.EngineConfig` composes them. This module
depends on attrs alone, so a service's config module can import it without importing the
application's configuration.

A field's rule is a :class:`Requirement` (``must be a number >= 0``): an attrs validator that
states itself in words, so a value of the wrong type and one out of range get the same message.
A :class:`Rule` relates several fields by their dotted names (``queue.fetch_cooldown``); a
section lists the rules among its own fields in its ``rules`` class variable and checks them
with :func:`enforce_section_rules` in ``__attrs_post_init__``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, TypeVar

import attrs

__all__ = [
    "Requirement",
    "Rule",
    "boolean",
    "choice",
    "enforce_rules",
    "enforce_section_rules",
    "fraction",
    "integer",
    "is_int",
    "not_above_rule",
    "number",
    "path",
    "setting",
    "text",
]

_T = TypeVar("_T")


@attrs.frozen
class Requirement:
    """An attrs validator that states its rule in words ("must be a number >= 0").

    The same words are used for a value of the wrong type and for one out of range, so each
    field has exactly one message.
    """

    text: str
    """The rule, starting with "must be"."""
    test: Callable[[Any], bool]
    """True for an allowed value; may raise TypeError or ValueError for a wrong type."""
    optional: bool = False
    """None is allowed too (the field may be unset)."""

    def describe(self) -> str:
        """The rule, as the tail of an error message."""
        return f"{self.text}, or empty for none" if self.optional else self.text

    def problem(self, value: object) -> str | None:
        """None if ``value`` is allowed, else the rule it breaks."""
        if value is None and self.optional:
            return None
        try:
            ok = self.test(value)
        except (TypeError, ValueError):
            ok = False
        return None if ok else self.describe()

    def __call__(self, instance: object, attribute: attrs.Attribute[Any], value: object) -> None:
        problem = self.problem(value)
        if problem is not None:
            raise ValueError(f"{attribute.name} = {value!r}: {problem}")


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def is_int(value: object) -> bool:
    """True for an int that is not a bool."""
    return isinstance(value, int) and not isinstance(value, bool)


def number(*, gt: float | None = None, ge: float | None = None, optional: bool = False) -> Any:
    """A finite number above ``gt``, or at least ``ge`` (0 when neither is given)."""
    if gt is not None:
        bound = gt
        return Requirement(
            f"must be a number > {bound:g}", lambda v: _is_number(v) and v > bound, optional
        )
    low = 0.0 if ge is None else ge
    return Requirement(
        f"must be a number >= {low:g}", lambda v: _is_number(v) and v >= low, optional
    )


def integer(ge: int, le: int | None = None) -> Any:
    """An integer of at least ``ge`` and, if given, at most ``le``."""
    if le is None:
        return Requirement(f"must be an integer >= {ge}", lambda v: is_int(v) and v >= ge)
    return Requirement(
        f"must be an integer from {ge} to {le}", lambda v: is_int(v) and ge <= v <= le
    )


def fraction() -> Any:
    """A number above 0 and at most 1."""
    return Requirement("must be a number > 0 and <= 1", lambda v: _is_number(v) and 0 < v <= 1)


def boolean(*, optional: bool = False) -> Any:
    """True or false."""
    return Requirement("must be true or false", lambda v: isinstance(v, bool), optional)


def choice(*choices: str) -> Any:
    """One of ``choices``."""
    listed = ", ".join(repr(c) for c in choices)
    return Requirement(f"must be one of {listed}", lambda v: isinstance(v, str) and v in choices)


def text(min_len: int, max_len: int, *, optional: bool = False) -> Any:
    """A string of ``min_len`` to ``max_len`` characters."""
    return Requirement(
        f"must be a string of {min_len} to {max_len} characters",
        lambda v: isinstance(v, str) and min_len <= len(v) <= max_len,
        optional,
    )


def path(*, optional: bool = False) -> Any:
    """A :class:`~pathlib.Path`."""
    return Requirement("must be a path", lambda v: isinstance(v, Path), optional)


def setting(default: _T, doc: str, rule: Any) -> _T:
    """A config field: its default, its user documentation and its rule.

    ``doc`` reaches users through ``docs/configuration.md``: say what the setting does in
    engine, its unit, and, where it matters, why its default is what it is (never whose value
    it was: the reader has only this repository).
    """
    return attrs.field(default=default, validator=rule, metadata={"doc": doc})


@attrs.frozen
class Rule:
    """A rule between fields; ``holds`` gets a mapping from dotted field name to value."""

    names: tuple[str, ...]
    """The dotted names of the fields it relates (``queue.fetch_cooldown``)."""
    text: str
    """The rule in words: the tail of an error message, and a line of ``docs/configuration.md``."""
    holds: Callable[[Mapping[str, Any]], bool]
    """True when the values satisfy the rule."""


def not_above_rule(low: str, high: str) -> Rule:
    """The field ``low`` must not exceed the field ``high``."""
    return Rule((low, high), f"{low} must not exceed {high}", lambda v: v[low] <= v[high])


def enforce_rules(rules: Iterable[Rule], value_of: Callable[[str], Any]) -> None:
    """Raise ValueError naming every rule of ``rules`` that does not hold; ``value_of`` gives
    the value of a dotted field name."""
    broken = [rule.text for rule in rules if not rule.holds({n: value_of(n) for n in rule.names})]
    if broken:
        raise ValueError("; ".join(broken))


def enforce_section_rules(section: object, rules: Iterable[Rule]) -> None:
    """``__attrs_post_init__`` body of a section: :func:`enforce_rules` on its own fields.

    The rules name the fields with the section's prefix (``queue.fetch_cooldown`` for the
    field ``fetch_cooldown`` of the ``queue`` section).
    """
    enforce_rules(rules, lambda dotted: getattr(section, dotted.partition(".")[2]))
