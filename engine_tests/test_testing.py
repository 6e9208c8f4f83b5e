"""What an embedding app's tests use: ``engine.testing`` and the public ``engine`` names."""

from __future__ import annotations

from typing import Any

import pytest

import engine
import engine.testing
from engine.db.bridge import connect
from engine.errors import ConnectionLost
from engine.testing import open_test_engine, run_until_final, temporary_database


class EchoProvider:
    """An embedding app's own provider: upstream answers at once with the prompt."""

    poll_interval = 0.0

    async def prepare(self, task: engine.Task) -> Any:
        return task.payload

    async def submit(self, task: engine.Task, prepared: Any) -> str:
        return f"echo-{task.id}"

    async def poll(self, task: engine.Task, upstream_ref: str) -> engine.PollResult:
        return engine.PollResult(True, result={"echo": task.payload["prompt"]})

    async def finalize(self, task: engine.Task, result: Any) -> Any:
        return result

    async def cancel(self, task: engine.Task, upstream_ref: str) -> None:
        return None


async def test_an_embedding_apps_task_runs_to_completion(pg_admin_url: str, aio_loop: None) -> None:
    assert isinstance(EchoProvider(), engine.Provider)
    async with (
        temporary_database(pg_admin_url) as url,
        open_test_engine(providers={"echo": EchoProvider()}, url=url) as eng,
    ):
        await eng.set_model("echo")
        identity = engine.Identity(tenant_id="app", user_id="u")
        ids = await eng.submit(
            [
                engine.TaskRequest(model="echo", payload={"prompt": p}, identity=identity)
                for p in ("a", "b")
            ]
        )
        tasks = await run_until_final(eng, ids, timeout=10)
    assert [t.status for t in tasks] == [engine.TaskStatus.SUCCEEDED] * 2
    assert [t.result for t in tasks] == [{"echo": "a"}, {"echo": "b"}]


def test_public_names_are_exported() -> None:
    for name in engine.__all__:
        assert hasattr(engine, name), name
    assert engine.open is engine.service.root.open  # type: ignore[attr-defined]
    assert engine.serve is engine.service.root.serve  # type: ignore[attr-defined]


def test_the_testing_kits_names_are_importable() -> None:
    for name in (
        "open_test_engine",
        "run_until_final",
        "temporary_database",
        *engine.testing.__all__,
    ):
        assert hasattr(engine.testing, name), name


async def test_a_temporary_database_without_a_server_starts_one(
    monkeypatch: pytest.MonkeyPatch, aio_loop: None
) -> None:
    monkeypatch.delenv("ENGINE_TEST_DATABASE_URL", raising=False)
    async with temporary_database() as url:
        conn = await connect(url)
        try:
            assert await conn.fetchval("SELECT count(*) FROM engine_migration") > 0
        finally:
            await conn.close()
    with pytest.raises(ConnectionLost):  # the server it started is gone
        await connect(url, timeout=2)


async def test_a_manual_test_engine_with_its_models(pg_admin_url: str, aio_loop: None) -> None:
    async with (
        temporary_database(pg_admin_url) as url,
        open_test_engine(
            providers={"echo": EchoProvider()}, url=url, manual=True, register_models=True
        ) as eng,
    ):
        assert eng.config.worker.mode == "client"
        task_id = await eng.submit(  # no set_model: registered
            engine.TaskRequest(
                model="echo", payload={"prompt": "a"}, identity=engine.Identity("t", "u")
            )
        )
        [ran] = await engine.testing.drain(eng)
    assert ran.id == task_id and ran.result == {"echo": "a"}
