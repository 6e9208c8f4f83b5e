"""Build the HTTP server the service tree runs (or ``python -m engine dashboard`` runs alone)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from engine.web.app import make_app
from engine.web.auth import check_exposure
from engine.web.server import WebServer

if TYPE_CHECKING:
    # Type-only: the web layer serves the open Engine and sits below engine.service.
    from engine.service.engine import Engine

__all__ = ["http_server"]


def http_server(
    engine: Engine,
    *,
    metrics: bool,
    dashboard: bool,
    host: str | None = None,
    port: int | None = None,
    hooks: bool = False,
) -> WebServer:
    """The server of ``engine``: ``/metrics`` when ``metrics``, the pages when ``dashboard``,
    ``POST /hooks/<task id>`` when ``hooks``, the health checks always; on ``metrics.host``
    and ``metrics.port`` unless given.

    Raises:
        ConfigError: the dashboard would be served off loopback without credentials.
    """
    config = engine.config
    bind = host if host is not None else config.metrics.host
    if dashboard:
        check_exposure(bind, config.dashboard)
    app = make_app(
        metrics=engine.metrics if metrics else None,
        ready=engine.health.ready,
        alive=engine.health.alive,
        engine=engine if dashboard else None,
        dashboard=config.dashboard if dashboard else None,
        hooks=engine if hooks else None,
    )
    return WebServer(app, host=bind, port=config.metrics.port if port is None else port)
