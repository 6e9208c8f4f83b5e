"""``python -m engine dashboard``: serve the web dashboard alone, against any engine database.

It opens the engine's records layer only (no execution, no recovery, no capacity: the same as
the inspection commands) and runs the HTTP server with the dashboard, ``/healthz``,
``/readyz`` and ``/metrics`` (this process's own, nearly empty) on ``metrics.host`` and
``metrics.port`` (``--host`` and ``--port`` override them) until SIGINT or SIGTERM. The
safety rules are the service's: off loopback it refuses to start without ``dashboard.token``
or basic-auth credentials.
"""

from __future__ import annotations

import argparse

import trio

from engine.cli.exits import EXIT_OK
from engine.cli.signals import Shutdown, serve_until_signal
from engine.config import EngineConfig
from engine.errors import ConfigError
from engine.service.root import open as open_engine
from engine.web.service import http_server

__all__ = ["run_dashboard"]


def run_dashboard(args: argparse.Namespace, config: EngineConfig) -> int:
    """Run ``dashboard`` until a signal; exit 0."""
    if config.dashboard.enabled is False:
        raise ConfigError(["dashboard.enabled is false: nothing to serve"])

    async def serve(_shutdown: Shutdown) -> None:
        async with open_engine(config, control=False) as eng, trio.open_nursery() as nursery:
            server = http_server(eng, metrics=True, dashboard=True, host=args.host, port=args.port)
            port = await nursery.start(server.run)
            print(f"engine: dashboard at http://{server.host}:{port}/ (Ctrl-C to stop)", flush=True)

    trio.run(serve_until_signal, serve)
    return EXIT_OK
