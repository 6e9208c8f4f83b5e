"""The HTTP server without a database: /metrics through prometheus_client, /healthz, /readyz."""

from __future__ import annotations

import gzip
from collections.abc import AsyncIterator

import pytest
import trio

from engine.errors import AddressInUse, ConfigError
from engine.metrics import CONTENT_TYPE, Metrics
from engine.web.app import make_app
from engine.web.server import WebServer
from engine_tests.web.client import request


class Ready:
    def __init__(self) -> None:
        self.flag = False
        self.error: Exception | None = None

    def __call__(self) -> bool:
        if self.error is not None:
            raise self.error
        return self.flag


@pytest.fixture
async def served() -> AsyncIterator[tuple[int, Metrics, Ready]]:
    metrics, ready = Metrics(), Ready()
    server = WebServer(make_app(metrics=metrics, ready=ready), host="127.0.0.1", port=0)
    async with trio.open_nursery() as nursery:
        port = await nursery.start(server.run)
        assert port == server.bound_port and port > 0
        yield port, metrics, ready
        nursery.cancel_scope.cancel()


def _steady(body: bytes) -> list[bytes]:
    """The exposition without the process collector's samples, which move between scrapes."""
    return [line for line in body.splitlines() if not line.startswith(b"process_")]


async def test_metrics_through_prometheus_exposition(
    served: tuple[int, Metrics, Ready],
) -> None:
    port, metrics, _ = served
    metrics.resized("success")
    reply = await request(port, "GET", "/metrics")
    assert reply.status == 200
    assert reply.headers["content-type"] == CONTENT_TYPE
    assert _steady(reply.body) == _steady(metrics.render())
    assert 'engine_capacity_resizes_total{outcome="success"} 1.0' in reply.text


async def test_metrics_head_gzip_openmetrics_and_name_filter(
    served: tuple[int, Metrics, Ready],
) -> None:
    port, metrics, _ = served
    head = await request(port, "HEAD", "/metrics")
    assert head.status == 200 and head.body == b""
    zipped = await request(port, "GET", "/metrics", headers={"Accept-Encoding": "gzip"})
    assert zipped.headers["content-encoding"] == "gzip"
    assert _steady(gzip.decompress(zipped.body)) == _steady(metrics.render())
    om = await request(
        port, "GET", "/metrics", headers={"Accept": "application/openmetrics-text; version=1.0.0"}
    )
    assert om.headers["content-type"].startswith("application/openmetrics-text")
    assert om.text.rstrip().endswith("# EOF")
    only = await request(port, "GET", "/metrics?name[]=engine_leader")
    assert "engine_leader " in only.text and "engine_generations" not in only.text


async def test_health_and_readiness(served: tuple[int, Metrics, Ready]) -> None:
    port, _, ready = served
    health = await request(port, "GET", "/healthz")
    assert (health.status, health.body) == (200, b"ok\n")
    assert (await request(port, "GET", "/readyz")).status == 503
    ready.flag = True
    reply = await request(port, "GET", "/readyz")
    assert (reply.status, reply.body) == (200, b"ready\n")
    ready.error = RuntimeError("check broke")
    assert (await request(port, "GET", "/readyz")).status == 503
    assert (await request(port, "HEAD", "/healthz")).status == 200


async def test_errors(served: tuple[int, Metrics, Ready]) -> None:
    port, _, _ = served
    assert (await request(port, "GET", "/nope")).status == 404
    # The dashboard is off: its pages do not exist.
    assert (await request(port, "GET", "/tasks")).status == 404
    reply = await request(port, "POST", "/metrics")
    assert reply.status == 405 and reply.headers["allow"] == "GET, HEAD"
    assert (await request(port, "POST", "/healthz")).status == 405
    bad = await request(port, "GET", "/", raw=b"\x16\x03\x01garbage\r\n\r\n")
    assert bad.status == 400


async def test_port_in_use_names_the_setting() -> None:
    first = WebServer(make_app(metrics=None, ready=lambda: True), host="127.0.0.1", port=0)
    async with trio.open_nursery() as nursery:
        port = await nursery.start(first.run)
        second = WebServer(make_app(metrics=None, ready=lambda: True), host="127.0.0.1", port=port)
        with pytest.raises(AddressInUse, match=r"metrics\.port"):
            await second.run()
        nursery.cancel_scope.cancel()


@pytest.mark.parametrize("host", ["no.such.host.invalid", "192.0.2.1"])
async def test_a_host_that_is_not_this_machines_is_a_config_error(host: str) -> None:
    server = WebServer(make_app(metrics=None, ready=lambda: True), host=host, port=0)
    with pytest.raises(ConfigError, match=r"metrics\.host: .* is not an address of this machine"):
        await server.run()
