"""SQL as source: numbered migrations and named queries, read once from ``sql/``.

``sql/queries/<table>.sql`` holds named queries, each opening with ``-- name: <entity_verb>``
followed by a comment line that says what it does and names its ``$n`` parameters. A piece of
SQL that several queries share is written once, as ``-- fragment: <name>``, and a query takes
it with a line ``{{<name>}}`` (fragments are not queries of their own: they are substituted at
load, from any file, and an unknown one is an error). Modules bind
the queries they use at import (``_CLAIM = QUERIES["job_get_available_completing"]``), so a
misspelt name fails when engine starts, not at first use.

In a wheel the folder ships as ``engine/sql``; in a source checkout it is the top-level ``sql/``.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from functools import cache
from importlib import resources
from importlib.resources.abc import Traversable
from pathlib import Path

import attrs

from engine.errors import UnknownQuery

__all__ = [
    "QUERIES",
    "Migration",
    "Queries",
    "compose",
    "load_migrations",
    "load_queries",
    "parse_queries",
    "sql_root",
]

_NAME = re.compile(r"^--\s*(name|fragment):\s*([a-z][a-z0-9_]*)\s*$", re.MULTILINE)
_USE = re.compile(r"^[ \t]*\{\{([a-z][a-z0-9_]*)\}\}[ \t]*$", re.MULTILINE)
_MIGRATION = re.compile(r"^(\d{4})_([a-z0-9_]+)\.sql$")


def sql_root() -> Traversable:
    """The folder holding ``migrations/`` and ``queries/``."""
    packaged = resources.files("engine") / "sql"
    if packaged.is_dir():
        return packaged
    return Path(__file__).resolve().parents[2] / "sql"


class Queries(Mapping[str, str]):
    """Named queries; looking up an unknown name raises :class:`engine.errors.UnknownQuery`."""

    def __init__(self, queries: dict[str, str]) -> None:
        self._queries = queries

    def __getitem__(self, name: str) -> str:
        try:
            return self._queries[name]
        except KeyError:
            raise UnknownQuery(f"no SQL query named {name!r} in sql/queries/") from None

    def __iter__(self) -> Iterator[str]:
        return iter(self._queries)

    def __len__(self) -> int:
        return len(self._queries)


def parse_queries(text: str, source: str) -> tuple[dict[str, str], dict[str, str]]:
    """Split one ``.sql`` file into its queries and its fragments, each ``{name: sql}``;
    duplicate or empty ones are errors."""
    found: dict[str, dict[str, str]] = {"name": {}, "fragment": {}}
    marks = list(_NAME.finditer(text))
    for i, mark in enumerate(marks):
        end = marks[i + 1].start() if i + 1 < len(marks) else len(text)
        body = text[mark.end() : end].strip()
        kind, name = mark.group(1), mark.group(2)
        what = "query" if kind == "name" else "fragment"
        if name in found[kind]:
            raise UnknownQuery(f"{what} {name!r} is defined twice in {source}")
        if not any(
            line.strip() and not line.strip().startswith("--") for line in body.splitlines()
        ):
            raise UnknownQuery(f"{what} {name!r} in {source} has no SQL")
        found[kind][name] = body
    return found["name"], found["fragment"]


def compose(queries: Mapping[str, str], fragments: Mapping[str, str]) -> dict[str, str]:
    """Every query with its ``{{fragment}}`` lines replaced by the fragment's SQL, indented as
    the line was (a fragment may use fragments too); an unknown fragment, or one that uses
    itself, is an error."""

    def expand(owner: str, sql: str, seen: tuple[str, ...]) -> str:
        def replace(match: re.Match[str]) -> str:
            name = match.group(1)
            if name not in fragments:
                raise UnknownQuery(f"{owner!r} uses {{{{{name}}}}}, a fragment not defined")
            if name in seen:
                raise UnknownQuery(f"fragment {name!r} uses itself")
            line = match.group(0)
            indent = line[: len(line) - len(line.lstrip())]
            body = expand(name, fragments[name], (*seen, name))
            return "\n".join(indent + text if text.strip() else text for text in body.splitlines())

        return _USE.sub(replace, sql)

    return {name: expand(name, sql, ()) for name, sql in queries.items()}


@cache
def load_queries() -> Queries:
    """Parse every file in ``sql/queries`` once."""
    folder = sql_root() / "queries"
    merged: dict[str, str] = {}
    fragments: dict[str, str] = {}
    for entry in sorted(folder.iterdir(), key=lambda e: e.name):
        if not entry.name.endswith(".sql"):
            continue
        queries, pieces = parse_queries(entry.read_text("utf-8"), entry.name)
        for found, into, what in ((queries, merged, "query"), (pieces, fragments, "fragment")):
            for name, body in found.items():
                if name in into:
                    raise UnknownQuery(f"{what} {name!r} is defined in two files ({entry.name})")
                into[name] = body
    return Queries(compose(merged, fragments))


@attrs.frozen
class Migration:
    """One numbered migration file."""

    version: int
    name: str
    sql: str


@cache
def load_migrations() -> tuple[Migration, ...]:
    """Every ``sql/migrations/NNNN_name.sql``, ordered by version; gaps and repeats are errors."""
    folder = sql_root() / "migrations"
    found: list[Migration] = []
    for entry in folder.iterdir():
        match = _MIGRATION.match(entry.name)
        if match is None:
            continue
        found.append(Migration(int(match.group(1)), match.group(2), entry.read_text("utf-8")))
    found.sort(key=lambda m: m.version)
    for expected, migration in enumerate(found, start=1):
        if migration.version != expected:
            raise RuntimeError(
                f"sql/migrations: expected version {expected:04d}, found {migration.version:04d}"
            )
    return tuple(found)


QUERIES = load_queries()
