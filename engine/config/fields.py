"""The settings as documented: one :class:`FieldInfo` per setting, from the attrs fields."""

import json
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Final, Literal, get_args, get_origin

import attrs

from engine.config.engine import SECTION_CLASSES, EngineConfig
from engine.settings import Requirement

__all__ = ["ENV_PREFIX", "FieldInfo", "iter_fields", "split_optional"]

ENV_PREFIX: Final = "ENGINE_"
"""The prefix of every environment variable that sets a setting."""


@attrs.frozen
class FieldInfo:
    """One setting, as documented: names, type, default and rule."""

    name: str
    """Dotted name, as used in ``--set`` (``queue.fetch_cooldown``; ``data_dir`` at top level)."""
    section: str | None
    """The TOML table holding it, or None for a top-level field."""
    key: str
    """The key inside its table."""
    env_var: str
    """The environment variable that sets it (``ENGINE_QUEUE_FETCH_COOLDOWN``)."""
    type: str
    """Its type, in words (``float``, ``int | None``, ``'kv' | 'json'``, ``list[str]``)."""
    default: str
    """Its default, spelled as in TOML (``unset`` for None)."""
    doc: str
    """User documentation: meaning, unit and origin."""
    requirement: str
    """What values are allowed (``a number >= 0``)."""
    attribute: "attrs.Attribute[Any]" = attrs.field(repr=False, eq=False)
    """The attrs attribute behind it."""


def split_optional(tp: Any) -> tuple[bool, Any]:
    """``(True, X)`` for ``X | None``, else ``(False, tp)``."""
    if get_origin(tp) in (types.UnionType,) and type(None) in get_args(tp):
        rest = [a for a in get_args(tp) if a is not type(None)]
        return True, rest[0]
    return False, tp


def _type_text(tp: Any) -> str:
    optional, base = split_optional(tp)
    if get_origin(base) is Literal:
        text = " | ".join(repr(a) for a in get_args(base))
    elif get_origin(base) is tuple:
        text = "list[str]"
    elif base is Path:
        text = "path"
    else:
        text = base.__name__
    return f"{text} | None" if optional else text


def _toml_text(value: object) -> str:
    if value is None:
        return "unset"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, tuple):
        return json.dumps(list(value))
    if isinstance(value, str | Path):
        return json.dumps(str(value))
    return repr(value)


def _env_var(section: str | None, key: str) -> str:
    return f"{ENV_PREFIX}{section.upper()}_{key.upper()}" if section else ENV_PREFIX + key.upper()


def _field_info(section: str | None, attribute: "attrs.Attribute[Any]") -> FieldInfo:
    rule = attribute.validator
    assert isinstance(rule, Requirement), attribute.name
    return FieldInfo(
        name=f"{section}.{attribute.name}" if section else attribute.name,
        section=section,
        key=attribute.name,
        env_var=_env_var(section, attribute.name),
        type=_type_text(attribute.type),
        default=_toml_text(attribute.default),
        doc=attribute.metadata["doc"],
        requirement=rule.describe().removeprefix("must be "),
        attribute=attribute,
    )


def iter_fields() -> Iterator[FieldInfo]:
    """Every setting, top-level fields first, then each section's fields in declaration order."""
    for attribute in attrs.fields(EngineConfig):
        if attribute.metadata.get("list_of_tables"):
            continue  # not a setting: read from the TOML file's array of tables only
        if attribute.name in SECTION_CLASSES:
            for inner in attrs.fields(SECTION_CLASSES[attribute.name]):
                yield _field_info(attribute.name, inner)
        else:
            yield _field_info(None, attribute)
