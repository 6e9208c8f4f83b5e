"""Settings that act through the engine and the service, each observed on a real database:
``load.retry_base``/``load.retry_spread_ms`` (the refused run's snooze),
``queue.default_max_attempts`` (not for task jobs), ``queue.job_timeout`` on task runs,
``worker.enqueue_rollback_timeout`` (a failed submit's rollback) and
``worker.startup_attempts``/``worker.startup_retry_delay`` (the service start)."""

from __future__ import annotations

import functools
import logging
import os
import uuid
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import pytest
import trio

from engine.db.bridge import connect
from engine.db.database import DatabaseUrls
from engine.db.dsn import replace_database
from engine.db.resolve import scratch_database
from engine.domain.tasks import TaskStatus
from engine.errors import ConfigError, DatabaseError, DataDirError, leaves
from engine.load.retry_delay import refused_start_delay
from engine.queue.config import MAX_WORKERS
from engine.queue.states import JobState
from engine.service.engine import Engine
from engine.service.root import open as open_engine
from engine.service.root import serve
from engine_tests.load.test_claim_limit import PinnedClaimLimit
from engine_tests.service.test_service import FAST
from engine_tests.tasks.conftest import make_config, request
from engine_tests.tasks.test_runner import GatedProvider, job_of

# ---- load.retry_base / load.retry_spread_ms ---------------------------------------------------


async def test_load_retry_settings_set_the_snooze_of_a_refused_run(db_url: str) -> None:
    config = make_config(**{"load.retry_base": "20", "load.retry_spread_ms": "1000"})
    refuse_all = PinnedClaimLimit(mode="legacy", claim_limit=0)
    async with open_engine(
        config,
        urls=DatabaseUrls.single(db_url),
        simulated=GatedProvider(),
        load=refuse_all,
    ) as eng:
        await eng.set_model("sim-model")
        task_id = await eng.submit(request())
        with trio.fail_after(10):
            while (job := await job_of(eng, task_id)).metadata.get("snoozes") != 1:
                await trio.sleep(0.01)
        expected = refused_start_delay(str(task_id), base=20.0, spread_ms=1000)
        assert 20.0 <= expected < 21.0
        # Snoozed past the scheduler's 5 s look-ahead, so scheduled rather than available; by
        # the configured delay, not the default 250-750 ms.
        assert job.state is JobState.SCHEDULED and job.attempt == 0
        assert job.attempted_at is not None
        snooze = (job.scheduled_at - job.attempted_at).total_seconds()
        assert abs(snooze - expected) < 0.25, (snooze, expected)
        task = await eng.get(task_id)
        assert task is not None and task.status is TaskStatus.QUEUED


# ---- queue.default_max_attempts leaves task jobs alone ---------------------------------------


async def test_task_jobs_keep_their_attempts_whatever_the_default(db_url: str) -> None:
    config = make_config(**{"queue.default_max_attempts": "3"})
    async with open_engine(
        config, urls=DatabaseUrls.single(db_url), simulated=GatedProvider(), control=False
    ) as eng:
        await eng.set_model("sim-model")
        task_job = await job_of(eng, await eng.submit(request()))
        assert task_job.max_attempts == 1000  # queue.insert_max_attempts
        other = await eng.queue.insert({"x": 1}, kind="something_else")
        assert other.job.max_attempts == 3


# ---- queue.job_timeout on task runs ----------------------------------------------------------


async def test_job_timeout_cuts_a_task_run_which_is_requeued_and_resumes(db_url: str) -> None:
    provider = GatedProvider()
    gate = provider.poll_gate = trio.Event()
    config = make_config(**{"queue.job_timeout": "0.5"})
    async with open_engine(config, urls=DatabaseUrls.single(db_url), simulated=provider) as eng:
        await eng.set_model("sim-model")
        task_id = await eng.submit(request())
        # The run submits upstream, then waits in poll until the job's deadline cuts it.
        with trio.fail_after(10):
            while not (job := await job_of(eng, task_id)).errors:
                await trio.sleep(0.01)
        assert job.errors[0]["error"] == "job timed out after 0.5 s"
        assert job.errors[0]["attempt"] == 1
        gate.set()
        task = await eng.wait(task_id, timeout=15)
        assert task.status is TaskStatus.SUCCEEDED
        # The retry resumed polling the first submission: upstream saw one request.
        assert sum(provider.submissions.values()) == 1
        job = await job_of(eng, task_id)
        assert job.attempt == 2 and len(job.errors) == 1
        events = [e.type for e in await eng.events(task_id)]
        assert "task.requeued" in events


# ---- worker.enqueue_rollback_timeout ---------------------------------------------------------


class FreezableProxy:
    """A TCP proxy to the database that the test can freeze: bytes stop flowing both ways, as
    on a stalled network, until it thaws. The server itself is the real one."""

    def __init__(self, host: str, port: int) -> None:
        self.host = host
        self.port = port
        self.thawed = trio.Event()
        self.thawed.set()

    def freeze(self) -> None:
        self.thawed = trio.Event()

    def thaw(self) -> None:
        self.thawed.set()

    async def run(self, *, task_status: trio.TaskStatus[int]) -> None:
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        task_status.started(listeners[0].socket.getsockname()[1])
        await trio.serve_listeners(self._handle, listeners)

    async def _handle(self, client: trio.SocketStream) -> None:
        server = await trio.open_tcp_stream(self.host, self.port)
        async with client, server, trio.open_nursery() as nursery:
            nursery.start_soon(self._pump, client, server, nursery.cancel_scope)
            nursery.start_soon(self._pump, server, client, nursery.cancel_scope)

    async def _pump(
        self, source: trio.SocketStream, sink: trio.SocketStream, pair: trio.CancelScope
    ) -> None:
        try:
            while data := await source.receive_some():
                await self.thawed.wait()
                await sink.send_all(data)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        pair.cancel()  # one side closed: close the other


def _via(url: str, port: int) -> str:
    parts = urlsplit(url)
    userinfo = parts.netloc.rpartition("@")[0]
    netloc = f"{userinfo}@127.0.0.1:{port}" if userinfo else f"127.0.0.1:{port}"
    return urlunsplit(parts._replace(netloc=netloc))


async def test_enqueue_rollback_timeout_bounds_a_failed_submits_rollback(db_url: str) -> None:
    parts = urlsplit(db_url)
    if parts.hostname is None or parts.port is None or parts.hostname.startswith("/"):
        pytest.skip("needs a TCP database URL to put a proxy in front of")
    proxy = FreezableProxy(parts.hostname, parts.port)
    config = make_config(
        **{"worker.enqueue_rollback_timeout": "0.5", "tasks.lease_renew_interval": "15"}
    )
    async with trio.open_nursery() as nursery:
        port = await nursery.start(proxy.run)
        # Only the tasks pool (where submit's statement runs) goes through the proxy.
        urls = DatabaseUrls(tasks=_via(db_url, port), coordination=db_url, queue=db_url)
        admin = await connect(db_url)
        try:
            async with open_engine(
                config, urls=urls, simulated=GatedProvider(), control=False
            ) as eng:
                await eng.set_model("sim-model")
                submit_scope = trio.CancelScope()
                submit_done = trio.Event()

                async def submit() -> None:
                    try:
                        with submit_scope:
                            await eng.submit(request())
                    finally:
                        submit_done.set()

                async with admin.transaction():
                    # Hold the submit's statement: it waits for this lock.
                    await admin.execute("LOCK TABLE engine_task IN SHARE MODE")
                    nursery.start_soon(submit)
                    with trio.fail_after(10):
                        while not await admin.fetchval(
                            "SELECT count(*) FROM pg_stat_activity WHERE datname = "
                            "current_database() AND wait_event_type = 'Lock'"
                        ):
                            await trio.sleep(0.01)
                    # The network stalls, then the submit is cancelled: the server cannot
                    # acknowledge its cancel, and the wait for that must give up after 0.5 s,
                    # not the general 10 s.
                    proxy.freeze()
                    cancelled_at = trio.current_time()
                    submit_scope.cancel()
                    with trio.fail_after(5):
                        await submit_done.wait()
                    took = trio.current_time() - cancelled_at
                    proxy.thaw()
                assert submit_scope.cancelled_caught
                assert 0.5 <= took < 3.0, took
                # The submit is one statement, its own transaction: its cancel, held by the
                # stalled network, may reach the server after the lock is gone and the
                # statement ran. Either way it was whole, the task with its job or neither
                # (engine_tests/tasks/test_submit_statement.py has a cancel the server gets in
                # time: nothing stored). And the pool still works: the connection whose cancel
                # was never acknowledged was dropped, not reused.
                stored = await admin.fetchrow(
                    "SELECT (SELECT count(*) FROM engine_task) AS tasks,"
                    " (SELECT count(*) FROM river_job) AS jobs"
                )
                assert stored is not None and tuple(stored.values()) in {(0, 0), (1, 1)}
                with trio.fail_after(10):
                    task_id = await eng.submit(request())
                assert (
                    await admin.fetchval("SELECT count(*) FROM engine_task WHERE id = $1", task_id)
                    == 1
                )
        finally:
            await admin.close()
            proxy.thaw()
            nursery.cancel_scope.cancel()


# ---- worker.startup_attempts / worker.startup_retry_delay ------------------------------------


def _start_retries(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if getattr(r, "event", None) == "service_start_retry"]


async def test_a_failed_service_start_is_retried_until_it_succeeds(
    pg_admin_url: str, template_db: str, aio_loop: None, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="engine.service.root")
    name = f"engine_t_{uuid.uuid4().hex[:12]}"
    url = replace_database(pg_admin_url, name)
    # The database does not exist yet: the server answers, so connecting is not retried
    # (database.connect_attempts); the whole start is, from scratch.
    config = make_config(
        **FAST,
        **{
            "database.connect_attempts": "1",
            "worker.startup_attempts": "50",
            "worker.startup_retry_delay": "0.1",
        },
    )

    async def create_database_after_a_failed_start() -> None:
        while not _start_retries(caplog):
            await trio.sleep(0.01)
        admin = await connect(pg_admin_url)
        try:
            await admin.execute(f'CREATE DATABASE "{name}" TEMPLATE "{template_db}"')
        finally:
            await admin.close()

    try:
        with trio.fail_after(30):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(create_database_after_a_failed_start)
                eng = await nursery.start(
                    functools.partial(serve, config, urls=DatabaseUrls.single(url))
                )
                assert isinstance(eng, Engine)
                await eng.set_model("sim-model")
                task = await eng.wait(await eng.submit(request()), timeout=10)
                assert task.status is TaskStatus.SUCCEEDED
                nursery.cancel_scope.cancel()
        retries = _start_retries(caplog)
        assert retries and [r.attempt for r in retries] == list(range(1, len(retries) + 1))  # type: ignore[attr-defined]
        assert all("does not exist" in r.error for r in retries)  # type: ignore[attr-defined]
    finally:
        with trio.CancelScope(shield=True):
            admin = await connect(pg_admin_url)
            try:
                await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            finally:
                await admin.close()


async def test_the_service_gives_up_after_startup_attempts(
    pg_admin_url: str, aio_loop: None, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="engine.service.root")
    url = replace_database(pg_admin_url, f"engine_missing_{uuid.uuid4().hex[:12]}")
    config = make_config(
        **FAST,
        **{
            "database.connect_attempts": "1",
            "worker.startup_attempts": "3",
            "worker.startup_retry_delay": "0.2",
        },
    )
    started = trio.current_time()
    with trio.fail_after(20), pytest.raises(BaseException) as raised:
        await serve(config, urls=DatabaseUrls.single(url))
    took = trio.current_time() - started
    errors = [e for e in leaves(raised.value) if isinstance(e, DatabaseError)]
    assert len(errors) == 1 and "does not exist" in str(errors[0])
    # Three attempts: two retries logged, 0.2 s apart; the third attempt's error escaped.
    assert [r.attempt for r in _start_retries(caplog)] == [1, 2]  # type: ignore[attr-defined]
    assert took >= 0.4


async def test_a_configuration_error_at_start_is_not_retried(
    db_url: str, pg_admin_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="engine.service.root")
    config = make_config(**FAST, **{"worker.startup_attempts": "3"})
    async with scratch_database(pg_admin_url, "engine_other_") as other:
        urls = DatabaseUrls(tasks=db_url, coordination=other, queue=db_url)
        with trio.fail_after(20), pytest.raises(BaseException) as raised:
            await serve(config, urls=urls)
    errors = [e for e in leaves(raised.value) if isinstance(e, ConfigError)]
    assert len(errors) == 1 and "database.coordination_url" in str(errors[0])
    assert _start_retries(caplog) == []


async def test_a_data_directory_that_is_not_engines_is_not_retried(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="engine.service.root")
    (tmp_path / "notes.txt").write_text("someone else's directory")
    config = make_config(**FAST, data_dir=str(tmp_path), **{"worker.startup_attempts": "3"})
    with trio.fail_after(20), pytest.raises(BaseException) as raised:
        await serve(config)
    (error,) = [e for e in leaves(raised.value) if isinstance(e, DataDirError)]
    assert "not created by engine" in str(error)
    assert _start_retries(caplog) == []
    assert os.listdir(tmp_path) == ["notes.txt"]  # left untouched


# ---- worker.hard_limit / worker.instance_hard_limit ---------------------------------------------


@pytest.mark.parametrize("capacity", ["registry", "fixed"])
async def test_a_hard_limit_above_what_one_generation_runs_gives_the_generation_maximum(
    db_url: str, capacity: str
) -> None:
    """A cluster-wide cap of twice what a generation runs, with one instance: the instance
    runs one generation of MAX_WORKERS (100,000), instead of failing every refresh."""
    config = make_config(**{"worker.capacity": capacity, "worker.hard_limit": 2 * MAX_WORKERS})
    async with open_engine(config, urls=DatabaseUrls.single(db_url)) as eng:
        await eng.set_model("unlimited")  # the registry's capacity: up to the hard limit
        with trio.fail_after(10):
            while eng.queue.slots.total != MAX_WORKERS or not eng.queue.generations:
                await trio.sleep(0.02)
        assert eng.ready


@pytest.mark.parametrize(
    ("setting", "value", "message"),
    [
        ("worker.hard_limit", "2147483648", "worker.hard_limit = '2147483648'"),
        (
            "worker.instance_hard_limit",
            "100001",
            "worker.instance_hard_limit = '100001' .*: must be an integer from 0 to 100000",
        ),
        (
            "queue.max_workers",
            "100001",
            "queue.max_workers = '100001' .*: must be an integer from 1 to 100000",
        ),
    ],
)
def test_limits_the_database_or_a_generation_cannot_hold_are_config_errors(
    setting: str, value: str, message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        make_config(**{setting: value})
