"""What an embedding app's tests use: ``engine.testing`` and the public ``engine`` names."""

from __future__ import annotations

from typing import Any

import engine
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
