"""``/healthz`` and ``/readyz`` tell the truth: the database answering, the capacity refreshes
succeeding, and a share with a generation running it."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
import trio

from engine.bench.proxy import tcp_proxy
from engine.service.health import DATABASE, Health
from engine_tests.service.test_service import service

ON: dict[str, Any] = {
    "metrics.enabled": "true",
    "metrics.port": "0",
    "database.probe_interval": "0.2",
}


async def _until(url: str, status: int, body: str, timeout: float = 20) -> None:
    """Wait until ``url`` answers ``status`` with ``body``; fails with the last answer."""
    last: object = None
    async with httpx.AsyncClient(timeout=2) as client:
        with trio.move_on_after(timeout):
            while True:
                reply = await client.get(url)
                last = (reply.status_code, reply.text)
                if last == (status, body):
                    return
                await trio.sleep(0.05)
    pytest.fail(f"{url} never answered {status} {body!r}; last {last!r}")


def test_liveness_is_the_database_and_readiness_everything() -> None:
    health = Health()
    health.serving = True
    assert health.alive() and health.ready()
    health.mark("capacity_refresh", False)
    assert health.alive() and not health.ready()
    assert health.down() == ["capacity_refresh"]
    health.mark("capacity_refresh", True)
    health.mark(DATABASE, False)
    assert not health.alive() and not health.ready()
    health.mark(DATABASE, True)
    assert health.alive() and health.ready()


async def test_an_unreachable_database_fails_both_checks_until_it_answers(db_url: str) -> None:
    async with tcp_proxy(db_url) as proxy, service(proxy.url(db_url), **ON) as (eng, _):
        await eng.set_model("sim-model", concurrency_limit=2)
        assert eng.metrics_url is not None
        base = eng.metrics_url.removesuffix("/metrics")
        await _until(f"{base}/healthz", 200, "ok\n")
        await _until(f"{base}/readyz", 200, "ready\n")

        proxy.cut()
        await _until(f"{base}/healthz", 503, "database unreachable\n")
        # Refreshes fail too: after FAILURES_NOT_READY of them the share is no longer known.
        await _until(f"{base}/readyz", 503, "not ready\n")
        assert DATABASE in eng.health.down()

        proxy.heal()
        await _until(f"{base}/healthz", 200, "ok\n", timeout=30)
        await _until(f"{base}/readyz", 200, "ready\n", timeout=30)


async def test_readyz_fails_while_a_share_has_no_generation(
    db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with service(db_url, **ON) as (eng, _):
        assert eng.metrics_url is not None
        readyz = eng.metrics_url.removesuffix("/metrics") + "/readyz"
        # No model yet: no capacity, no generation needed, ready.
        await _until(readyz, 200, "ready\n")

        real = eng.queue.make_generation

        def refuse(*args: Any, **kwargs: Any) -> Any:
            raise RuntimeError("no generation today")

        monkeypatch.setattr(eng.queue, "make_generation", refuse)
        await eng.set_model("sim-model", concurrency_limit=2)  # a share of 2 arrives
        await _until(readyz, 503, "not ready\n")
        assert eng.health.down() == ["generation"]

        monkeypatch.setattr(eng.queue, "make_generation", real)
        await _until(readyz, 200, "ready\n")
