"""The testing kit's own tests use its pytest plugin's fixtures.

Installed, engine registers the plugin by entry point; imported here too, the fixtures are found
also where it is not installed (a checkout run with ``pytest``). Defined in this conftest, they
are this directory's: the ones the entry point registers stay unused here.
"""

from __future__ import annotations

from engine.testing.plugin import (
    engine_aio_loop,
    engine_database_url,
    engine_manual,
    engine_providers,
    engine_running,
    engine_server,
    engine_settings,
    engine_template_setup,
)

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
