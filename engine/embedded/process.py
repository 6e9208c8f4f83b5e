"""The server process: initdb, pg_ctl start/stop/restart, probes of whether it runs and
answers, its port, and its log.

Every function here runs under the data directory's lock (:func:`engine.embedded.layout.locked`),
taken by the caller.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import socket
import time
from pathlib import Path
from typing import Final

import attrs

from engine.embedded.binaries import choose_bindir, cluster_major, exec_bindir, major
from engine.embedded.layout import Layout, State, write_state
from engine.embedded.users import RunAs, check_reachable, run_as, run_command
from engine.errors import DataDirError, EmbeddedPostgresError

__all__ = [
    "ANSWER_WAIT",
    "DB_USER",
    "HOST",
    "Probe",
    "ensure_running",
    "log_tail",
    "pg_ctl_restart",
    "pg_ctl_stop",
    "probe",
]

#: The server listens here only (TCP; see the package docstring on security).
HOST: Final = "127.0.0.1"
#: The superuser initdb creates, with ``trust`` authentication.
DB_USER: Final = "postgres"
#: Seconds a running postmaster may take to answer (it may still be finishing crash recovery).
ANSWER_WAIT: Final = 10.0

_MAX_CONNECTIONS: Final = 200
_UNSAFE_FAST_OPTS: Final = ("fsync=off", "synchronous_commit=off", "full_page_writes=off")
_INITDB_TIMEOUT: Final = 300.0
_PG_CTL_TIMEOUT: Final = 90.0  # pg_ctl itself gives up after -t 30
_START_WAIT: Final = 30
_LOG_ROTATE_BYTES: Final = 10 * 1024 * 1024
_LOG_TAIL_LINES: Final = 25
# sun_path is 108 bytes including the NUL; postgres refuses to start if no socket can be made.
_SUN_PATH_MAX: Final = 107


@attrs.frozen
class Probe:
    """What :func:`probe` found."""

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
        with socket.create_connection((HOST, port), timeout=timeout):
            return True
    except OSError:
        return False


def _port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        # Postgres binds with SO_REUSEADDR, so TIME_WAIT leftovers of our previous run do not
        # block it; test the same way or we would move ports for no reason.
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((HOST, port))
        except OSError:
            return False
    return True


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((HOST, 0))
        port: int = s.getsockname()[1]
        return port


def probe(layout: Layout, state: State, *, answer_wait: float) -> Probe:
    """Is the cluster's postmaster running (pg_ctl status), and does its port answer?"""
    if cluster_major(layout.pgdata) is None:
        return Probe(False, False, port=state.port)
    runas = run_as(layout, create_user=False)
    pg_ctl = exec_bindir(layout, state) / "pg_ctl"
    out = run_command(
        [str(pg_ctl), "status", "-D", str(layout.pgdata)], runas, timeout=_PG_CTL_TIMEOUT
    )
    if out.returncode in (3, 4):  # not running / no accessible data directory
        return Probe(False, False, port=state.port)
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
    return Probe(True, answering, pid=pid, port=port)


def log_tail(layout: Layout, since: int = 0) -> str:
    """The last lines of the server's log (written after offset ``since``), indented."""
    try:
        with open(layout.log, "rb") as f:
            f.seek(max(since, f.seek(0, os.SEEK_END) - 16384))
            text = f.read().decode(errors="replace")
    except OSError:
        return "(no server.log)"
    lines = text.splitlines()[-_LOG_TAIL_LINES:]
    return "\n".join("    " + line for line in lines) or "    (empty)"


def _prepare_log(layout: Layout, runas: RunAs | None) -> int:
    """Rotate an oversized log, make sure the server user can append to it; return its size."""
    with contextlib.suppress(FileNotFoundError):
        if layout.log.stat().st_size > _LOG_ROTATE_BYTES:
            os.replace(layout.log, layout.log.with_name(layout.log.name + ".1"))
    if runas is not None:
        # pg_ctl opens the log as the server user, who cannot create files in data_dir.
        layout.log.touch()
        os.chown(layout.log, runas.uid, runas.gid)
    try:
        return layout.log.stat().st_size
    except FileNotFoundError:
        return 0


def _initdb(layout: Layout, bindir: Path, runas: RunAs | None, *, unsafe_fast: bool) -> None:
    cmd = [
        str(bindir / "initdb"),
        "-D", str(layout.pgdata),
        "-U", DB_USER,
        "--auth=trust",
        "-E", "UTF8",
        "--locale=C",
    ]  # fmt: skip
    if unsafe_fast:
        cmd.append("--no-sync")
    out = run_command(cmd, runas, timeout=_INITDB_TIMEOUT)
    if out.returncode != 0:
        raise EmbeddedPostgresError(
            f"initdb failed (exit {out.returncode}) for {layout.pgdata}:\n"
            f"{(out.stdout + out.stderr).strip()[-3000:]}"
        )


def _pg_ctl_start(
    layout: Layout, bindir: Path, runas: RunAs | None, port: int, *, unsafe_fast: bool
) -> tuple[bool, int]:
    """Start the postmaster; return (ok, log offset before the attempt)."""
    log_offset = _prepare_log(layout, runas)
    pgdata = str(layout.pgdata)
    # An over-long socket path makes postgres exit ("could not create any Unix-domain
    # sockets"); TCP is all we use, so go without a socket rather than fail.
    sock_path_len = len(os.fsencode(pgdata)) + len(f"/.s.PGSQL.{port}")
    sockdir = pgdata if sock_path_len <= _SUN_PATH_MAX else ""
    opts = ["-p", str(port), "-h", HOST, "-k", sockdir]
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
    out = run_command(cmd, runas, timeout=_PG_CTL_TIMEOUT)
    return out.returncode == 0, log_offset


def pg_ctl_stop(layout: Layout, state: State) -> None:
    """``pg_ctl stop -m fast``; raise if the postmaster still runs afterwards."""
    runas = run_as(layout, create_user=False)
    pg_ctl = exec_bindir(layout, state) / "pg_ctl"
    cmd = [str(pg_ctl), "-D", str(layout.pgdata), "-m", "fast", "-w", "-t", "60", "stop"]
    out = run_command(cmd, runas, timeout=_PG_CTL_TIMEOUT)
    if out.returncode != 0 and probe(layout, state, answer_wait=0.0).process_running:
        raise EmbeddedPostgresError(
            f"could not stop the embedded PostgreSQL server in {layout.pgdata} "
            f"(pg_ctl exit {out.returncode}): {(out.stdout + out.stderr).strip()}\n"
            f"last lines of {layout.log}:\n{log_tail(layout)}"
        )


def pg_ctl_restart(layout: Layout, state: State) -> None:
    """``pg_ctl restart -m fast``, as the user owning the cluster; raise if it failed."""
    pg_ctl = exec_bindir(layout, state) / "pg_ctl"
    cmd = [str(pg_ctl), "-D", str(layout.pgdata), "-m", "fast", "-w", "-t", "60",
           "-l", str(layout.log), "restart"]  # fmt: skip
    out = run_command(cmd, run_as(layout, create_user=False), timeout=_PG_CTL_TIMEOUT)
    if out.returncode != 0:
        raise EmbeddedPostgresError(
            f"pg_ctl restart failed (exit {out.returncode}): {(out.stdout + out.stderr).strip()}"
        )


def ensure_running(
    layout: Layout, state: State, *, unsafe_fast: bool, bindir: Path | None = None
) -> int:
    """Under the lock: make sure the server runs; return its port."""
    pgdata = layout.pgdata
    fresh = not pgdata.exists() or (pgdata.is_dir() and not any(pgdata.iterdir()))
    if not fresh and cluster_major(pgdata) is None:
        raise DataDirError(
            f"{pgdata} is damaged: it is not empty but has no PG_VERSION. It was left "
            "untouched; inspect it, or move the data directory aside to create a new cluster.\n"
            f"last lines of {layout.log}:\n{log_tail(layout)}"
        )
    if not fresh:
        found_probe = probe(layout, state, answer_wait=ANSWER_WAIT)
        if found_probe.answering and found_probe.port is not None:
            if found_probe.port != state.port:
                state.port = found_probe.port
                write_state(layout, state)
            return found_probe.port
        if found_probe.process_running:
            raise EmbeddedPostgresError(
                f"the PostgreSQL server in {pgdata} (pid {found_probe.pid}) is running but does "
                f"not accept connections on port {found_probe.port}. See {layout.log}; stop it "
                "with `python -m engine db stop` and try again.\n"
                f"last lines of {layout.log}:\n{log_tail(layout)}"
            )

    runas = run_as(layout, create_user=True)
    if runas is not None:
        check_reachable(layout.data_dir, runas)
    found, bindir, version = choose_bindir(layout, runas, bindir)
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
            f"cluster.\nlast lines of {layout.log}:\n{log_tail(layout, log_offset)}"
        )
    state.port = port
    state.bindir = str(found)
    state.exec_bindir = str(bindir)
    state.major = major(version)
    write_state(layout, state)
    return port
