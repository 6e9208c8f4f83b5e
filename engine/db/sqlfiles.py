"""SQL as source: numbered migrations and named queries, read once from ``sql/``.

``sql/queries/<table>.sql`` holds named queries, each opening with ``-- name: <entity_verb>``
followed by a comment line that says what it does and names its ``$n`` parameters. Modules bind
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

__all__ = ["QUERIES", "Migration", "Queries", "load_migrations", "load_queries", "sql_root"]

_NAME = re.compile(r"^--\s*name:\s*([a-z][a-z0-9_]*)\s*$", re.MULTILINE)
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


def parse_queries(text: str, source: str) -> dict[str, str]:
    """Split one ``.sql`` file into ``{name: sql}``; duplicate or empty queries are errors."""
    found: dict[str, str] = {}
    marks = list(_NAME.finditer(text))
    for i, mark in enumerate(marks):
        end = marks[i + 1].start() if i + 1 < len(marks) else len(text)
        body = text[mark.end() : end].strip()
        name = mark.group(1)
        if name in found:
            raise UnknownQuery(f"query {name!r} is defined twice in {source}")
        if not any(
            line.strip() and not line.strip().startswith("--") for line in body.splitlines()
        ):
            raise UnknownQuery(f"query {name!r} in {source} has no SQL")
        found[name] = body
    return found


@cache
def load_queries() -> Queries:
    """Parse every file in ``sql/queries`` once."""
    folder = sql_root() / "queries"
    merged: dict[str, str] = {}
    for entry in sorted(folder.iterdir(), key=lambda e: e.name):
        if not entry.name.endswith(".sql"):
            continue
        for name, body in parse_queries(entry.read_text("utf-8"), entry.name).items():
            if name in merged:
                raise UnknownQuery(f"query {name!r} is defined in two files ({entry.name})")
            merged[name] = body
    return Queries(merged)


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
