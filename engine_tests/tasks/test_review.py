"""Manual review: Engine.resolve and ``python -m engine tasks resolve``, each way, fenced."""

from __future__ import annotations

import json
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
import trio

from engine.domain.tasks import TaskStatus
from engine.errors import TaskNotFound
from engine.providers.simulated import SimulatedProvider, SimulationConfig
from engine.service.engine import Engine
from engine.tasks.review import ReviewConflict
from engine_tests.tasks.conftest import OpenEngine, request

AMBIGUOUS = SimulationConfig(ambiguous_rate=1.0)


async def _manual(eng: Engine, n: int) -> list[uuid.UUID]:
    ids = await eng.submit([request() for _ in range(n)])
    for task_id in ids:
        task = await eng.wait(task_id, timeout=20)
        assert task.status is TaskStatus.MANUAL_REVIEW and task.river_job_id is not None
        # Its job's completion is written in batches, a moment after the task's outcome.
        with trio.fail_after(5):
            while (job := await eng.queue.get(task.river_job_id)) is None or job.state == "running":
                await trio.sleep(0.02)
    return ids


async def test_resolve_each_way(open_test_engine: OpenEngine) -> None:
    provider = SimulatedProvider(AMBIGUOUS)
    async with open_test_engine(simulated=provider) as eng:
        await eng.set_model("sim-model")
        ok, bad, again = await _manual(eng, 3)
        done = await eng.resolve(
            ok, succeeded=True, result={"url": "u"}, reason="found it upstream", actor="ana"
        )
        assert (done.status, done.result, done.progress) == (
            TaskStatus.SUCCEEDED,
            {"url": "u"},
            1.0,
        )
        failed = await eng.resolve(bad, failed=True, reason="upstream lost it", actor="bo")
        assert failed.status is TaskStatus.FAILED
        assert failed.error == {"code": "resolved_failed", "message": "upstream lost it"}
        for task_id, who, why, decision in ((ok, "ana", "found it upstream", "succeeded"),
                                            (bad, "bo", "upstream lost it", "failed")):  # fmt: skip
            # Events are written in batches: the task.manual_review one may land after ours.
            (last,) = [e for e in await eng.events(task_id) if e.type == "task.resolved"]
            assert last.payload == {"actor": who, "reason": why, "decision": decision}
        submissions = provider.submissions.get(again, 0)
        queued = await eng.resolve(again, resubmit=True, reason="not upstream", actor="cy")
        assert queued.status is TaskStatus.QUEUED and queued.upstream_ref is None
        assert queued.submitted_at is None and queued.river_job_id is not None
        # It runs again: submitted upstream once more (and lost again, on this upstream).
        assert (await eng.wait(again, timeout=20)).status is TaskStatus.MANUAL_REVIEW
        assert provider.submissions[again] == submissions + 1
        with trio.fail_after(5):  # the run's events are written in batches
            while [e.type for e in await eng.events(again)].count("task.started") < 2:
                await trio.sleep(0.02)
        types = [e.type for e in await eng.events(again)]
        assert types.count("task.resubmitted") == 1 and types.count("task.started") == 2


async def test_resolve_is_fenced_and_checked(open_test_engine: OpenEngine) -> None:
    async with open_test_engine(simulated=SimulatedProvider(AMBIGUOUS)) as eng:
        await eng.set_model("sim-model")
        (task_id,) = await _manual(eng, 1)
        with pytest.raises(ValueError, match="exactly one"):
            await eng.resolve(task_id, succeeded=True, failed=True, reason="r", actor="a")
        with pytest.raises(ValueError, match="reason"):
            await eng.resolve(task_id, failed=True, reason="  ", actor="a")
        with pytest.raises(ValueError, match="actor"):
            await eng.resolve(task_id, failed=True, reason="r", actor="")
        with pytest.raises(ValueError, match="result"):
            await eng.resolve(task_id, failed=True, result={"x": 1}, reason="r", actor="a")
        with pytest.raises(TaskNotFound):
            await eng.resolve(uuid.uuid4(), failed=True, reason="r", actor="a")
        await eng.resolve(task_id, failed=True, reason="first", actor="a")
        # A second decision (another operator, another tab) is refused and changes nothing.
        for kw in ({"succeeded": True}, {"failed": True}, {"resubmit": True}):
            with pytest.raises(ReviewConflict, match="is failed, not manual_review"):
                await eng.resolve(task_id, reason="second", actor="b", **kw)
        task = await eng.get(task_id)
        assert task is not None and task.error["message"] == "first"
        assert [e.type for e in await eng.events(task_id)].count("task.resolved") == 1


async def _cli(db_url: str, tmp_path: Path, *args: str) -> tuple[int, str, str]:
    env = {"ENGINE_DATA_DIR": str(tmp_path / "unused"), "PATH": "/usr/bin:/bin"}
    cmd = [sys.executable, "-W", "error", "-m", "engine", "--database-url", db_url,
           "--set", "database.migrate_on_start=false", *args]  # fmt: skip
    with trio.fail_after(60):
        proc = await trio.run_process(
            cmd, capture_stdout=True, capture_stderr=True, check=False, env=env
        )
    return proc.returncode, proc.stdout.decode(), proc.stderr.decode()


async def test_cli_resolve(open_test_engine: OpenEngine, db_url: str, tmp_path: Path) -> None:
    async with open_test_engine(simulated=SimulatedProvider(AMBIGUOUS)) as eng:
        await eng.set_model("sim-model")
        ok, again = await _manual(eng, 2)
    code, out, _ = await _cli(
        db_url, tmp_path, "tasks", "resolve", str(ok), "--succeeded", "--result", '{"n": 1}',
        "--reason", "checked upstream", "--actor", "ana", "--json",
    )  # fmt: skip
    assert code == 0
    doc: dict[str, Any] = json.loads(out)["task"]
    assert (doc["status"], doc["result"]) == ("succeeded", {"n": 1})
    code, _, err = await _cli(db_url, tmp_path, "tasks", "resolve", str(ok), "--failed",
                              "--reason", "again")  # fmt: skip
    assert code == 1 and "not manual_review" in err
    code, _, err = await _cli(db_url, tmp_path, "tasks", "resolve", str(again), "--resubmit",
                              "--reason", "lost")  # fmt: skip
    assert code == 1 and "--may-run-twice" in err
    code, out, _ = await _cli(db_url, tmp_path, "tasks", "resolve", str(again), "--resubmit",
                              "--reason", "lost", "--may-run-twice")  # fmt: skip
    assert code == 0 and "resubmitted" in out
    code, _, err = await _cli(db_url, tmp_path, "tasks", "resolve", str(again), "--reason", "x")
    assert code == 2 and "one of the arguments" in err
