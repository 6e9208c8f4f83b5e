"""The session server: the cached ready cluster, the clones, a server of yours, the app's setup."""

from __future__ import annotations

import logging
import os
import shutil
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import trio

import engine
from engine import embedded
from engine.db.bridge import connect
from engine.db.dsn import replace_database
from engine.errors import DatabaseError
from engine.testing import clone_database, start_session_server
from engine.testing.seeds import copy_tree, publish_seed, seed_key
from engine.testing.server import (
    CACHE_DIR_ENV,
    TEMPLATE_DATABASE,
    SessionServer,
    _prune_scratch,
    _scratch_root,
    cache_dir,
)


async def _start(**kwargs: object) -> SessionServer:
    return await trio.to_thread.run_sync(lambda: start_session_server(**kwargs))  # type: ignore[arg-type]


async def _close(server: SessionServer) -> None:
    await trio.to_thread.run_sync(server.close)


async def _databases(admin_url: str) -> set[str]:
    admin = await connect(admin_url)
    try:
        return {r["datname"] for r in await admin.fetch("SELECT datname FROM pg_database")}
    finally:
        await admin.close()


async def _tables(url: str) -> set[str]:
    conn = await connect(url)
    try:
        rows = await conn.fetch("SELECT tablename FROM pg_tables WHERE schemaname = 'public'")
        return {r["tablename"] for r in rows}
    finally:
        await conn.close()


def test_the_cache_dir(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv(CACHE_DIR_ENV, str(tmp_path / "c"))
    assert cache_dir() == tmp_path / "c"
    monkeypatch.setenv(CACHE_DIR_ENV, "off")
    assert cache_dir() is None
    monkeypatch.delenv(CACHE_DIR_ENV)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert cache_dir() == tmp_path / "engine" / "testing"
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/path")  # not absolute: ignored
    assert cache_dir() == Path.home() / ".cache" / "engine" / "testing"


async def test_a_ready_cluster_is_kept_and_started_from(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, aio_loop: None
) -> None:
    monkeypatch.setenv(CACHE_DIR_ENV, str(tmp_path))
    monkeypatch.delenv("ENGINE_TEST_DATABASE_URL", raising=False)
    first = await _start()
    try:
        assert first.embedded and not first.from_cache
        assert first.template == TEMPLATE_DATABASE
        assert os.listdir(tmp_path) == [f"seed-{seed_key()}"]
    finally:
        await _close(first)
    assert first.data_dir is not None and not first.data_dir.exists()
    second = await _start()
    try:
        assert second.from_cache and second.data_dir != first.data_dir
        async with clone_database(second) as url:
            assert {"engine_task", "river_job", "engine_migration"} <= await _tables(url)
    finally:
        await _close(second)
    assert second.data_dir is not None and not second.data_dir.exists()
    with pytest.raises(RuntimeError, match="is closed: it makes no more databases"):
        second.clones()
    # Another session publishing the same key meanwhile: the first copy stays, whole.
    seed = tmp_path / f"seed-{seed_key()}"
    before = sorted(p.name for p in (seed / "pgdata").iterdir())
    other = tmp_path.parent / "other"
    await trio.to_thread.run_sync(other.mkdir)
    await trio.to_thread.run_sync(copy_tree, seed, other)
    await trio.to_thread.run_sync(publish_seed, other, seed)
    assert os.listdir(tmp_path) == [seed.name]
    assert sorted(p.name for p in (seed / "pgdata").iterdir()) == before


async def test_a_broken_ready_cluster_is_replaced(
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    aio_loop: None,
) -> None:
    monkeypatch.setenv(CACHE_DIR_ENV, str(tmp_path))
    monkeypatch.delenv("ENGINE_TEST_DATABASE_URL", raising=False)
    await _close(await _start())
    seed = tmp_path / f"seed-{seed_key()}"
    (seed / "pgdata" / "PG_VERSION").unlink()  # a damaged copy: the server refuses it
    caplog.set_level(logging.WARNING, logger="engine.testing.server")
    server = await _start()
    try:
        assert not server.from_cache
        assert [r.event for r in caplog.records] == ["testing_seed_broken"]  # type: ignore[attr-defined]
        assert (seed / "pgdata" / "PG_VERSION").exists()  # made again
    finally:
        await _close(server)


async def test_without_a_cache_nothing_is_kept(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv(CACHE_DIR_ENV, "off")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.delenv("ENGINE_TEST_DATABASE_URL", raising=False)
    server = await _start()
    await _close(server)
    assert not server.from_cache and os.listdir(tmp_path) == []


async def test_clones_are_fresh_and_dropped_after(
    engine_server: SessionServer, aio_loop: None
) -> None:
    async with clone_database(engine_server) as first, clone_database(engine_server) as second:
        assert first != second
        conn = await connect(first)
        try:
            await conn.execute("CREATE TABLE only_in_first (x int)")
        finally:
            await conn.close()
        assert "only_in_first" in await _tables(first)
        assert "only_in_first" not in await _tables(second)
        left_open = await connect(second)  # a connection a test forgot: the drop closes it
        names = {first.rsplit("/", 1)[1], second.rsplit("/", 1)[1]}
    with trio.fail_after(10):
        while names & await _databases(engine_server.admin_url):
            await trio.sleep(0.02)
    with pytest.raises(DatabaseError):
        await left_open.fetchval("SELECT 1")
    await left_open.close()


async def test_a_server_of_yours_gets_a_template_of_its_own(
    pg_admin_url: str, aio_loop: None
) -> None:
    async def setup(conn: engine.Connection) -> None:
        await conn.execute("CREATE TABLE app_thing (id int PRIMARY KEY)")

    server = await _start(url=pg_admin_url, setup=setup)
    try:
        assert not server.embedded and server.data_dir is None
        assert server.template.startswith("engine_tmpl_")
        assert server.template in await _databases(pg_admin_url)
        async with clone_database(server) as url:
            assert {"app_thing", "engine_task"} <= await _tables(url)
            name = url.rsplit("/", 1)[1]
    finally:
        await _close(server)
    left = await _databases(pg_admin_url)
    assert server.template not in left and name not in left


async def test_a_failing_setup_fails_the_start_and_leaves_nothing(
    pg_admin_url: str, aio_loop: None
) -> None:
    before = await _databases(pg_admin_url)

    async def setup(conn: engine.Connection) -> None:
        raise RuntimeError("the app's migration failed")

    with pytest.raises(RuntimeError, match="the app's migration failed"):
        await _start(url=pg_admin_url, setup=setup)
    assert await _databases(pg_admin_url) == before


async def test_the_setup_runs_on_the_embedded_template_too(
    engine_server: SessionServer, aio_loop: None
) -> None:
    calls: list[str] = []

    async def setup(conn: engine.Connection) -> None:
        calls.append(await conn.fetchval("SELECT current_database()"))
        await conn.execute("CREATE TABLE app_thing (id int)")

    server = await _start(setup=setup)
    try:
        assert calls == [TEMPLATE_DATABASE]
        async with clone_database(server) as url:
            assert "app_thing" in await _tables(url)
        # The cached copy holds engine's schema only: the app's runs every session.
        assert "app_thing" not in await _tables(
            replace_database(engine_server.admin_url, engine_server.template)
        )
    finally:
        await _close(server)


def test_copy_tree_without_cp(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    src, dst = tmp_path / "src", tmp_path / "dst"
    (src / "sub").mkdir(parents=True)
    (src / "sub" / "f").write_text("data")
    os.chmod(src / "sub" / "f", 0o600)
    (src / "link").symlink_to("sub/f")
    dst.mkdir()
    monkeypatch.setattr(shutil, "which", lambda name: None)
    copy_tree(src, dst)
    assert (dst / "sub" / "f").read_text() == "data"
    assert stat.S_IMODE((dst / "sub" / "f").stat().st_mode) == 0o600
    assert os.readlink(dst / "link") == "sub/f"


def test_a_killed_sessions_data_directory_is_removed_later() -> None:
    root = Path(tempfile.mkdtemp(dir=_scratch_root()))
    try:
        os.chmod(root, 0o755)  # the server's own user goes through it when we run as root
        stale, young = root / "engine-testing-killed", root / "engine-testing-young"
        young.mkdir()
        stale.mkdir()
        os.chmod(stale, 0o755)
        with subprocess.Popen(
            [sys.executable, "-c", _HOLD.format(path=str(stale))], stdout=subprocess.PIPE
        ) as holder:
            assert holder.stdout is not None
            assert holder.stdout.readline() == b"up\n"
            holder.kill()  # dies without releasing: its server runs on, held by nobody
        assert embedded.status(stale).running
        _prune_scratch(root)
        assert stale.exists()  # too young to be a dead session's
        os.utime(stale, (0, 0))
        _prune_scratch(root)
        assert not stale.exists()
        assert young.exists()
    finally:
        shutil.rmtree(root, ignore_errors=True)


_HOLD = (
    "from engine import embedded; embedded.acquire({path!r}, unsafe_fast=True); "
    "print('up', flush=True); import time; time.sleep(600)"
)
