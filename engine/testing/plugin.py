"""The pytest plugin of engine's testing kit: fixtures for an app's tests, all named ``engine_*``.

Installed with engine (the ``pytest11`` entry point ``engine.testing.plugin``), it defines
fixtures and nothing else: no hook, no option, and nothing starts until a test asks for one of
its fixtures, so a project that does not use them pays only for the import. ``-p
no:engine.testing.plugin`` turns it off; with ``PYTEST_DISABLE_PLUGIN_AUTOLOAD`` set, ``-p
engine.testing.plugin`` turns it on.

The fixtures (async ones need pytest-trio: ``trio_mode = true``, or ``@pytest.mark.trio``):

- ``engine_server`` (session): the session's server and its migrated template (a
  :class:`~engine.testing.server.SessionServer`), started on first use;
- ``engine_database_url``: a fresh database cloned from the template, dropped after the test;
- ``engine_running``: an :class:`~engine.Engine` on that database that runs tasks;
- ``engine_manual``: one that stores tasks and runs none, until :func:`engine.testing.drain`;
- ``engine_providers``: the providers both engines get, ``{}``: override it in your
  ``conftest.py``;
- ``engine_settings``: config overrides (dotted names) both engines get, ``{}``: override it
  too;
- ``engine_aio_loop``: the trio-asyncio loop this test's database calls share;
- ``engine_template_setup`` (session): your app's own migrations, applied to the template once
  per session: None; override it in your ``conftest.py``.

Both engines put every model of ``engine_providers`` in the catalogue (enabled, no limits), so
a test submits to them at once. One server serves the session: embedded (started from a cached
ready cluster when there is one, see :mod:`engine.testing.server`), or the server named by
``ENGINE_TEST_DATABASE_URL``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator, Mapping
from typing import TYPE_CHECKING, Any

import pytest

# Only pytest and the standard library at import time: the plugin loads in every pytest run of
# an environment that has engine installed, used or not.
if TYPE_CHECKING:
    from engine.providers.base import Provider
    from engine.service.engine import Engine
    from engine.testing.server import SessionServer, TemplateSetup

__all__ = [
    "engine_aio_loop",
    "engine_database_url",
    "engine_manual",
    "engine_providers",
    "engine_running",
    "engine_server",
    "engine_settings",
    "engine_template_setup",
]


@pytest.fixture(scope="session")
def engine_template_setup() -> TemplateSetup | None:
    """Your app's own migrations, run once per session on the template after engine's: an
    async function of an :class:`engine.Connection` (inside a transaction). None: no schema
    of your own. Override it in your ``conftest.py`` (session scope)."""
    return None


@pytest.fixture(scope="session")
def engine_server(engine_template_setup: TemplateSetup | None) -> Iterator[SessionServer]:
    """The session's PostgreSQL server and its migrated template; stopped (or, on a server of
    yours, the template dropped) when the session ends."""
    from engine.testing.server import start_session_server

    server = start_session_server(setup=engine_template_setup)
    try:
        yield server
    finally:
        server.close()


@pytest.fixture
def engine_providers() -> Mapping[str, Provider]:
    """The providers the engine fixtures get, by model name: none. Override it in your
    ``conftest.py`` (or in a test module) to return yours."""
    return {}


@pytest.fixture
def engine_settings() -> Mapping[str, Any]:
    """Config overrides the engine fixtures get, by dotted name (``{"tasks.lease_ttl": 5}``):
    none. Override it to change them."""
    return {}


@pytest.fixture
async def engine_aio_loop() -> AsyncIterator[object]:
    """The trio-asyncio loop the test's database fixtures and engines share (a test with two
    engines calls both through one loop)."""
    import trio_asyncio

    from engine.db.bridge import asyncio_loop

    async with asyncio_loop():
        yield trio_asyncio.current_loop.get()


def _use_loop(loop: object) -> None:
    """Make ``loop`` this fixture task's loop (each fixture runs in a task of its own)."""
    import trio_asyncio

    trio_asyncio.current_loop.set(loop)


@pytest.fixture
async def engine_database_url(
    engine_server: SessionServer, engine_aio_loop: object
) -> AsyncIterator[str]:
    """A fresh, migrated database for this test, cloned from the session's template."""
    from engine.testing.server import clone_database

    _use_loop(engine_aio_loop)
    async with clone_database(engine_server) as url:
        yield url


@pytest.fixture
async def engine_running(
    engine_database_url: str,
    engine_aio_loop: object,
    engine_providers: Mapping[str, Provider],
    engine_settings: Mapping[str, Any],
) -> AsyncIterator[Engine]:
    """An engine that runs tasks, on this test's database, with ``engine_providers``."""
    from engine.testing.engines import open_test_engine

    _use_loop(engine_aio_loop)
    async with open_test_engine(
        providers=engine_providers,
        url=engine_database_url,
        settings=engine_settings,
        register_models=True,
    ) as eng:
        yield eng


@pytest.fixture
async def engine_manual(
    engine_database_url: str,
    engine_aio_loop: object,
    engine_providers: Mapping[str, Provider],
    engine_settings: Mapping[str, Any],
) -> AsyncIterator[Engine]:
    """An engine that stores tasks and runs none (``worker.mode = "client"``) until
    :func:`engine.testing.drain` runs them, on this test's database."""
    from engine.testing.engines import open_test_engine

    _use_loop(engine_aio_loop)
    async with open_test_engine(
        providers=engine_providers,
        url=engine_database_url,
        settings=engine_settings,
        manual=True,
        register_models=True,
    ) as eng:
        yield eng
