"""``python -m engine run`` with your own providers, beside an app that embeds the engine, as
users run them: real subprocesses on one database, real signals, real exit codes."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import trio

import engine
from engine.db.database import DatabaseUrls
from engine.domain.tasks import Identity, TaskRequest, TaskStatus
from engine_tests.acceptance.test_cli import (
    DEADLINE,
    REPO_ROOT,
    Running,
    child_env,
    cleanup_data_dir,
    engine_cmd,
    make_data_dir,
)
from engine_tests.service.sample_service_app import SleepyEcho
from engine_tests.service.test_root import embedded_config, started_events, wait_polling
from engine_tests.test_docs import _readme_example

APP = "engine_tests.service.sample_service_app"
IDENTITY = Identity(tenant_id="acme", user_id="user-1")


@contextmanager
def service(db_url: str, *args: str, **env: str) -> Iterator[Running]:
    """``python -m engine --database-url DB ... run ARGS``, from the repository root (so the
    test app imports), until it prints that it runs."""
    cmd = engine_cmd(
        "--database-url",
        db_url,
        "--set",
        "metrics.enabled=false",
        "--set",
        "worker.refresh_interval=0.5",
        "--set",
        "tasks.demo_catalogue=false",
        "run",
        *args,
    )
    # From the repository root, so that the child imports the test app.
    running = Running(cmd, child_env(**env), cwd=REPO_ROOT)
    try:
        running.wait_for_line("engine: running")
        yield running
    finally:
        running.close()


def live(model: str, **payload: Any) -> TaskRequest:
    return TaskRequest(model=model, payload=payload, identity=IDENTITY)


async def test_run_with_an_app_runs_its_providers_inside_its_context(db_url: str) -> None:
    log = Path(tempfile.mkdtemp(prefix="engine-app-")) / "app.log"
    urls = DatabaseUrls.single(db_url)
    with service(db_url, "--app", f"{APP}:open_app", ENGINE_TEST_APP_LOG=str(log)) as proc:
        assert log.read_text() == "opened\n"
        async with engine.open(embedded_config(), urls=urls, control=False) as client:
            await client.set_model("echo")
            task = await client.wait(await client.submit(live("echo", text="hi")), timeout=30)
        assert task.status is TaskStatus.SUCCEEDED, task.error
        assert task.result == {"echo": "hi", "by": "echo-from-context"}
        proc.proc.send_signal(signal.SIGINT)
        assert proc.wait() == 0
    assert log.read_text() == "opened\nclosed\n"


async def test_an_app_and_a_service_without_providers_share_a_database(db_url: str) -> None:
    urls = DatabaseUrls.single(db_url)
    with service(db_url):
        async with engine.open(
            embedded_config(), urls=urls, providers={"echo": SleepyEcho("app")}
        ) as app:
            await app.set_model("echo")
            ids = await app.submit([live("echo", text=str(n)) for n in range(20)])
            tasks = [await app.wait(task_id, timeout=30) for task_id in ids]
            runs = await started_events(app, ids)
    assert [t.status for t in tasks] == [TaskStatus.SUCCEEDED] * 20
    assert not [t for t in tasks if (t.error or {}).get("code") == "no_provider"]
    assert {e.instance_id for e in runs} == {app.instance_id} and len(runs) == 20


async def test_a_service_and_an_app_with_disjoint_providers_split_the_work(db_url: str) -> None:
    urls = DatabaseUrls.single(db_url)
    with service(db_url, "--app", f"{APP}:PROVIDERS"):
        async with engine.open(
            embedded_config(), urls=urls, providers={"other": SleepyEcho("other")}
        ) as app:
            await app.set_model("echo")
            await app.set_model("other")
            ids = await app.submit(
                [live(model, text=str(n)) for n in range(10) for model in ("echo", "other")]
            )
            tasks = [await app.wait(task_id, timeout=30) for task_id in ids]
    for task in tasks:
        assert task.status is TaskStatus.SUCCEEDED, task.error
        assert task.result == {"echo": task.payload["text"], "by": task.model}
        assert task.attempts == 1


async def test_first_signal_lets_a_running_task_finish_the_second_requeues_it(
    db_url: str,
) -> None:
    urls = DatabaseUrls.single(db_url)
    async with engine.open(embedded_config(), urls=urls, control=False) as client:
        await client.set_model("echo")
        with service(db_url, "--app", f"{APP}:PROVIDERS") as proc:
            finishing = await client.submit(live("echo", text="2 s", sleep=2))
            await wait_polling(client, finishing)
            proc.proc.send_signal(signal.SIGINT)
            assert proc.wait() == 0
        task = await client.get(finishing)
        assert task is not None and task.status is TaskStatus.SUCCEEDED, task

        with service(db_url, "--app", f"{APP}:PROVIDERS") as proc:
            requeued = await client.submit(live("echo", text="long", sleep=120))
            await wait_polling(client, requeued)
            proc.proc.send_signal(signal.SIGINT)
            proc.wait_for_stderr("event=shutdown_draining")
            proc.proc.send_signal(signal.SIGTERM)
            proc.wait_for_stderr("requeueing running tasks now")
            assert proc.wait() == 0
        task = await client.get(requeued)
        assert task is not None and task.status is TaskStatus.QUEUED, task
        assert task.upstream_ref is not None and task.attempts == 1


async def test_a_busy_metrics_port_is_one_line_naming_the_address_and_the_setting(
    db_url: str,
) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        result = await _run("--database-url", db_url, "--set", f"metrics.port={port}", "run")
    assert result.returncode == 2, result.stderr
    errors = [line for line in result.stderr.splitlines() if not line.startswith("ts=")]
    assert errors == [
        f"engine: error: metrics.port: 127.0.0.1:{port} is already in use; set metrics.port "
        "(ENGINE_METRICS_PORT, or --set metrics.port=N) to a free port, 0 for any free port, "
        "or metrics.enabled=false"
    ]
    assert "service_start_retry" not in result.stderr  # not retried


async def test_an_app_with_a_broken_provider_is_refused_in_one_line(db_url: str) -> None:
    result = await _run("--database-url", db_url, "run", "--app", f"{APP}:BROKEN")
    assert result.returncode == 2, result.stderr
    errors = [line for line in result.stderr.splitlines() if not line.startswith("ts=")]
    assert len(errors) == 1 and errors[0].startswith(
        "engine: error: provider for model 'broken' (NoPoll) is missing poll;"
    ), result.stderr


async def _run(*args: str) -> subprocess.CompletedProcess[str]:
    """``python -m engine ARGS`` to its end (from the repository root), output as text."""
    with trio.fail_after(DEADLINE):
        done = await trio.run_process(
            engine_cmd(*args),
            env=child_env(),
            cwd=REPO_ROOT,
            capture_stdout=True,
            capture_stderr=True,
            check=False,
        )
    return subprocess.CompletedProcess(
        done.args, done.returncode, done.stdout.decode(), done.stderr.decode()
    )


async def test_the_readmes_two_steps_end_with_the_example_printing_its_result() -> None:
    data_dir = make_data_dir()
    example = Path(tempfile.mkdtemp(prefix="engine-readme-")) / "example.py"
    example.write_text(_readme_example())
    env = child_env(data_dir, ENGINE_METRICS_PORT="0")
    try:
        # Step one: the service, on the embedded default.
        running = Running(engine_cmd(), env)
        try:
            running.wait_for_line("engine: running")
            # Step two, in another terminal: the library example.
            with trio.fail_after(DEADLINE):
                done = await trio.run_process(
                    [sys.executable, "-W", "error", str(example)],
                    env=env,
                    capture_stdout=True,
                    capture_stderr=True,
                    check=False,
                )
            assert done.returncode == 0, done.stderr.decode()
            assert done.stdout.decode() == "succeeded {'echo': 'hello'}\n"
            running.proc.send_signal(signal.SIGINT)
            assert running.wait() == 0
        finally:
            running.close()
    finally:
        cleanup_data_dir(data_dir)
