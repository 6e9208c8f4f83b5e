"""engine's testing kit: what an app that embeds engine needs to test its providers and its
submit paths (docs/testing.md walks through a whole example).

- **A pytest plugin** (:mod:`engine.testing.plugin`, loaded by entry point): one server per
  session, a migrated template, a fresh database per test, and the fixtures ``engine_running``
  (an engine that runs tasks) and ``engine_manual`` (one that stores them and runs none).
- **Running tasks**: :func:`drain` runs everything queued to a final state and returns what
  ran; :func:`run_provider` runs one task on a provider without a database, mapping its
  answers and exceptions as the engine does.
- **Factories**: :func:`make_task` and :func:`make_request`, valid by default.
- **Assertions**: :func:`assert_submitted`, :func:`refute_submitted` and :func:`all_submitted`,
  whose failures list what was submitted.
- **Without pytest**: :func:`open_test_engine` (an engine on a throw-away database),
  :func:`temporary_database`, :func:`run_until_final`, and the session server of
  :mod:`engine.testing.server`.
"""

from typing import TYPE_CHECKING, Any

from engine.lazy import LazyExports

if TYPE_CHECKING:
    from engine.testing.assertions import all_submitted as all_submitted
    from engine.testing.assertions import assert_submitted as assert_submitted
    from engine.testing.assertions import payload_contains as payload_contains
    from engine.testing.assertions import refute_submitted as refute_submitted
    from engine.testing.draining import DrainTimeout as DrainTimeout
    from engine.testing.draining import drain as drain
    from engine.testing.engines import MANUAL_SETTINGS as MANUAL_SETTINGS
    from engine.testing.engines import TEST_SETTINGS as TEST_SETTINGS
    from engine.testing.engines import open_test_engine as open_test_engine
    from engine.testing.engines import run_until_final as run_until_final
    from engine.testing.engines import temporary_database as temporary_database
    from engine.testing.factories import DEFAULT_IDENTITY as DEFAULT_IDENTITY
    from engine.testing.factories import DEFAULT_MODEL as DEFAULT_MODEL
    from engine.testing.factories import make_request as make_request
    from engine.testing.factories import make_task as make_task
    from engine.testing.provider_run import run_provider as run_provider
    from engine.testing.server import SessionServer as SessionServer
    from engine.testing.server import clone_database as clone_database
    from engine.testing.server import start_session_server as start_session_server

#: Where each name lives. They load on first use (PEP 562), so loading the pytest plugin (which
#: imports this package first) costs a project that does not use the kit nothing. No module of
#: the kit is named as one of these names: importing it would shadow the name.
_LAZY: dict[str, str] = {
    "all_submitted": "engine.testing.assertions",
    "assert_submitted": "engine.testing.assertions",
    "payload_contains": "engine.testing.assertions",
    "refute_submitted": "engine.testing.assertions",
    "DrainTimeout": "engine.testing.draining",
    "drain": "engine.testing.draining",
    "MANUAL_SETTINGS": "engine.testing.engines",
    "TEST_SETTINGS": "engine.testing.engines",
    "open_test_engine": "engine.testing.engines",
    "run_until_final": "engine.testing.engines",
    "temporary_database": "engine.testing.engines",
    "DEFAULT_IDENTITY": "engine.testing.factories",
    "DEFAULT_MODEL": "engine.testing.factories",
    "make_request": "engine.testing.factories",
    "make_task": "engine.testing.factories",
    "run_provider": "engine.testing.provider_run",
    "SessionServer": "engine.testing.server",
    "clone_database": "engine.testing.server",
    "start_session_server": "engine.testing.server",
}

__all__ = [
    "DEFAULT_IDENTITY",
    "DEFAULT_MODEL",
    "MANUAL_SETTINGS",
    "TEST_SETTINGS",
    "DrainTimeout",
    "SessionServer",
    "all_submitted",
    "assert_submitted",
    "clone_database",
    "drain",
    "make_request",
    "make_task",
    "open_test_engine",
    "payload_contains",
    "refute_submitted",
    "run_provider",
    "run_until_final",
    "start_session_server",
    "temporary_database",
]


_EXPORTS = LazyExports(__name__, _LAZY, globals())


def __getattr__(name: str) -> Any:
    """Load a name of the kit on first use (``engine.testing.drain``)."""
    return _EXPORTS.load(name)


def __dir__() -> list[str]:
    """The package's names, the lazy ones included."""
    return _EXPORTS.names(__all__)
