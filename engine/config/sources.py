"""The three sources of settings and their merge: a TOML file, the environment, overrides.

:func:`load_config` reads them over the defaults (see :mod:`engine.config` for the syntax),
collects every problem of every source and raises them as one
:class:`~engine.errors.ConfigError`; :func:`config_as_dict` gives a configuration back as plain,
TOML-shaped data.
"""

import difflib
import os
import tomllib
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Final, Literal, get_args, get_origin
from urllib.parse import urlsplit, urlunsplit

import attrs
import cattrs

from engine.config.engine import SECTION_CLASSES, EngineConfig, all_rules
from engine.config.fields import ENV_PREFIX, FieldInfo, iter_fields, split_optional
from engine.errors import ConfigError
from engine.providers.http.description import HttpModel, http_models_from_tables
from engine.schedules.model import Schedule, duplicate_names, schedule_from_table
from engine.settings import Requirement, is_int

__all__ = ["config_as_dict", "config_problems_exit_code", "load_config"]

config_problems_exit_code: Final = 2
"""Exit status of the CLI when the configuration is invalid (as argparse's usage errors)."""

# Variables with the ENGINE_ prefix that are not settings.
_CONFIG_FILE_VAR: Final = "ENGINE_CONFIG"
_TEST_VAR_PREFIX: Final = "ENGINE_TEST_"

_FIELDS: Final[dict[str, FieldInfo]] = {info.name: info for info in iter_fields()}
_BY_ENV_VAR: Final[dict[str, FieldInfo]] = {info.env_var: info for info in _FIELDS.values()}
_TRUE: Final = frozenset({"true", "1", "yes", "on"})
_FALSE: Final = frozenset({"false", "0", "no", "off"})

_converter: Final = cattrs.Converter(forbid_extra_keys=True)
_converter.register_unstructure_hook(Path, str)


@attrs.frozen
class _Given:
    """One value from one source, before conversion."""

    name: str
    raw: object
    origin: str
    text: bool


def _convert(raw: object, tp: Any, *, text: bool) -> object:
    """Best-effort conversion of ``raw`` to ``tp``; the field's rule judges the result."""
    optional, base = split_optional(tp)
    if optional and raw == "":
        return None
    if get_origin(base) is Literal:
        if isinstance(raw, str):
            for choice in get_args(base):
                if raw.strip().casefold() == str(choice).casefold():
                    return choice
        return raw
    if not text:
        if base is float and is_int(raw):
            return float(raw)  # type: ignore[arg-type]
        if base is Path and isinstance(raw, str):
            return Path(raw).expanduser()
        if get_origin(base) is tuple and isinstance(raw, list):
            return tuple(raw)
        return raw
    assert isinstance(raw, str)
    stripped = raw.strip()
    try:
        if base is bool:
            lowered = stripped.lower()
            return True if lowered in _TRUE else False if lowered in _FALSE else raw
        if base is int:
            return int(stripped)
        if base is float:
            return float(stripped)
    except ValueError:
        return raw
    if base is Path:
        return Path(raw).expanduser()
    if get_origin(base) is tuple:
        return tuple(item.strip() for item in raw.split(",") if item.strip())
    return raw


def _redacted(url: str) -> str:
    """``url`` with its password, if any, replaced by ``***``."""
    try:
        parts = urlsplit(url)
        if parts.password is None:
            return url
    except ValueError:
        return url
    host = parts.netloc.rpartition("@")[2]
    return urlunsplit(parts._replace(netloc=f"{parts.username or ''}:***@{host}"))


#: Settings whose values never appear in messages or in ``config_as_dict``.
_SECRETS: Final = frozenset({"dashboard.token", "dashboard.password"})


def _shown(name: str, value: object) -> str:
    """``repr(value)``, with the password of a database URL masked."""
    if name.endswith("url") and isinstance(value, str):
        value = _redacted(value)
    if name in _SECRETS and value is not None:
        return "'***'"
    return repr(value)


def _suggestion(word: str, candidates: list[str], spell: Callable[[str], str] = str) -> str:
    best, best_score = None, _CLOSE_ENOUGH
    for candidate in candidates:
        score = difflib.SequenceMatcher(None, *_distinct_parts(word, candidate)).ratio()
        if score >= best_score:
            best, best_score = candidate, score
    return f"; did you mean {spell(best)}?" if best is not None else ""


#: How alike two names must be (``difflib``'s ratio) to suggest one for the other.
_CLOSE_ENOUGH: Final = 0.6


def _distinct_parts(word: str, candidate: str) -> tuple[str, str]:
    """The two names without what they share up to a separator: the ``ENGINE_`` prefix every
    variable has and the section two settings share. Either alone made short names look
    alike (``ENGINE_QWXZJK`` and ``ENGINE_APP``, ``queue.bogus`` and ``queue.gc_tuning``);
    a setting that moved between sections still matches by its own name."""
    same = next(
        (i for i, (a, b) in enumerate(zip(word, candidate, strict=False)) if a != b),
        min(len(word), len(candidate)),
    )
    shared = word[:same]
    cut = max(shared.rfind("."), shared.rfind("_")) + 1
    return word[cut:], candidate[cut:]


def _read_schedules(value: object, origin: str, problems: list[str]) -> list[Schedule]:
    """The ``[[schedules]]`` tables; a problem per bad field, naming the table and the field."""
    if not isinstance(value, list):
        problems.append(
            f"schedules ({origin}): must be an array of tables; write [[schedules]] once per "
            "schedule"
        )
        return []
    schedules: list[Schedule] = []
    for n, table in enumerate(value):
        name = table.get("name") if isinstance(table, dict) else None
        where = f"schedules[{n}]" + (f" ({name})" if isinstance(name, str) and name else "")
        schedule, found = schedule_from_table(table, where)
        problems += [f"{problem} ({origin})" for problem in found]
        if schedule is not None:
            schedules.append(schedule)
    problems += [f"{problem} ({origin})" for problem in duplicate_names(schedules)]
    return schedules


def _read_toml(path: Path, named_by: str | None, problems: list[str]) -> list[_Given]:
    where = f"{path} (from {named_by})" if named_by else str(path)
    try:
        with path.open("rb") as file:
            data = tomllib.load(file)
    except OSError as exc:
        problems.append(f"{where}: cannot read the configuration file: {exc.strerror or exc}")
        return []
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        problems.append(f"{where}: not valid TOML: {exc}")
        return []
    origin = f"from {path}"
    given: list[_Given] = []
    names = list(_FIELDS)
    for key, value in data.items():
        if key == "schedules":
            given.append(_Given(key, _read_schedules(value, origin, problems), origin, False))
        elif key == "http_models":
            models, found = http_models_from_tables(value, origin)
            problems += found
            given.append(_Given(key, models, origin, False))
        elif key in SECTION_CLASSES:
            if not isinstance(value, dict):
                problems.append(
                    f"{key} = {value!r} ({origin}): must be a table; write [{key}] and put its "
                    "settings under it"
                )
                continue
            for inner, inner_value in value.items():
                dotted = f"{key}.{inner}"
                if dotted in _FIELDS:
                    given.append(_Given(dotted, inner_value, origin, text=False))
                else:
                    hint = _suggestion(dotted, names)
                    problems.append(f"{dotted} ({origin}): unknown setting{hint}")
        elif key in _FIELDS:
            given.append(_Given(key, value, origin, text=False))
        elif isinstance(value, dict):
            hint = _suggestion(key, list(SECTION_CLASSES), lambda s: f"[{s}]")
            problems.append(f"[{key}] ({origin}): unknown section{hint}")
        else:
            problems.append(f"{key} ({origin}): unknown setting{_suggestion(key, names)}")
    return given


def _read_env(env: Mapping[str, str], problems: list[str]) -> list[_Given]:
    given: list[_Given] = []
    for var in sorted(env):
        if not var.startswith(ENV_PREFIX) or var == _CONFIG_FILE_VAR:
            continue
        if var.startswith(_TEST_VAR_PREFIX):
            continue
        info = _BY_ENV_VAR.get(var)
        if info is None:
            hint = _suggestion(var, list(_BY_ENV_VAR))
            problems.append(f"{var} (environment variable): unknown setting{hint}")
        else:
            given.append(_Given(info.name, env[var], f"from {var}", text=True))
    return given


def _read_overrides(overrides: Mapping[str, object], problems: list[str]) -> list[_Given]:
    given: list[_Given] = []
    for key, value in overrides.items():
        if key in _FIELDS:
            given.append(_Given(key, value, "from --set", text=isinstance(value, str)))
        else:
            problems.append(f"{key} (from --set): unknown setting{_suggestion(key, list(_FIELDS))}")
    return given


def load_config(
    *,
    env: Mapping[str, str] | None = None,
    toml_path: Path | None = None,
    overrides: Mapping[str, object] | None = None,
) -> EngineConfig:
    """Build the configuration from defaults, a TOML file, the environment and overrides.

    ``env`` defaults to ``os.environ``; ``toml_path`` defaults to the file named by
    ``ENGINE_CONFIG`` in ``env`` (none if unset or empty); ``overrides`` maps dotted names
    (``queue.fetch_cooldown``) to text, as given by ``--set``, converted like environment
    values; a non-text value (from a typed CLI flag) must already have the field's type, as in
    TOML. Overrides beat the environment, which beats the file, which beats the defaults.

    Raises :class:`~engine.errors.ConfigError` listing every problem found in every source:
    unreadable or malformed file, unknown keys or variables, bad values (even ones a higher
    source overrides) and broken rules between fields.
    """
    environ: Mapping[str, str] = os.environ if env is None else env
    problems: list[str] = []
    layers: list[list[_Given]] = []
    if toml_path is not None:
        layers.append(_read_toml(toml_path, None, problems))
    elif environ.get(_CONFIG_FILE_VAR):
        path = Path(environ[_CONFIG_FILE_VAR]).expanduser()
        layers.append(_read_toml(path, _CONFIG_FILE_VAR, problems))
    layers.append(_read_env(environ, problems))
    layers.append(_read_overrides(overrides or {}, problems))

    # The winning (given, value) per field; value is None-or-valid only when the rule passed.
    effective: dict[str, tuple[_Given, object, bool]] = {}
    schedules: tuple[Schedule, ...] = ()
    http_models: tuple[HttpModel, ...] = ()
    for layer in layers:
        for given in layer:
            if given.name == "schedules":
                assert isinstance(given.raw, list)
                schedules = tuple(given.raw)
                continue
            if given.name == "http_models":
                assert isinstance(given.raw, list)
                http_models = tuple(given.raw)
                continue
            info = _FIELDS[given.name]
            value = _convert(given.raw, info.attribute.type, text=given.text)
            rule = info.attribute.validator
            assert isinstance(rule, Requirement)
            problem = rule.problem(value)
            if problem is not None:
                problems.append(
                    f"{given.name} = {_shown(given.name, given.raw)} ({given.origin}): {problem}"
                )
            effective[given.name] = (given, value, problem is None)

    values: dict[str, object] = {}
    shown: dict[str, str] = {}
    for name, info in _FIELDS.items():
        if name in effective:
            given, value, ok = effective[name]
            shown[name] = f"{name} = {_shown(name, given.raw)} ({given.origin})"
            if ok:
                values[name] = value
        else:
            values[name] = info.attribute.default
            shown[name] = f"{name} = {_shown(name, info.attribute.default)} (default)"
    for cross in all_rules():
        if all(n in values for n in cross.names) and not cross.holds(values):
            problems.append(", ".join(shown[n] for n in cross.names) + f": {cross.text}")

    if problems:
        raise ConfigError(problems)
    nested: dict[str, Any] = {section: {} for section in SECTION_CLASSES}
    for name, value in values.items():
        section, _, key = name.rpartition(".")
        (nested[section] if section else nested)[key] = value
    return attrs.evolve(
        _converter.structure(nested, EngineConfig), schedules=schedules, http_models=http_models
    )


def config_as_dict(config: EngineConfig, *, redact: bool = True) -> dict[str, Any]:
    """The configuration as plain data (TOML-shaped), e.g. for ``engine config show``.

    With ``redact`` (the default) the passwords in database URLs are replaced by ``***``.
    """
    data: dict[str, Any] = _converter.unstructure(config)
    if redact:
        database = data["database"]
        for key, value in database.items():
            if key.endswith("url") and isinstance(value, str):
                database[key] = _redacted(value)
        dashboard = data["dashboard"]
        for key in ("token", "password"):
            if dashboard.get(key) is not None:
                dashboard[key] = "***"
    return data
