"""The queue's and the database's public names: each resolves and has a docstring of its own,
and importing a lower module of ``engine.db`` does not load the driver."""

from __future__ import annotations

import inspect
import subprocess
import sys
import types

import pytest

import engine.db
import engine.queue

_PUBLIC = [(engine.queue, name) for name in engine.queue.__all__] + [
    (engine.db, name) for name in engine.db.__all__
]


@pytest.mark.parametrize(
    ("package", "name"), _PUBLIC, ids=[f"{p.__name__}.{n}" for p, n in _PUBLIC]
)
def test_every_public_name_resolves_and_has_its_own_docstring(
    package: types.ModuleType, name: str
) -> None:
    value = getattr(package, name)
    # Its own: a class's __doc__ is not inherited, a function's is its body's first string.
    doc = value.__dict__.get("__doc__") if inspect.isclass(value) else value.__doc__
    assert isinstance(doc, str) and doc.strip(), f"{package.__name__}.{name} has no docstring"


def test_the_packages_say_what_they_own() -> None:
    for package in (engine.queue, engine.db):
        assert package.__doc__ and len(package.__doc__.strip()) > 100, package.__name__
    assert set(engine.db.__all__) <= set(dir(engine.db))
    with pytest.raises(AttributeError):
        engine.db.no_such_name  # noqa: B018


def test_the_entry_and_the_insert_item_type_are_exported() -> None:
    for name in ("open", "open_queue", "QueueClient", "InsertManyParams", "InsertOpts",
                 "UniqueOpts", "JobSnooze", "JobCancel", "Workers", "Job", "JobState"):  # fmt: skip
        assert name in engine.queue.__all__, name
    for name in ("open_database", "DatabaseUrls", "migrate_databases", "open_urls"):
        assert name in engine.db.__all__, name


def test_importing_the_database_section_does_not_load_the_driver() -> None:
    code = (
        "import sys, engine.db.config\n"
        "print(sorted(m for m in ('engine.db.bridge', 'asyncpg') if m in sys.modules))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert done.stdout.strip() == "[]", done.stdout
