"""A private PgBouncer in front of a PostgreSQL server, for tests and the chaos bench.

:func:`open_pgbouncer` writes a configuration into a temporary directory, starts Debian's
``pgbouncer`` binary on a free loopback port in front of the server of ``upstream_url`` and
stops it on exit. Every database name is forwarded to the database of the same name (a
``*`` entry), as the same user, so ``bouncer.url_for(db_url)`` is ``db_url`` through the
pooler. Authentication is ``trust`` between the client and PgBouncer (the user must still be
listed in its ``auth_file``, which the helper writes); PgBouncer logs in to the server as that
user with the password of ``upstream_url``, if any.

PgBouncer refuses to run as root: as root it is started with ``-u nobody`` (its files are
world-readable, its log goes to a file the helper reads afterwards).
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Final
from urllib.parse import unquote, urlsplit, urlunsplit

import attrs
import trio

__all__ = ["PGBOUNCER_INSTALL_HINT", "PgBouncer", "find_pgbouncer", "open_pgbouncer"]

#: What to say when the binary is missing.
PGBOUNCER_INSTALL_HINT: Final = "install pgbouncer (apt-get install pgbouncer)"

_READY_TIMEOUT: Final = 15.0
_STOP_TIMEOUT: Final = 10.0
_RUN_AS_ROOT: Final = "nobody"
_STATS_LINE: Final = re.compile(r"stats: (\d+) xacts/s, (\d+) queries/s")


def find_pgbouncer() -> str | None:
    """The ``pgbouncer`` binary (on PATH, else Debian's ``/usr/sbin/pgbouncer``), or None."""
    found = shutil.which("pgbouncer") or shutil.which("pgbouncer", path="/usr/sbin:/sbin")
    return found


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _quote_ini(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


@attrs.define
class PgBouncer:
    """A running private PgBouncer; see the module docstring."""

    binary: str
    directory: Path
    port: int
    upstream_url: str
    pool_mode: str
    default_pool_size: int
    #: Seconds between two ``stats:`` lines of its log (:meth:`logged_transactions`).
    stats_period: int = 60
    process: trio.Process | None = None
    #: How many times :meth:`restart` ran.
    restarts: int = 0

    @property
    def config_path(self) -> Path:
        """The ``pgbouncer.ini`` it runs with."""
        return self.directory / "pgbouncer.ini"

    @property
    def log_path(self) -> Path:
        """Its log file."""
        return self.directory / "pgbouncer.log"

    def url_for(self, url: str) -> str:
        """``url`` (a database of the upstream server) through this PgBouncer: the same user,
        password and database, PgBouncer's host and port."""
        parts = urlsplit(url)
        userinfo, at, _host = parts.netloc.rpartition("@")
        netloc = f"{userinfo}{at}127.0.0.1:{self.port}"
        return urlunsplit(parts._replace(netloc=netloc))

    @property
    def url(self) -> str:
        """The upstream URL's database through this PgBouncer."""
        return self.url_for(self.upstream_url)

    def log_tail(self, lines: int = 30) -> str:
        """The last lines of its log, for error messages."""
        try:
            text = self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def logged_transactions(self) -> int:
        """Transactions it passed on, from the ``stats:`` lines of its log so far (one per
        ``stats_period``; the last, partial period is not counted)."""
        try:
            text = self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return 0
        return sum(int(m[1]) * self.stats_period for m in _STATS_LINE.finditer(text))

    def write_config(self) -> None:
        """Write ``pgbouncer.ini`` and ``userlist.txt`` into :attr:`directory`."""
        parts = urlsplit(self.upstream_url)
        user = unquote(parts.username or "postgres")
        password = unquote(parts.password) if parts.password is not None else None
        host = parts.hostname or "127.0.0.1"
        port = parts.port or 5432
        server = f"host={host} port={port} user={user}"
        if password is not None:
            server += f" password={_quote_ini(password)}"
        config = f"""\
[databases]
* = {server}

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = {self.port}
unix_socket_dir =
auth_type = trust
auth_file = {self.directory / "userlist.txt"}
pool_mode = {self.pool_mode}
default_pool_size = {self.default_pool_size}
min_pool_size = 0
reserve_pool_size = 0
max_client_conn = 1000
max_db_connections = {self.default_pool_size}
server_login_retry = 1
server_connect_timeout = 5
query_wait_timeout = 60
logfile = {self.log_path}
log_connections = 0
log_disconnections = 0
stats_period = {self.stats_period}
ignore_startup_parameters = extra_float_digits
"""
        self.config_path.write_text(config)
        (self.directory / "userlist.txt").write_text(f'"{user}" ""\n')
        for path in (self.config_path, self.directory / "userlist.txt"):
            path.chmod(0o644)

    async def start(self) -> None:
        """Start the process and wait until it accepts connections.

        Raises:
            RuntimeError: it exited or did not listen within 15 s; the message has its log.
        """
        cmd = [self.binary]
        if os.geteuid() == 0:
            cmd += ["-u", _RUN_AS_ROOT]
        cmd.append(str(self.config_path))
        self.process = await trio.lowlevel.open_process(
            cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        with trio.move_on_after(_READY_TIMEOUT):
            while self.process.returncode is None:
                try:
                    stream = await trio.open_tcp_stream("127.0.0.1", self.port)
                except OSError:
                    await trio.sleep(0.02)
                    continue
                await stream.aclose()
                return
        await self.stop()
        raise RuntimeError(
            f"pgbouncer did not start listening on 127.0.0.1:{self.port}:\n{self.log_tail()}"
        )

    async def stop(self) -> None:
        """Stop at once (SIGTERM: immediate shutdown, every client connection cut); SIGKILL
        after 10 s. Shielded."""
        process, self.process = self.process, None
        if process is None:
            return
        with trio.CancelScope(shield=True):
            if process.returncode is None:
                process.send_signal(signal.SIGTERM)
                with trio.move_on_after(_STOP_TIMEOUT):
                    await process.wait()
                if process.returncode is None:
                    process.kill()
                    await process.wait()

    async def restart(self) -> None:
        """Stop (every client and server connection is cut) and start again on the same port."""
        await self.stop()
        await self.start()
        self.restarts += 1


def _make_directory() -> Path:
    path = Path(tempfile.mkdtemp(prefix="engine-pgbouncer-"))
    # As root PgBouncer runs as nobody: it must read its files and write its log here.
    path.chmod(0o777 if os.geteuid() == 0 else 0o755)
    return path


@asynccontextmanager
async def open_pgbouncer(
    upstream_url: str,
    *,
    pool_mode: str = "transaction",
    default_pool_size: int = 3,
    stats_period: int = 60,
    binary: str | None = None,
) -> AsyncIterator[PgBouncer]:
    """Run a private PgBouncer in front of ``upstream_url``'s server for the block.

    ``default_pool_size`` is also the most server connections it opens per database
    (``max_db_connections``), so a test can tell that clients share them. ``stats_period``:
    seconds between two statistics lines of its log.

    Raises:
        FileNotFoundError: no ``pgbouncer`` binary (:data:`PGBOUNCER_INSTALL_HINT`).
        RuntimeError: it did not start (the message has its log).
    """
    found = binary or find_pgbouncer()
    if found is None:
        raise FileNotFoundError(f"no pgbouncer binary found: {PGBOUNCER_INSTALL_HINT}")
    directory = await trio.to_thread.run_sync(_make_directory)
    bouncer = PgBouncer(
        binary=found,
        directory=directory,
        port=_free_port(),
        upstream_url=upstream_url,
        pool_mode=pool_mode,
        default_pool_size=default_pool_size,
        stats_period=stats_period,
    )
    try:
        bouncer.write_config()
        await bouncer.start()
        yield bouncer
    finally:
        await bouncer.stop()
        shutil.rmtree(directory, ignore_errors=True)
