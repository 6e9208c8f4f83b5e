"""Metrics and the metrics HTTP server."""

from __future__ import annotations

import enum
from collections.abc import AsyncIterator

import attrs
import pytest
import trio
from prometheus_client import REGISTRY

from engine.load.controller import LoadSnapshot, PressureState
from engine.metrics import CONTENT_TYPE, JOB_STATES, RESIZE_OUTCOMES, Metrics, MetricsServer

ALL_NAMES = [
    "engine_async_worker_capacity",
    "engine_async_worker_capacity_capped",
    "engine_distributed_worker_instances",
    "engine_distributed_worker_capacity",
    "engine_worker_load",
    "engine_worker_pressure_state",
    "engine_async_worker_resize_total",
    "engine_queue_jobs",
    "engine_job_claim_seconds",
    "engine_job_completion_batch_seconds",
    "engine_job_completions_total",
    "engine_task_phase_seconds",
    "engine_tasks_total",
    "engine_recoveries_total",
    "engine_admissions_waiting",
    "engine_leader",
    "engine_generations",
]


def value(metrics: Metrics, name: str, **labels: str) -> float | None:
    return metrics.registry.get_sample_value(name, labels)


def snapshot(pressure_state: PressureState = PressureState.ELEVATED) -> LoadSnapshot:
    return LoadSnapshot(
        mode="adaptive",
        claim_limit=10,
        safe_capacity=8,
        heavy_limit=6,
        active=7,
        preparing=2,
        waiting_upstream=4,
        finalizing=1,
        pressure_state=pressure_state,
        pressure_reason="cpu",
        sampled_at=1.0,
    )


class State(enum.StrEnum):
    COMPLETED = "completed"
    RETRYABLE = "retryable"


@attrs.frozen
class Done:
    """Stands in for ``engine.queue.executor.Completion``: only ``state`` is read."""

    state: State


# --- the metrics -----------------------------------------------------------------------------


def test_render_contains_every_metric() -> None:
    metrics = Metrics()
    # Touch the labelled series that only exist once used, so they render samples too.
    metrics.set_queue_depth({"default": {"available": 1}})
    metrics.observe_completions([Done(State.COMPLETED)], 0.01)
    metrics.observe_task_phase("preparing", 1.0)
    metrics.count_task("succeeded")
    metrics.count_recoveries("orphaned_jobs", 0)
    text = metrics.render().decode()
    for name in ALL_NAMES:
        assert f"\n{name}" in text or text.startswith(name), name
        assert f"# TYPE {name} " in text, name


def test_own_registry_never_the_global_one() -> None:
    first, second = Metrics(), Metrics()  # would raise "Duplicated timeseries" if shared
    assert first.registry is not second.registry
    assert first.registry is not REGISTRY
    first.set_leader(True)
    assert value(first, "engine_leader") == 1
    assert value(second, "engine_leader") == 0
    assert REGISTRY.get_sample_value("engine_leader") is None


def test_async_worker_and_distributed_capacity() -> None:
    metrics = Metrics()
    metrics.set_async_worker_capacity(current=3, desired=12, hard_limit=8, capped=True)
    assert value(metrics, "engine_async_worker_capacity", kind="current") == 3
    assert value(metrics, "engine_async_worker_capacity", kind="desired") == 12
    assert value(metrics, "engine_async_worker_capacity", kind="hard_limit") == 8
    assert value(metrics, "engine_async_worker_capacity_capped") == 1
    metrics.set_async_worker_capacity(current=3, desired=5, hard_limit=8, capped=False)
    assert value(metrics, "engine_async_worker_capacity_capped") == 0

    metrics.set_distributed_worker_capacity(active_instances=4, global_capacity=40, allocated=10)
    assert value(metrics, "engine_distributed_worker_instances") == 4
    assert value(metrics, "engine_distributed_worker_capacity", kind="global") == 40
    assert value(metrics, "engine_distributed_worker_capacity", kind="allocated") == 10


def test_resize_counter_increments() -> None:
    metrics = Metrics()
    for outcome in RESIZE_OUTCOMES:  # every outcome exists from the start, at 0
        assert value(metrics, "engine_async_worker_resize_total", outcome=outcome) == 0
    metrics.observe_resize("success")
    metrics.observe_resize("success")
    metrics.observe_resize("refresh_failed")
    assert value(metrics, "engine_async_worker_resize_total", outcome="success") == 2
    assert value(metrics, "engine_async_worker_resize_total", outcome="refresh_failed") == 1
    assert value(metrics, "engine_async_worker_resize_total", outcome="start_failed") == 0
    with pytest.raises(ValueError, match="unknown resize outcome"):
        metrics.observe_resize("succes")


def test_worker_load_and_one_hot_pressure() -> None:
    metrics = Metrics()

    def pressure() -> dict[str, float | None]:
        return {
            s.value: value(metrics, "engine_worker_pressure_state", state=s.value)
            for s in PressureState
        }

    assert pressure() == {"normal": 1, "elevated": 0, "critical": 0}
    metrics.set_worker_load(snapshot())
    expected = {
        "active_limit": 8,
        "heavy_limit": 6,
        "active": 7,
        "preparing": 2,
        "waiting_upstream": 4,
        "finalizing": 1,
    }
    for kind, number in expected.items():
        assert value(metrics, "engine_worker_load", kind=kind) == number, kind
    assert pressure() == {"normal": 0, "elevated": 1, "critical": 0}
    metrics.set_worker_load(snapshot(pressure_state=PressureState.CRITICAL))
    assert pressure() == {"normal": 0, "elevated": 0, "critical": 1}
    metrics.set_pressure_state("normal")
    assert pressure() == {"normal": 1, "elevated": 0, "critical": 0}
    with pytest.raises(ValueError):
        metrics.set_pressure_state("panic")


def test_queue_depth_is_a_full_snapshot() -> None:
    metrics = Metrics()
    metrics.set_queue_depth({"default": {"available": 5, "running": 2}, "media": {"retryable": 1}})
    assert value(metrics, "engine_queue_jobs", queue="default", state="available") == 5
    assert value(metrics, "engine_queue_jobs", queue="default", state="running") == 2
    for state in JOB_STATES:  # zero-filled
        assert value(metrics, "engine_queue_jobs", queue="media", state=state) is not None
    assert value(metrics, "engine_queue_jobs", queue="media", state="scheduled") == 0

    metrics.set_queue_depth({"default": {"available": 1}})
    assert value(metrics, "engine_queue_jobs", queue="default", state="available") == 1
    assert value(metrics, "engine_queue_jobs", queue="default", state="running") == 0
    # A queue that disappeared is removed, not left at its last value.
    assert value(metrics, "engine_queue_jobs", queue="media", state="retryable") is None


def test_completions_and_carried_writes() -> None:
    metrics = Metrics()
    batch = [Done(State.COMPLETED), Done(State.COMPLETED), Done(State.RETRYABLE)]
    metrics.observe_completions(batch, 0.02)
    assert value(metrics, "engine_job_completions_total", state="completed") == 2
    assert value(metrics, "engine_job_completions_total", state="retryable") == 1
    assert value(metrics, "engine_job_completion_batch_seconds_count") == 1
    assert value(metrics, "engine_job_completion_batch_seconds_sum") == pytest.approx(0.02)
    # A write carried by a claim arrives as an empty batch: counts nothing.
    metrics.observe_completions([], 0.0)
    assert value(metrics, "engine_job_completion_batch_seconds_count") == 1
    assert value(metrics, "engine_job_completions_total", state="completed") == 2


def test_the_other_engine_metrics() -> None:
    metrics = Metrics()
    metrics.observe_claim(0.004)
    assert value(metrics, "engine_job_claim_seconds_count") == 1
    metrics.observe_task_phase("finalizing", 42.0)
    assert value(metrics, "engine_task_phase_seconds_count", phase="finalizing") == 1
    metrics.count_task("failed", 3)
    assert value(metrics, "engine_tasks_total", status="failed") == 3
    metrics.count_recovery_round({"requeued_async_tasks": 2, "orphaned_jobs": 0})
    assert value(metrics, "engine_recoveries_total", kind="requeued_async_tasks") == 2
    assert value(metrics, "engine_recoveries_total", kind="orphaned_jobs") == 0
    metrics.set_admissions_waiting(7)
    assert value(metrics, "engine_admissions_waiting") == 7
    metrics.set_generations(2)
    assert value(metrics, "engine_generations") == 2
    metrics.set_leader(True)
    metrics.set_leader(False)
    assert value(metrics, "engine_leader") == 0


# --- the HTTP server -------------------------------------------------------------------------


@attrs.frozen
class Reply:
    status: int
    headers: dict[str, str]
    body: bytes


async def exchange(port: int, raw: bytes) -> Reply:
    """Send ``raw`` and read the whole reply (the server closes after each response)."""
    with trio.fail_after(5):
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        async with stream:
            if raw:
                await stream.send_all(raw)
            data = await read_to_eof(stream)
    return parse(data)


async def read_to_eof(stream: trio.SocketStream) -> bytes:
    data = bytearray()
    while chunk := await stream.receive_some(65536):
        data += chunk
    return bytes(data)


def parse(data: bytes) -> Reply:
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split(" ")[1])
    headers = {}
    for line in lines[1:]:
        name, _, val = line.partition(":")
        headers[name.strip().lower()] = val.strip()
    assert int(headers["content-length"]) == len(body)
    assert headers["connection"] == "close"
    return Reply(status, headers, body)


def get(path: str, method: str = "GET") -> bytes:
    return f"{method} {path} HTTP/1.1\r\nHost: localhost\r\nUser-Agent: test\r\n\r\n".encode()


class Ready:
    def __init__(self) -> None:
        self.flag = False
        self.error: Exception | None = None

    def __call__(self) -> bool:
        if self.error is not None:
            raise self.error
        return self.flag


@pytest.fixture
async def served() -> AsyncIterator[tuple[int, Metrics, Ready, MetricsServer]]:
    metrics = Metrics()
    ready = Ready()
    server = MetricsServer(metrics, host="127.0.0.1", port=0, ready=ready, read_timeout=1.0)
    async with trio.open_nursery() as nursery:
        port = await nursery.start(server.run)
        assert port == server.bound_port and port > 0
        yield port, metrics, ready, server
        nursery.cancel_scope.cancel()


async def test_http_metrics(served: tuple[int, Metrics, Ready, MetricsServer]) -> None:
    port, metrics, _, _ = served
    metrics.observe_resize("success")
    reply = await exchange(port, get("/metrics"))
    assert reply.status == 200
    assert reply.headers["content-type"] == CONTENT_TYPE
    assert CONTENT_TYPE == "text/plain; version=0.0.4; charset=utf-8"
    assert reply.body == metrics.render()
    text = reply.body.decode()
    assert 'engine_async_worker_resize_total{outcome="success"} 1.0' in text
    # A query string does not change the route.
    assert (await exchange(port, get("/metrics?name[]=engine_leader"))).status == 200


async def test_http_health_and_readiness(
    served: tuple[int, Metrics, Ready, MetricsServer],
) -> None:
    port, _, ready, _ = served
    health = await exchange(port, get("/healthz"))
    assert (health.status, health.body) == (200, b"ok\n")
    assert (await exchange(port, get("/readyz"))).status == 503
    ready.flag = True
    assert (await exchange(port, get("/readyz"))).status == 200
    ready.error = RuntimeError("check broke")
    assert (await exchange(port, get("/readyz"))).status == 503


async def test_http_errors(served: tuple[int, Metrics, Ready, MetricsServer]) -> None:
    port, _, _, _ = served
    assert (await exchange(port, get("/nope"))).status == 404
    reply = await exchange(port, get("/metrics", method="POST"))
    assert reply.status == 405
    assert reply.headers["allow"] == "GET"
    assert (await exchange(port, get("/healthz", method="HEAD"))).status == 405
    assert (await exchange(port, b"\x16\x03\x01garbage\r\n\r\n")).status == 400
    assert (await exchange(port, b"GET /healthz\r\n\r\n")).status == 400  # no version
    # Bare LF line endings are tolerated.
    assert (await exchange(port, b"GET /healthz HTTP/1.0\n\n")).status == 200


async def test_http_oversized_request_is_rejected(
    served: tuple[int, Metrics, Ready, MetricsServer],
) -> None:
    port, _, _, _ = served
    huge = b"GET /metrics HTTP/1.1\r\nX-Pad: " + b"a" * 20_000 + b"\r\n\r\n"
    assert (await exchange(port, huge)).status == 431
    # A head just over the cap with its terminator inside the first read is rejected too.
    over = b"GET /metrics HTTP/1.1\r\nX-Pad: " + b"a" * 8200 + b"\r\n\r\n"
    assert (await exchange(port, over)).status == 431
    assert (await exchange(port, get("/healthz"))).status == 200


async def test_http_silent_client_times_out_without_blocking_others(
    served: tuple[int, Metrics, Ready, MetricsServer],
) -> None:
    port, _, _, server = served
    with trio.fail_after(5):
        silent = await trio.open_tcp_stream("127.0.0.1", port)
        async with silent:
            opened = trio.current_time()
            # While the silent client holds its connection, others are served at once.
            assert (await exchange(port, get("/healthz"))).status == 200
            assert trio.current_time() - opened < server.read_timeout
            reply = parse(await read_to_eof(silent))
            assert reply.status == 408
            assert trio.current_time() - opened >= server.read_timeout * 0.9
    # A client that connects and hangs up at once gets nothing and breaks nothing.
    gone = await trio.open_tcp_stream("127.0.0.1", port)
    await gone.aclose()
    assert (await exchange(port, get("/healthz"))).status == 200


async def test_http_sheds_connections_over_the_limit() -> None:
    server = MetricsServer(lambda: b"x 1\n", port=0, read_timeout=1.0, max_connections=1)
    async with trio.open_nursery() as nursery:
        port = await nursery.start(server.run)
        with trio.fail_after(5):
            holder = await trio.open_tcp_stream("127.0.0.1", port)
            opened = trio.current_time()
            async with holder:
                while server.connections < 1:  # the holder is accepted and counted
                    await trio.sleep(0.001)
                extra = await trio.open_tcp_stream("127.0.0.1", port)
                async with extra:
                    await extra.send_all(get("/healthz"))
                    # Shed: closed at once without a reply, not queued behind the holder.
                    assert await read_to_eof(extra) == b""
                    assert trio.current_time() - opened < server.read_timeout
                assert parse(await read_to_eof(holder)).status == 408
            reply = await exchange(port, get("/metrics"))
            assert (reply.status, reply.body) == (200, b"x 1\n")
        nursery.cancel_scope.cancel()
