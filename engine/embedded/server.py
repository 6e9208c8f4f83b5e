"""The public operations on an embedded server: hold it (:func:`acquire`), look at it
(:func:`status`, :func:`url`), stop, revive or restart it; and the handle a holder keeps.

Each operation takes the data directory's lock around its decision; see :mod:`engine.embedded`.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote

import attrs

from engine.embedded import holders
from engine.embedded.layout import (
    Layout,
    claim_directory,
    is_ours,
    locked,
    read_or_create_state,
    read_state,
)
from engine.embedded.process import (
    ANSWER_WAIT,
    DB_USER,
    HOST,
    ensure_running,
    log_tail,
    pg_ctl_restart,
    pg_ctl_stop,
    probe,
)
from engine.errors import EmbeddedPostgresError

__all__ = [
    "EmbeddedServer",
    "ServerStatus",
    "acquire",
    "embedded_server",
    "restart",
    "revive",
    "status",
    "stop",
    "url",
]


@attrs.frozen
class EmbeddedServer:
    """A handle on a running embedded server, held by this process until :meth:`release`."""

    data_dir: Path
    port: int
    host: str = HOST
    user: str = DB_USER
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
            holders.release_token(self.data_dir, self._token)


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
    found as :func:`~engine.embedded.find_bindir` says.

    ``unsafe_fast`` adds ``initdb --no-sync`` and turns off fsync; it only applies when this
    call initialises or starts the server (a running server is reused as it is). Use it for
    tests only: a crash can lose or corrupt data.

    ``pin=True`` (used by ``db start``) marks the server to keep running after every holder has
    gone and does not register this process; the returned handle's ``release()`` does nothing.
    Undo it with :func:`stop`.
    """
    layout = Layout.of(data_dir)
    claim_directory(layout)
    with locked(layout):
        state = read_or_create_state(layout)
        token: int | None = None
        if not pin:
            # Register first so a concurrent release in another process, which also needs the
            # lock, can never see "no holders" between our start and our registration.
            token = holders.register_holder(layout)
        try:
            port = ensure_running(
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
                holders.unregister_holder(layout, token)
            # An interrupt (or an OS error) may have come after the server started: do not
            # leave it running for nobody. Our own errors are raised before or instead of a
            # successful start, and a server that failed half-way is left as is to inspect.
            if not isinstance(exc, EmbeddedPostgresError):
                with contextlib.suppress(EmbeddedPostgresError):
                    holders.stop_if_unused(layout, state)
            raise
    holders.install_atexit()
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
    layout = Layout.of(data_dir)
    if not is_ours(layout):
        return ServerStatus(layout.data_dir, False, None, None, [], False)
    with locked(layout):
        state = read_state(layout)
        found = probe(layout, state, answer_wait=0.0)
        return ServerStatus(
            data_dir=layout.data_dir,
            running=found.answering,
            port=found.port if found.port is not None else state.port,
            pid=found.pid,
            holders=holders.live_holders(layout, prune=False),
            pinned=layout.pinned.exists(),
        )


def stop(data_dir: str | os.PathLike[str]) -> str:
    """Unpin the server and stop it unless processes still hold it (``db stop``).

    Returns a message for the user. Not running is not an error.
    """
    layout = Layout.of(data_dir)
    if not is_ours(layout):
        return (
            "the embedded PostgreSQL server is not running "
            f"(no data directory at {layout.data_dir})."
        )
    with locked(layout):
        state = read_state(layout)
        was_pinned = layout.pinned.exists()
        layout.pinned.unlink(missing_ok=True)
        found = probe(layout, state, answer_wait=0.0)
        if not found.process_running:
            return f"the embedded PostgreSQL server in {layout.data_dir} is not running."
        live = holders.live_holders(layout, prune=True)
        if live:
            pids = ", ".join(str(p) for p in live)
            unpinned = "unpinned; " if was_pinned else ""
            return (
                f"the embedded PostgreSQL server on port {found.port} is {unpinned}still used by "
                f"{len(live)} process(es) (pid {pids}); it stops when they exit."
            )
        pg_ctl_stop(layout, state)
        return f"stopped the embedded PostgreSQL server in {layout.data_dir} (port {found.port})."


def revive(data_dir: str | os.PathLike[str]) -> tuple[int, str] | None:
    """Start the server in ``data_dir`` again if it stopped under its holders (killed, a full
    disk, a crash); None if it answers. Otherwise (its port, the tail of its log before the
    start: why it stopped). Blocking.

    It comes back on the port it had when that port is free, so holders' URLs stay valid.

    Raises:
        EmbeddedPostgresError: it could not be started (the message has the log's tail).
    """
    layout = Layout.of(data_dir)
    with locked(layout):
        state = read_state(layout)
        if probe(layout, state, answer_wait=ANSWER_WAIT).answering:
            return None
        why = log_tail(layout)
        return ensure_running(layout, state, unsafe_fast=False), why


def restart(data_dir: str | os.PathLike[str]) -> None:
    """``pg_ctl restart -m fast`` of a running embedded server, as the user owning its cluster.

    Every connection is dropped; the server comes back on the same port with the same options
    (pg_ctl reuses ``postmaster.opts``). Blocking. The chaos benchmark's "PostgreSQL restart".
    """
    layout = Layout.of(data_dir)
    with locked(layout):
        pg_ctl_restart(layout, read_state(layout))


def url(data_dir: str | os.PathLike[str]) -> str:
    """Return the DSN of the running server in ``data_dir``; raise if it is not running."""
    st = status(data_dir)
    if not st.running or st.port is None:
        raise EmbeddedPostgresError(
            f"the embedded PostgreSQL server in {st.data_dir} is not running; start it with "
            "`python -m engine db start`."
        )
    return EmbeddedServer(data_dir=st.data_dir, port=st.port).dsn()
