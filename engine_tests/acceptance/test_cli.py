"""``python -m engine`` as users run it: real subprocesses, real signals, real exit codes.

Each test that touches the embedded server gets a fresh data directory (its own initdb, about a
second), made with ``tempfile.mkdtemp`` and opened to 0755: as root, pytest's ``tmp_path`` is
not traversable by the server user. Children run with ``-W error`` so that a warning at import
or shutdown fails the test. Every wait is on a condition with a deadline; nothing sleeps.

The last section holds in-process specs of pieces the subprocesses cannot pin down
deterministically (a second signal during shutdown, error-group flattening, concurrent database
creation).
"""

from __future__ import annotations

import asyncio
import json
import os
import pwd
import queue
import shutil
import signal
import socket
import stat
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import IO

import asyncpg
import pytest
import trio

import engine
from engine import embedded
from engine._version import __version__
from engine.cli import main as cli
from engine.cli.exits import EXIT_INTERRUPTED
from engine.cli.signals import Shutdown, serve_until_signal
from engine.config import load_config
from engine.db.database import DatabaseUrls
from engine.db.dsn import replace_database
from engine.db.resolve import (
    ENGINE_DATABASE,
    database_urls,
    ensure_database,
    ensure_database_blocking,
)
from engine.errors import ConfigError, ConnectionLost

IS_ROOT = os.geteuid() == 0
DEADLINE = 30.0
PSQL = shutil.which("psql") or ("/usr/bin/psql" if os.path.exists("/usr/bin/psql") else None)
REPO_ROOT = Path(engine.__file__).resolve().parent.parent
TEST_USER = "engine-test"


# ---------------------------------------------------------------------------------------------
# Helpers


def child_env(data_dir: Path | None = None, **extra: str) -> dict[str, str]:
    """Our environment without engine settings or libpq variables, plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ENGINE_", "PG", "PYTHONPATH"))}
    if data_dir is not None:
        env["ENGINE_DATA_DIR"] = str(data_dir)
    env.update(extra)
    return env


def engine_cmd(*args: str, python: str = sys.executable) -> list[str]:
    return [python, "-W", "error", "-m", "engine", *args]


def run_engine(
    *args: str, data_dir: Path | None = None, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Run ``python -m engine ARGS`` to completion (bounded by the deadline)."""
    return subprocess.run(
        engine_cmd(*args),
        env=env if env is not None else child_env(data_dir),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=DEADLINE * 2,
        check=False,
    )


def ok(result: subprocess.CompletedProcess[str]) -> str:
    """Assert exit 0 without a traceback; return stdout."""
    assert result.returncode == 0, (result.returncode, result.stdout, result.stderr)
    assert "Traceback" not in result.stderr, result.stderr
    return result.stdout


def make_data_dir() -> Path:
    path = Path(tempfile.mkdtemp(prefix="engine-test-cli-"))
    path.chmod(0o755)
    return path


def cleanup_data_dir(path: Path) -> None:
    """Stop a server a failed test may have left (unpinning it), then delete the directory."""
    try:
        # Only when one may be running: asking pg_ctl runs it as the cluster's owner.
        if (path / "pgdata" / "postmaster.pid").exists() and embedded.status(path).running:
            embedded.stop(path)
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def data_dir() -> Iterator[Path]:
    """A fresh data directory for the embedded server, removed afterwards."""
    path = make_data_dir()
    yield path
    cleanup_data_dir(path)


class Running:
    """A ``python -m engine`` child whose output lines are read with deadlines."""

    def __init__(self, cmd: list[str], env: dict[str, str], cwd: Path | None = None) -> None:
        self.proc = subprocess.Popen(
            cmd,
            env=env,
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.stdout: queue.Queue[str | None] = queue.Queue()
        self.stderr_lines: list[str | None] = []
        assert self.proc.stdout is not None and self.proc.stderr is not None
        self._pumps = [
            threading.Thread(target=self._pump, args=(self.proc.stdout, self.stdout.put)),
            threading.Thread(target=self._pump, args=(self.proc.stderr, self.stderr_lines.append)),
        ]
        for pump in self._pumps:
            pump.daemon = True
            pump.start()

    @staticmethod
    def _pump(stream: IO[str], put: Callable[[str | None], object]) -> None:
        for line in stream:
            put(line.rstrip("\n"))
        put(None)

    def wait_for_line(self, prefix: str) -> str:
        """The first stdout line starting with ``prefix``; fail if the child exits or stalls."""
        while True:
            try:
                line = self.stdout.get(timeout=DEADLINE)
            except queue.Empty:
                raise AssertionError(f"no {prefix!r} line within {DEADLINE} s") from None
            if line is None:
                code = self.proc.wait(DEADLINE)
                raise AssertionError(f"exited with {code}: {self.stderr()}")
            if line.startswith(prefix):
                return line

    def wait_for_stderr(self, text: str) -> None:
        """Return once a stderr line contains ``text``; fail if the child exits or stalls."""
        deadline = time.monotonic() + DEADLINE
        while not any(text in line for line in self.stderr_lines if line is not None):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"no stderr line with {text!r}: {self.stderr()}")
            time.sleep(0.02)

    def wait(self) -> int:
        code = self.proc.wait(timeout=DEADLINE)
        for pump in self._pumps:
            pump.join(DEADLINE)
        return code

    def stderr(self) -> str:
        return "\n".join(line for line in self.stderr_lines if line is not None)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.wait()
        assert self.proc.stdout is not None and self.proc.stderr is not None
        self.proc.stdout.close()
        self.proc.stderr.close()


@pytest.fixture
def closed_port() -> Iterator[int]:
    """A local TCP port that refuses connections: bound by us but never listening."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        yield sock.getsockname()[1]


def drop_database(admin_url: str, name: str) -> None:
    async def drop() -> None:
        admin = await asyncpg.connect(admin_url)
        try:
            await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        finally:
            await admin.close()

    asyncio.run(drop())


# ---------------------------------------------------------------------------------------------
# Options and configuration


def test_version_prints_the_package_version() -> None:
    assert ok(run_engine("--version")) == f"engine {__version__}\n"


def test_help_lists_commands_options_and_exit_codes() -> None:
    out = ok(run_engine("--help"))
    for text in ("run", "migrate", "db start", "db stop", "db status", "db url"):
        assert text in out
    for option in ("--config", "--database-url", "--data-dir", "--set", "--version"):
        assert option in out
    assert "exit status" in out


def test_invalid_configuration_exits_2_naming_every_bad_field(data_dir: Path) -> None:
    env = child_env(data_dir, ENGINE_QUEUE_FETCH_COOLDOWN="-1")
    result = run_engine("--set", "worker.hard_limit=x", "migrate", env=env)
    assert result.returncode == 2, result
    assert "queue.fetch_cooldown" in result.stderr
    assert "ENGINE_QUEUE_FETCH_COOLDOWN" in result.stderr
    assert "worker.hard_limit" in result.stderr
    assert "Traceback" not in result.stderr
    assert result.stdout == ""
    assert not embedded.status(data_dir).running


def test_malformed_set_is_a_usage_error() -> None:
    result = run_engine("--set", "no-equals-sign", "migrate")
    assert result.returncode == 2
    assert "expected SECTION.FIELD=VALUE" in result.stderr


@pytest.mark.parametrize("log_format", ["kv", "json"])
def test_unreachable_database_fails_after_the_retries_with_one_clear_message(
    closed_port: int, log_format: str
) -> None:
    url = f"postgresql://engine:s3cret@127.0.0.1:{closed_port}/engine"
    result = run_engine(
        "--database-url", url,
        "--set", "database.connect_retry_delay=0.1",
        "--set", f"logging.format={log_format}",
        "migrate",
    )  # fmt: skip
    assert result.returncode == 1, result
    errors = [line for line in result.stderr.splitlines() if line.startswith("engine: error:")]
    assert len(errors) == 1, result.stderr
    assert (
        f"could not connect to postgresql://engine:***@127.0.0.1:{closed_port}/engine"
        in (errors[0])
    )
    assert "after 3 attempt(s)" in errors[0]
    assert "Traceback" not in result.stderr and "ExceptionGroup" not in result.stderr
    assert "s3cret" not in result.stderr + result.stdout
    # The two retries were logged as structured lines in the chosen format.
    logged = [line for line in result.stderr.splitlines() if "database_retry" in line]
    assert len(logged) == 2, result.stderr
    if log_format == "json":
        records = [json.loads(line) for line in logged]
        assert [r["attempt"] for r in records] == [1, 2]
        assert all(r["event"] == "database_retry" and r["level"] == "warning" for r in records)
    else:
        assert "level=warning" in logged[0] and "event=database_retry attempt=1" in logged[0]


def test_db_commands_with_an_external_url(closed_port: int) -> None:
    url = f"postgresql://engine:s3cret@127.0.0.1:{closed_port}/engine"
    # db url prints the configured URL unchanged, password included, without connecting.
    assert ok(run_engine("--database-url", url, "db", "url")) == url + "\n"
    for command in ("start", "stop", "status"):
        result = run_engine("--database-url", url, "db", command)
        assert result.returncode == 2, result
        assert "external server" in result.stderr
        assert "s3cret" not in result.stderr


# ---------------------------------------------------------------------------------------------
# Embedded server lifetime


@pytest.mark.slow
def test_migrate_twice_applies_once_and_leaves_no_server_running(data_dir: Path) -> None:
    first = ok(run_engine("migrate", data_dir=data_dir))
    assert first.startswith("database: postgresql://postgres@127.0.0.1:")
    assert f"/{ENGINE_DATABASE}\n" in first
    assert "  applied: 0001" in first
    assert "  already applied: none" in first
    assert not embedded.status(data_dir).running

    second = ok(run_engine("migrate", data_dir=data_dir))
    assert "  applied: none\n" in second
    assert "  already applied: 0001" in second
    st = embedded.status(data_dir)
    assert not st.running and st.holders == [] and not st.pinned


@pytest.mark.slow
def test_db_start_url_psql_stop(data_dir: Path) -> None:
    if PSQL is None:
        pytest.skip("psql is not installed")
    dsn = ok(run_engine("db", "start", data_dir=data_dir)).strip()
    assert dsn.startswith("postgresql://postgres@127.0.0.1:") and dsn.endswith("/engine")
    st = embedded.status(data_dir)
    assert st.running and st.pinned  # outlives the `db start` process

    assert ok(run_engine("db", "url", data_dir=data_dir)).strip() == dsn
    psql = subprocess.run(
        [PSQL, dsn, "-X", "-A", "-t", "-c", "select current_database(), 1"],
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=DEADLINE,
        check=False,
    )
    assert psql.returncode == 0, psql.stderr
    assert psql.stdout.strip() == "engine|1"

    status = json.loads(ok(run_engine("db", "status", "--json", data_dir=data_dir)))
    assert status["running"] is True and status["pinned"] is True and status["url"] == dsn

    assert "stopped" in ok(run_engine("db", "stop", data_dir=data_dir))
    assert not embedded.status(data_dir).running
    result = run_engine("db", "status", "--json", data_dir=data_dir)
    assert result.returncode == 3
    assert json.loads(result.stdout)["running"] is False
    human = run_engine("db", "status", data_dir=data_dir)
    assert human.returncode == 3 and "not running" in human.stdout

    result = run_engine("db", "url", data_dir=data_dir)
    assert result.returncode == 1
    assert "engine: error:" in result.stderr and "not running" in result.stderr


@pytest.mark.slow
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_run_until_signal_then_exit_0_and_stop_the_server(
    data_dir: Path, signum: signal.Signals
) -> None:
    child = Running(engine_cmd("run"), child_env(data_dir))
    try:
        line = child.wait_for_line("engine: running")
        assert "postgresql://postgres@127.0.0.1:" in line
        st = embedded.status(data_dir)
        assert st.running and st.holders == [child.proc.pid] and not st.pinned

        child.proc.send_signal(signum)
        assert child.wait() == 0, child.stderr()
    finally:
        child.close()
    stderr = child.stderr()
    assert "Traceback" not in stderr
    assert f"event=shutdown_requested signal={signum.name}" in stderr
    assert "event=service_started" in stderr  # migrated and ready before the signal
    assert not embedded.status(data_dir).running


# ---------------------------------------------------------------------------------------------
# As an unprivileged user


def _ensure_test_user() -> pwd.struct_passwd:
    try:
        return pwd.getpwnam(TEST_USER)
    except KeyError:
        pass
    useradd = shutil.which(
        "useradd", path=os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin"])
    )
    if useradd is None:
        pytest.skip("useradd is missing: cannot create the unprivileged test user")
    shell = "/usr/sbin/nologin" if os.path.exists("/usr/sbin/nologin") else "/bin/false"
    made = subprocess.run(
        [useradd, "--system", "--no-create-home", "--shell", shell, TEST_USER],
        capture_output=True,
        text=True,
        check=False,
    )
    if made.returncode not in (0, 9):  # 9: created concurrently
        pytest.fail(f"useradd {TEST_USER} failed: {made.stderr}")
    return pwd.getpwnam(TEST_USER)


def _closed_to_others(path: Path) -> Path | None:
    """The first directory on the way to ``path`` (inclusive) that others cannot traverse."""
    for directory in [*reversed(path.parents), path]:
        mode = directory.stat().st_mode
        if not mode & stat.S_IXOTH or (directory == path and not mode & stat.S_IROTH):
            return directory
    return None


def _readable_copy(paths: dict[Path, None]) -> list[Path]:
    """Copy the package directories and the checkout's ``engine``/``sql`` to a directory every
    user can read; returns the import path to use instead of ``paths``."""
    root = Path(tempfile.mkdtemp(prefix="engine-readable-", dir="/tmp"))
    root.chmod(0o755)
    copied: list[Path] = []
    for n, path in enumerate(paths):
        target = root / f"p{n}"
        if path == REPO_ROOT:
            target.mkdir()
            for name in ("engine", "sql"):
                shutil.copytree(path / name, target / name, symlinks=True)
        else:
            shutil.copytree(path, target, symlinks=True)
        copied.append(target)
    for directory, _dirs, _files in os.walk(root):
        os.chmod(directory, 0o755)
    return copied


@pytest.mark.slow
def test_migrate_as_an_unprivileged_user(data_dir: Path, request: pytest.FixtureRequest) -> None:
    if not IS_ROOT:
        # We are the unprivileged user.
        ok(run_engine("migrate", data_dir=data_dir))
        assert not embedded.status(data_dir).running
        return

    runuser = shutil.which(
        "runuser", path=os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin"])
    )
    if runuser is None:
        pytest.skip("runuser is missing: cannot run engine as another user")
    # Our venv's interpreter lives under /root (0700); the system interpreter of the same minor
    # version loads the venv's packages (same ABI) through PYTHONPATH.
    python = Path(f"/usr/bin/python{sys.version_info.major}.{sys.version_info.minor}")
    if not os.access(python, os.X_OK):
        pytest.skip(f"{python} is missing: need a system Python {sys.version_info[:2]}")
    paths = [Path(sysconfig.get_paths()["purelib"]), Path(sysconfig.get_paths()["platlib"])]
    paths.append(REPO_ROOT)
    if any(_closed_to_others(path) is not None for path in paths):
        # The checkout or the venv sits under a directory others cannot enter (a 0700 home or
        # temp dir): give the test user a readable copy of both instead of skipping.
        paths = _readable_copy(dict.fromkeys(paths))
        request.addfinalizer(lambda: shutil.rmtree(paths[0].parent, ignore_errors=True))

    user = _ensure_test_user()
    os.chown(data_dir, user.pw_uid, user.pw_gid)
    env = child_env(
        data_dir,
        PYTHONPATH=os.pathsep.join(str(p) for p in dict.fromkeys(paths)),
        PYTHONDONTWRITEBYTECODE="1",
    )
    result = subprocess.run(
        [runuser, "-u", TEST_USER, "--", *engine_cmd("migrate", python=str(python))],
        env=env,
        cwd="/",
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=DEADLINE * 2,
        check=False,
    )
    out = ok(result)
    assert "  applied: 0001" in out
    # The cluster belongs to the unprivileged user, not to root's server account.
    assert (data_dir / "pgdata").stat().st_uid == user.pw_uid
    # Stopped when that process exited: a clean stop removes postmaster.pid. (Asking pg_ctl as
    # root would run the owner's pg_ctl from root's venv, which that user may not enter.)
    assert not (data_dir / "pgdata" / "postmaster.pid").exists()
    assert not any((data_dir / "holders").glob("*"))


# ---------------------------------------------------------------------------------------------
# An external server


@pytest.mark.slow
def test_migrate_an_external_database(pg_admin_url: str) -> None:
    name = f"engine_cli_{uuid.uuid4().hex[:10]}"
    ensure_database_blocking(pg_admin_url, name)
    try:
        url = replace_database(pg_admin_url, name)
        out = ok(run_engine("--database-url", url, "migrate"))
        assert "  applied: 0001" in out
        assert ok(run_engine("--database-url", url, "db", "url")).strip() == url
    finally:
        drop_database(pg_admin_url, name)


# ---------------------------------------------------------------------------------------------
# In-process specs


async def test_ensure_database_tolerates_concurrent_creators(
    pg_admin_url: str, aio_loop: None
) -> None:
    name = f"engine_race_{uuid.uuid4().hex[:10]}"
    try:
        async with trio.open_nursery() as nursery:
            for _ in range(6):
                nursery.start_soon(ensure_database, pg_admin_url, name)
        await ensure_database(pg_admin_url, name)  # and again, when it exists
    finally:
        await trio.to_thread.run_sync(drop_database, pg_admin_url, name)


@pytest.mark.slow
def test_database_urls_holds_the_embedded_server_for_the_block(data_dir: Path) -> None:
    config = load_config(env={}, overrides={"data_dir": str(data_dir)})
    with database_urls(config.database, config.data_dir) as urls:
        assert urls.tasks == urls.coordination == urls.queue
        st = embedded.status(data_dir)
        assert st.running and st.holders == [os.getpid()]

        async def current_database() -> str:
            conn = await asyncpg.connect(urls.tasks)
            try:
                name: str = await conn.fetchval("select current_database()")
                return name
            finally:
                await conn.close()

        assert asyncio.run(current_database()) == ENGINE_DATABASE
    assert not embedded.status(data_dir).running


def test_database_urls_with_an_external_url_starts_nothing() -> None:
    base = "postgresql://u@db.example:5432/main"
    config = load_config(
        env={}, overrides={"database.url": base, "database.coordination_url": base + "2"}
    )
    with database_urls(config.database, config.data_dir) as urls:
        assert urls == DatabaseUrls(tasks=base, coordination=base + "2", queue=base)


class _Exited(Exception):
    pass


class _Exits:
    """``os._exit`` replaced: records the status, sets ``exited`` and raises :class:`_Exited`."""

    def __init__(self) -> None:
        self.codes: list[int] = []
        self.exited = trio.Event()

    def __call__(self, code: int) -> None:
        self.codes.append(code)
        self.exited.set()
        raise _Exited

    async def run(
        self,
        body: Callable[[Shutdown], Awaitable[None]],
        send_signals: Callable[[], Awaitable[None]],
    ) -> None:
        """Run ``serve_until_signal(body)`` while ``send_signals`` runs, until the faked exit."""
        with trio.fail_after(DEADLINE):
            with pytest.RaisesGroup(_Exited, flatten_subgroups=True):
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(send_signals)
                    await serve_until_signal(body)

    async def wait_in_shutdown(self, shutting_down: trio.Event) -> None:
        """A graceful shutdown that would take long: only a later signal's exit ends it."""
        shutting_down.set()
        with trio.CancelScope(shield=True):
            await self.exited.wait()


@pytest.fixture
def exits(monkeypatch: pytest.MonkeyPatch) -> _Exits:
    fake = _Exits()
    monkeypatch.setattr(os, "_exit", fake)
    return fake


async def test_second_signal_during_shutdown_exits_at_once(exits: _Exits) -> None:
    shutting_down = trio.Event()

    async def body(_shutdown: Shutdown) -> None:
        try:
            await trio.sleep_forever()
        finally:
            await exits.wait_in_shutdown(shutting_down)

    async def send_signals() -> None:
        os.kill(os.getpid(), signal.SIGINT)
        await shutting_down.wait()
        os.kill(os.getpid(), signal.SIGTERM)

    await exits.run(body, send_signals)
    assert exits.codes == [EXIT_INTERRUPTED]


async def test_second_signal_hurries_the_drain_and_the_third_exits_at_once(
    exits: _Exits,
) -> None:
    hurried = trio.Event()
    shutting_down = trio.Event()

    async def body(shutdown: Shutdown) -> None:
        shutdown.on_second = hurried.set
        try:
            await trio.sleep_forever()
        finally:
            await exits.wait_in_shutdown(shutting_down)

    async def send_signals() -> None:
        os.kill(os.getpid(), signal.SIGINT)
        await shutting_down.wait()
        os.kill(os.getpid(), signal.SIGINT)
        await hurried.wait()
        os.kill(os.getpid(), signal.SIGTERM)

    await exits.run(body, send_signals)
    assert hurried.is_set() and exits.codes == [EXIT_INTERRUPTED]


async def test_first_signal_cancels_the_body_and_is_reported() -> None:
    async def body(_shutdown: Shutdown) -> None:
        os.kill(os.getpid(), signal.SIGTERM)
        await trio.sleep_forever()

    with trio.fail_after(DEADLINE):
        assert await serve_until_signal(body) == "SIGTERM"


def test_failures_are_reported_as_one_line_per_engine_error(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # As trio-asyncio delivers them: a group in a group.
    lost = ConnectionLost("could not connect")
    nested = ExceptionGroup("outer", [ExceptionGroup("inner", [lost]), lost])
    assert cli._report_failure(nested) == 1
    assert capsys.readouterr().err == "engine: error: could not connect\n"

    assert cli._report_failure(ConfigError(["a.b = 1: bad"])) == 2
    assert capsys.readouterr().err.startswith("engine: error: invalid configuration")

    assert cli._report_failure(BaseExceptionGroup("g", [KeyboardInterrupt()])) == 130
    assert capsys.readouterr().err == ""

    try:
        raise ExceptionGroup("g", [ValueError("a bug")])
    except ExceptionGroup as exc:
        assert cli._report_failure(exc) == 1
    err = capsys.readouterr().err
    assert "unexpected error" in err and "Traceback" in err and "ValueError: a bug" in err


def test_a_signal_while_the_process_exits_after_a_shutdown_is_ignored() -> None:
    """Once the command has returned (a graceful shutdown done), a SIGTERM arriving while the
    process exits (here: from an exit handler) leaves the exit status as it was."""
    code = (
        "import atexit, os, signal\n"
        "import engine.cli.main as cli\n"
        "cli.main = lambda: 0\n"
        "atexit.register(lambda: os.kill(os.getpid(), signal.SIGTERM))\n"
        "cli.entry()\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=60)
    assert done.returncode == 0, done
