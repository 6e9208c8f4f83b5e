"""The one HTTP server of a process: hypercorn's trio worker serving an ASGI app.

:class:`WebServer` binds one listening socket itself (so a port in use is one clear
:class:`~engine.errors.AddressInUse`, and port 0 reports the one port it got) and hands it to
hypercorn, which serves HTTP/1.1 and HTTP/2 on trio in the caller's nursery, inside the
service tree. Cancelling :meth:`WebServer.run` stops it; open connections are cut at once
rather than drained (the tree has its own stop order).
"""

from __future__ import annotations

import errno
import logging
import socket
from typing import Any, Final

import trio
from hypercorn.config import Config, Sockets
from hypercorn.trio.run import worker_serve
from hypercorn.utils import wrap_app

from engine.errors import AddressInUse, ConfigError

__all__ = ["WebServer"]

log = logging.getLogger(__name__)

#: Seconds hypercorn gives open requests once it is told to stop by itself (not on cancel).
_GRACEFUL_TIMEOUT: Final = 1.0


class WebServer:
    """Serve ``app`` on ``host:port`` until cancelled (a control-layer sibling)."""

    def __init__(self, app: Any, *, host: str = "127.0.0.1", port: int = 9464) -> None:
        """Create the server (it binds only in :meth:`run`).

        Args:
            app: the ASGI application (:func:`engine.web.app.make_app`).
            host: address to bind (``metrics.host``).
            port: port to bind; 0 picks a free one (``metrics.port``).
        """
        self.app = app
        self.host = host
        self.port = port
        #: The bound port once :meth:`run` has started.
        self.bound_port: int | None = None

    async def _listen(self) -> socket.socket:
        try:
            infos = await trio.socket.getaddrinfo(
                self.host, self.port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
            )
        except socket.gaierror as exc:
            raise ConfigError(
                [
                    f"metrics.host: {self.host!r} is not an address of this machine "
                    f"({exc.strerror}); set metrics.host (ENGINE_METRICS_HOST, or --set "
                    "metrics.host=ADDRESS) to 127.0.0.1, 0.0.0.0 or one of its addresses"
                ]
            ) from None
        family, kind, proto, _, address = infos[0]
        sock = socket.socket(family, kind, proto)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(address)
            sock.listen(128)
            sock.setblocking(False)
        except OSError as exc:
            sock.close()
            if exc.errno == errno.EADDRNOTAVAIL:
                raise ConfigError(
                    [
                        f"metrics.host: {self.host} is not an address of this machine; set "
                        "metrics.host (ENGINE_METRICS_HOST, or --set metrics.host=ADDRESS) to "
                        "127.0.0.1, 0.0.0.0 or one of its addresses"
                    ]
                ) from None
            if exc.errno != errno.EADDRINUSE:
                raise
            raise AddressInUse(
                f"metrics.port: {self.host}:{self.port} is already in use; set metrics.port "
                "(ENGINE_METRICS_PORT, or --set metrics.port=N) to a free port, 0 for any free "
                "port, or metrics.enabled=false"
            ) from None
        return sock

    async def run(self, *, task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED) -> None:
        """Bind and serve until cancelled; ``task_status.started(port)`` with the bound port."""
        sock = await self._listen()
        port = int(sock.getsockname()[1])
        self.bound_port = port
        config = Config()
        config.accesslog = None
        config.errorlog = logging.getLogger("engine.web.hypercorn")
        config.graceful_timeout = _GRACEFUL_TIMEOUT
        config.keep_alive_timeout = 5.0
        config.include_server_header = False
        sockets = Sockets(secure_sockets=[], insecure_sockets=[sock], quic_sockets=[])
        log.info(
            "http server listening",
            extra={"event": "http_listening", "host": self.host, "port": port},
        )
        try:
            async with trio.open_nursery() as nursery:
                await nursery.start(
                    lambda task_status: worker_serve(
                        wrap_app(self.app, config.wsgi_max_body_size, "asgi"),
                        config,
                        sockets=sockets,
                        task_status=task_status,
                    )
                )
                task_status.started(port)
        finally:
            sock.close()
