"""The pytest plugin: its fixtures, how it loads (entry point or ``-p``), and that loading it
starts nothing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
import trio

import engine
from engine.db.bridge import connect
from engine.testing import drain, make_request

from .scripted import Scripted

ROOT = Path(__file__).resolve().parents[2]
PLUGIN = "engine.testing.plugin"

_seen_databases: list[str] = []


async def _one_database(url: str) -> None:
    conn = await connect(url)
    try:
        name = await conn.fetchval("SELECT current_database()")
        assert await conn.fetchval("SELECT count(*) FROM engine_migration") > 0  # migrated
        # What an earlier test wrote is not here.
        assert await conn.fetchval("SELECT count(*) FROM engine_model") == 0
        await conn.execute("INSERT INTO engine_model (name) VALUES ('left-behind')")
    finally:
        await conn.close()
    assert name not in _seen_databases
    _seen_databases.append(name)


@pytest.mark.parametrize("n", [1, 2])
async def test_each_test_gets_a_fresh_migrated_database(engine_database_url: str, n: int) -> None:
    await _one_database(engine_database_url)


async def test_a_manual_engine_stores_and_runs_nothing(engine_manual: engine.Engine) -> None:
    assert engine_manual.config.worker.mode == "client"
    await engine_manual.set_model("m")
    task_id = await engine_manual.submit(make_request(model="m", run_mode="simulation"))
    with trio.move_on_after(0.3):
        await engine_manual.wait(task_id)
    task = await engine_manual.get(task_id)
    assert task is not None and task.status is engine.TaskStatus.QUEUED


class TestOverrides:
    """An app's conftest (here: this class) gives the engines its providers and settings."""

    @pytest.fixture
    def engine_providers(self) -> Mapping[str, engine.Provider]:
        return {"app-model": Scripted()}

    @pytest.fixture
    def engine_settings(self) -> Mapping[str, Any]:
        return {"tasks.max_payload_bytes": 1234}

    async def test_the_running_engine_runs_the_apps_models_at_once(
        self, engine_running: engine.Engine
    ) -> None:
        assert engine_running.config.tasks.max_payload_bytes == 1234
        assert engine_running.config.worker.mode == "worker"
        # No set_model: the fixture put the provider's model in the catalogue.
        task_id = await engine_running.submit(make_request(model="app-model"))
        task = await engine_running.wait(task_id, timeout=10)
        assert task.status is engine.TaskStatus.SUCCEEDED

    async def test_two_engines_in_one_test_share_the_database_and_the_loop(
        self, engine_manual: engine.Engine, engine_running: engine.Engine
    ) -> None:
        assert engine_manual.config.tasks.max_payload_bytes == 1234
        assert engine_manual.urls == engine_running.urls
        task_id = await engine_manual.submit(make_request(model="app-model"))
        [ran] = await drain(engine_running)
        assert ran.id == task_id and ran.status is engine.TaskStatus.SUCCEEDED
        assert (await engine_manual.get(task_id)) == ran


def test_the_entry_point_is_declared() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["entry-points"]["pytest11"] == {PLUGIN: PLUGIN}


def _python(code: str) -> Any:
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    return json.loads(out.stdout)


def test_loading_the_plugin_imports_nothing_beyond_engine() -> None:
    """Beyond ``import engine`` (what an app that embeds it imports anyway) and pytest, the
    plugin adds engine's own testing modules and the standard library: no other package."""
    new = _python(
        "import json, sys; import engine, pytest; before = set(sys.modules); "
        f"import {PLUGIN}; print(json.dumps(sorted(set(sys.modules) - before)))"
    )
    foreign = [
        m
        for m in new
        if not m.startswith("engine.testing") and m.split(".")[0] not in sys.stdlib_module_names
    ]
    assert foreign == []
    assert PLUGIN in new


def _project(tmp_path: Path, test: str) -> Path:
    project = tmp_path / "project"
    project.mkdir()
    (project / "pytest.ini").write_text(
        "[pytest]\ntrio_mode = true\naddopts = -p no:cacheprovider\nfilterwarnings = error\n"
    )
    (project / "test_it.py").write_text(textwrap.dedent(test))
    return project


def _pytest(project: Path, *args: str, env: Mapping[str, str] | None = None) -> str:
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", *args],
        cwd=project,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **(env or {})},
    )
    assert out.returncode == 0, out.stdout + out.stderr
    return out.stdout


def test_loading_the_plugin_starts_nothing(tmp_path: Path) -> None:
    project = _project(
        tmp_path,
        """
        import threading

        from engine.embedded import holders


        def test_nothing_runs(pytestconfig):
            assert pytestconfig.pluginmanager.has_plugin("engine.testing.plugin")
            assert [t.name for t in threading.enumerate()] == ["MainThread"]
            assert holders._registry == {}  # no embedded server held
        """,
    )
    assert "1 passed" in _pytest(project, "-p", PLUGIN)


def test_the_installed_entry_point_loads_it(tmp_path: Path) -> None:
    """An installed engine's entry point (a distribution's metadata on the path) loads the
    plugin with no ``-p``; with ``-p`` as well it is still loaded once."""
    dist = tmp_path / "site" / "engine_probe-0.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: engine-probe\nVersion: 0\n")
    points = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["entry-points"]
    lines = [f"{name} = {value}" for name, value in points["pytest11"].items()]
    (dist / "entry_points.txt").write_text("[pytest11]\n" + "\n".join(lines) + "\n")
    project = _project(
        tmp_path,
        """
        import engine
        from engine.testing import make_request


        async def test_it_runs(engine_running):
            await engine_running.set_model("m")
            task_id = await engine_running.submit(make_request(model="m", run_mode="simulation"))
            task = await engine_running.wait(task_id, timeout=10)
            assert task.status is engine.TaskStatus.SUCCEEDED
        """,
    )
    path = os.pathsep.join(filter(None, [str(tmp_path / "site"), os.environ.get("PYTHONPATH")]))
    assert "1 passed" in _pytest(project, env={"PYTHONPATH": path})
    assert "1 passed" in _pytest(project, "-p", PLUGIN, env={"PYTHONPATH": path})
