"""A TCP proxy whose link can be cut and healed: how the benchmarks and the tests put a network
fault between engine and a server (every connection reset or left hanging, new ones refused)
without touching either end.

``tcp_proxy(url, host=...)`` listens on ``host`` (loopback by default; an address of a network
namespace's link to reach it from there) and forwards each connection to the server of ``url``.
It records the local port of every connection it opens to the server, so the server's
``inet_client_port()`` tells which proxy (which client) a statement came through.
"""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from urllib.parse import urlsplit, urlunsplit

import attrs
import trio

__all__ = ["TcpProxy", "tcp_proxy"]


@attrs.define(eq=False)
class TcpProxy:
    """Forwards connections on ``host:port`` to ``target``; see :func:`tcp_proxy`."""

    target: tuple[str, int]
    host: str = "127.0.0.1"
    port: int = 0
    cut_off: bool = False
    links: set[trio.CancelScope] = attrs.field(factory=set)
    #: Local ports of every connection made to the target so far.
    server_ports: set[int] = attrs.field(factory=set)

    def url(self, url: str) -> str:
        """``url`` with its host and port replaced by the proxy's."""
        parts = urlsplit(url)
        user = parts.netloc.rpartition("@")[0]
        netloc = (user + "@" if user else "") + f"{self.host}:{self.port}"
        return urlunsplit(parts._replace(netloc=netloc))

    def cut(self) -> None:
        """Reset every live connection and drop new ones until :meth:`heal`."""
        self.cut_off = True
        for scope in list(self.links):
            scope.cancel()

    def heal(self) -> None:
        """Let connections through again."""
        self.cut_off = False

    async def _handle(self, client: trio.SocketStream) -> None:
        async with client:
            if self.cut_off:
                return  # accepted and closed at once: the client sees the connection drop
            try:
                server = await trio.open_tcp_stream(*self.target)
            except OSError:
                return
            self.server_ports.add(server.socket.getsockname()[1])
            async with server:
                with trio.CancelScope() as scope:
                    self.links.add(scope)
                    try:
                        async with trio.open_nursery() as nursery:
                            nursery.start_soon(_pump, client, server, scope)
                            nursery.start_soon(_pump, server, client, scope)
                    finally:
                        self.links.discard(scope)


async def _pump(
    source: trio.SocketStream, sink: trio.SocketStream, scope: trio.CancelScope
) -> None:
    try:
        while data := await source.receive_some(65536):
            await sink.send_all(data)
    except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
        pass
    scope.cancel()  # one side ended: end the link


@asynccontextmanager
async def tcp_proxy(url: str, *, host: str = "127.0.0.1") -> AsyncIterator[TcpProxy]:
    """A proxy to the server of ``url`` on a free port of ``host``, for the block."""
    parts = urlsplit(url)
    proxy = TcpProxy((parts.hostname or "127.0.0.1", parts.port or 5432), host=host)
    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(
            functools.partial(trio.serve_tcp, proxy._handle, 0, host=host)
        )
        proxy.port = listeners[0].socket.getsockname()[1]
        try:
            yield proxy
        finally:
            nursery.cancel_scope.cancel()
