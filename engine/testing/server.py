"""One PostgreSQL server per test session, a migrated template on it, a fresh database per test.

:func:`start_session_server` (blocking: call it outside trio, e.g. in a session fixture) gives
a :class:`SessionServer`: the server named by ``ENGINE_TEST_DATABASE_URL`` (a user that may
create databases; nothing is started), or else a private embedded server with fsync off, with
a migrated template database on it. :func:`clone_database` then gives each test its own
database, made with ``CREATE DATABASE ... TEMPLATE``: tens of milliseconds instead of a
migration, and made one ahead of need in a thread of the session (dropped there too), so a test
rarely waits for it.

The embedded server's data directory is made on ``/dev/shm`` when that is a memory file system
with room to spare (a test database there is created in a tenth of the time it takes on a
disk, and losing it is harmless), else in the temporary directory. It is removed when the
session ends; one left by a session that was killed is removed (its server stopped) by a later
session once no live process holds it.

**The ready cluster** (:mod:`engine.testing.seeds`). ``initdb`` and the template's migrations
are most of a session's set-up, and their result is the same every time for the same PostgreSQL
binaries and the same migrations. So the first session keeps a copy of its cluster, cleanly
stopped, template included, in a cache directory (``ENGINE_TEST_CACHE_DIR``, default
``$XDG_CACHE_HOME/engine/testing`` or ``~/.cache/engine/testing``; ``off`` disables it), under a
key made of the binaries (path, size, modification time), the migrations' text and the user id.
Later sessions copy it and start the copy: each session still owns a private server, and the
cached copy is never started, only read. The copy is published atomically (written beside,
flushed to disk, then renamed into place), so a reader never sees half of one; a session whose
copy does not start, or lacks the template, removes the cached copy and starts from ``initdb``.
The template is migrated again at every start (nothing to apply, normally), so even a cached
copy the key missed a change for is brought up to date.
"""

from __future__ import annotations

import functools
import logging
import os
import queue
import shutil
import tempfile
import threading
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Final, TypeVar

import trio

from engine import embedded
from engine.db.bridge import Connection, asyncio_loop, connect
from engine.db.dsn import redact, replace_database
from engine.db.migrate import migrate
from engine.db.resolve import quote_identifier
from engine.errors import leaves
from engine.testing.seeds import copy_tree, publish_seed, seed_path

__all__ = [
    "CACHE_DIR_ENV",
    "DATABASE_URL_ENV",
    "TEMPLATE_DATABASE",
    "SessionServer",
    "TemplateSetup",
    "cache_dir",
    "clone_database",
    "start_session_server",
]

log = logging.getLogger(__name__)

#: A server to use instead of starting one: a URL whose user may create databases.
DATABASE_URL_ENV: Final = "ENGINE_TEST_DATABASE_URL"
#: Where the ready cluster is kept between sessions; ``off`` keeps none.
CACHE_DIR_ENV: Final = "ENGINE_TEST_CACHE_DIR"
#: The template's name on an embedded server (one server per session: the name is free).
TEMPLATE_DATABASE: Final = "engine_template"

#: /dev/shm is used only with this much room left (a test database takes ~8 MB).
_SHM_MIN_FREE: Final = 1 << 30
_SHM: Final = Path("/dev/shm")
_SCRATCH_PREFIX: Final = "engine-testing-"
#: A session data directory this old with no live holder was left by a session that died.
_SCRATCH_STALE: Final = 600.0

_T = TypeVar("_T")

#: An app's own migrations for the template: an async function of a connection to it.
TemplateSetup = Callable[[Connection], Awaitable[None]]


class SessionServer:
    """A server for one test session: where to make databases, and the template to clone.

    Attributes:
        admin_url: a URL of the server whose user may create and drop databases.
        template: the name of the migrated template database on it.
        embedded: True when the session started the server (it stops on :meth:`close`).
        data_dir: the embedded server's data directory (removed on :meth:`close`), else None.
        from_cache: True when the server started from the cached ready cluster.
    """

    def __init__(
        self,
        admin_url: str,
        template: str,
        *,
        embedded: bool,
        data_dir: Path | None = None,
        from_cache: bool = False,
        close: Callable[[], None] | None = None,
    ) -> None:
        self.admin_url = admin_url
        self.template = template
        self.embedded = embedded
        self.data_dir = data_dir
        self.from_cache = from_cache
        self._close = close
        self._clones: _Clones | None = None
        self._closed = False
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"SessionServer({redact(self.admin_url)!r}, template={self.template!r})"

    def clones(self) -> _Clones:
        """The maker of this session's test databases (started on first use)."""
        with self._lock:
            if self._closed:
                raise RuntimeError(f"{self!r} is closed: it makes no more databases")
            if self._clones is None:
                # FILE_COPY copies the template's files as they are: on the embedded server's
                # memory file system that is faster than WAL_LOG, which writes every page
                # to the WAL; a server of yours keeps its default (and may predate STRATEGY).
                strategy = "FILE_COPY" if self.embedded else None
                self._clones = _Clones(self.admin_url, self.template, strategy=strategy)
            return self._clones

    def close(self) -> None:
        """Drop what is left of the test databases, then drop the template (on a server of
        yours) or stop the embedded server and remove its data directory; blocking,
        idempotent."""
        with self._lock:
            clones, self._clones = self._clones, None
            self._closed = True
        close, self._close = self._close, None
        try:
            if clones is not None:
                clones.close()
        finally:
            if close is not None:
                close()


class _Clones:
    """Makes a session's test databases in a thread of its own, one ahead of need, and drops
    them there: a test waits only when its database is not ready yet, and never for a drop.

    The thread runs one trio loop with one admin connection (made again after an error);
    its jobs come in order, so a drop asked for before :meth:`close` is done before it
    returns.
    """

    _PREFIX: Final = "engine_test_"

    def __init__(self, admin_url: str, template: str, *, strategy: str | None) -> None:
        self.admin_url = admin_url
        self.template = template
        self.strategy = strategy
        self._jobs: queue.SimpleQueue[str | None] = queue.SimpleQueue()  # "" makes one
        self._ready: queue.SimpleQueue[str | BaseException] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name="engine-testing-databases")
        # A daemon: an interpreter that exits without close() (a crash) must not hang on it.
        self._thread.daemon = True
        self._thread.start()
        self._jobs.put("")  # the first database, made while the first test sets up

    def take(self) -> str:
        """The name of a fresh database (blocking: call it in a thread); the next one is
        started at once."""
        self._jobs.put("")
        got = self._ready.get()
        if isinstance(got, BaseException):
            raise got
        return got

    def give_back(self, name: str) -> None:
        """Drop ``name`` soon (never blocks)."""
        self._jobs.put(name)

    def close(self) -> None:
        """Drop every database given back or made ahead, then stop the thread (blocking)."""
        self._jobs.put(None)
        self._thread.join(timeout=60)

    def _run(self) -> None:
        trio.run(self._serve)

    async def _serve(self) -> None:
        async with asyncio_loop():
            admin: Connection | None = None
            try:
                while True:
                    job = await trio.to_thread.run_sync(self._jobs.get)
                    if job is None:
                        break
                    try:
                        if admin is None or admin.is_closed():
                            admin = await connect(self.admin_url, application_name="engine-testing")
                        if job:
                            await self._drop(admin, job)
                        else:
                            self._ready.put(await self._create(admin))
                    except Exception as exc:
                        if not job:
                            self._ready.put(exc)  # the test that takes it fails with it
                        else:
                            log.warning(
                                "could not drop a test database",
                                extra={"event": "testing_drop_failed", "database": job,
                                       "error": repr(exc)},
                            )  # fmt: skip
                        if admin is not None:
                            await admin.close()
                            admin = None
                while True:  # made ahead and never taken
                    try:
                        left = self._ready.get_nowait()
                    except queue.Empty:
                        break
                    if isinstance(left, str) and admin is not None:
                        await self._drop(admin, left)
            finally:
                if admin is not None:
                    await admin.close()

    async def _create(self, admin: Connection) -> str:
        name = f"{self._PREFIX}{uuid.uuid4().hex[:12]}"
        strategy = "" if self.strategy is None else f" STRATEGY {self.strategy}"
        await admin.execute(
            f"CREATE DATABASE {quote_identifier(name)}"
            f" TEMPLATE {quote_identifier(self.template)}{strategy}"
        )
        return name

    async def _drop(self, admin: Connection, name: str) -> None:
        # FORCE: a connection a test left open must not keep its database alive.
        with trio.fail_after(30):
            await admin.execute(f"DROP DATABASE IF EXISTS {quote_identifier(name)} WITH (FORCE)")


def start_session_server(
    url: str | None = None, *, setup: TemplateSetup | None = None
) -> SessionServer:
    """The session's server (blocking; see the module docstring).

    Args:
        url: a server to use (its user may create databases); default ``ENGINE_TEST_DATABASE_URL``,
            and when that is unset too, a private embedded server.
        setup: your app's own migrations: called once, with a connection to the template,
            after engine's, so every test database has your schema too (it is not cached:
            it runs every session).

    Raises:
        EmbeddedPostgresError: the embedded server could not be started.
        DatabaseError: the template could not be made.
        Exception: whatever ``setup`` raised.
    """
    url = url or os.environ.get(DATABASE_URL_ENV) or None
    server = _external(url) if url is not None else _embedded(cache_dir())
    if setup is not None:
        try:
            _run_trio(_setup_template, server.admin_url, server.template, setup)
        except BaseException:
            server.close()
            raise
    return server


@asynccontextmanager
async def clone_database(server: SessionServer) -> AsyncIterator[str]:
    """Yield the URL of a database of its own, cloned from the session's template; it is
    dropped after the block (in the background: whatever connections are still open on it
    are closed). Works from any trio code: the databases are made in a thread of the
    session (one ahead of need)."""
    clones = server.clones()
    name = await trio.to_thread.run_sync(clones.take)
    try:
        yield replace_database(server.admin_url, name)
    finally:
        clones.give_back(name)


def cache_dir() -> Path | None:
    """Where the ready cluster is kept (``ENGINE_TEST_CACHE_DIR``), or None when it is ``off``."""
    configured = os.environ.get(CACHE_DIR_ENV, "").strip()
    if configured.lower() == "off":
        return None
    if configured:
        return Path(configured).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME", "")
    base = Path(xdg) if xdg and os.path.isabs(xdg) else Path.home() / ".cache"
    return base / "engine" / "testing"


# ---- a server of yours ----------------------------------------------------------------------


def _external(url: str) -> SessionServer:
    name = f"engine_tmpl_{uuid.uuid4().hex[:12]}"
    _run_trio(_create_template, url, name)
    return SessionServer(
        url, name, embedded=False, close=functools.partial(_run_trio, _drop_database, url, name)
    )


async def _create_template(admin_url: str, name: str) -> None:
    async with asyncio_loop():
        admin = await connect(admin_url, application_name="engine-testing")
        try:
            await admin.execute(f"CREATE DATABASE {quote_identifier(name)}")
        finally:
            await admin.close()
        await _migrate_template(admin_url, name)


async def _migrate_template(admin_url: str, name: str) -> None:
    async with asyncio_loop():
        # Closed before anything clones it: CREATE DATABASE refuses a template in use.
        conn = await connect(replace_database(admin_url, name), application_name="engine-testing")
        try:
            await migrate(conn)
        finally:
            await conn.close()


async def _setup_template(admin_url: str, name: str, setup: TemplateSetup) -> None:
    async with asyncio_loop():
        conn = await connect(replace_database(admin_url, name), application_name="engine-testing")
        try:
            async with conn.transaction():
                await setup(conn)
        finally:
            await conn.close()


async def _drop_database(admin_url: str, name: str) -> None:
    async with asyncio_loop():
        admin = await connect(admin_url, application_name="engine-testing")
        try:
            await admin.execute(f"DROP DATABASE IF EXISTS {quote_identifier(name)} WITH (FORCE)")
        finally:
            await admin.close()


def _run_trio(fn: Callable[..., Awaitable[_T]], *args: object) -> _T:
    """``trio.run(fn, *args)`` in a new thread, so it works whether or not the caller is
    inside trio (a new thread starts with an empty context: no trio-asyncio loop is reused
    from the wrong thread)."""
    result: list[_T] = []
    error: list[BaseException] = []

    def target() -> None:
        try:
            result.append(trio.run(fn, *args))
        except BaseException as exc:
            error.append(exc)

    thread = threading.Thread(target=target, name="engine-testing")
    thread.start()
    thread.join()
    if error:
        # Raised as itself, not in the exception groups of the nurseries it came through.
        found = [e for e in leaves(error[0]) if not isinstance(e, trio.Cancelled)]
        raise found[0] if len(found) == 1 else error[0]
    return result[0]


# ---- the embedded server --------------------------------------------------------------------


def _scratch_root() -> Path | None:
    """Where session data directories go: /dev/shm when it is usable and roomy, else the
    temporary directory (None)."""
    try:
        if _SHM.is_dir() and os.access(_SHM, os.W_OK | os.X_OK):
            st = os.statvfs(_SHM)
            if st.f_bavail * st.f_frsize >= _SHM_MIN_FREE:
                return _SHM
    except OSError:
        pass
    return None


def _prune_scratch(root: Path) -> None:
    """Remove the data directories of sessions that died without cleaning up (killed): ours,
    older than :data:`_SCRATCH_STALE`, held by no live process; a server still running in one
    is stopped first. On a memory file system they would hold memory until a reboot."""
    now = time.time()
    try:
        entries = [e for e in root.iterdir() if e.name.startswith(_SCRATCH_PREFIX)]
    except OSError:
        return
    for entry in entries:
        try:
            st = entry.stat()
            if st.st_uid != os.geteuid() or now - st.st_mtime < _SCRATCH_STALE:
                continue
            if embedded.status(entry).holders:
                continue  # a live session's
            embedded.stop(entry)  # stops only a server no live process holds
            found = embedded.status(entry)
            if not found.running and not found.holders:
                shutil.rmtree(entry, ignore_errors=True)
        except Exception as exc:  # not ours after all, or half gone: leave it
            log.debug(
                "left a test data directory alone",
                extra={"event": "testing_prune_skipped", "path": str(entry), "error": repr(exc)},
            )


def _make_data_dir() -> Path:
    root = _scratch_root()
    _prune_scratch(Path(tempfile.gettempdir()) if root is None else root)
    path = Path(tempfile.mkdtemp(prefix=_SCRATCH_PREFIX, dir=root))
    path.chmod(0o755)  # traversable by the server's own user when we run as root
    return path


def _embedded(cache: Path | None) -> SessionServer:
    seed = None if cache is None else seed_path(cache)
    if seed is not None and seed.is_dir():
        # Twice: a copy can fail to start for a passing reason (its port taken a moment by
        # another server); only one that fails again is broken and replaced.
        for attempt in (1, 2):
            try:
                return _start_from_seed(seed)
            except Exception as exc:
                if attempt == 1:
                    log.info(
                        "the cached test cluster did not start (%r); trying once more",
                        exc,
                        extra={"event": "testing_seed_retry", "seed": str(seed)},
                    )
                    continue
                log.warning(
                    "the cached test cluster did not start (%r); making a new one",
                    exc,
                    extra={"event": "testing_seed_broken", "seed": str(seed), "error": repr(exc)},
                )
        shutil.rmtree(seed, ignore_errors=True)
    data_dir = _make_data_dir()
    handle = _acquire(data_dir)
    try:
        admin_url = handle.dsn("postgres")
        _run_trio(_create_template, admin_url, TEMPLATE_DATABASE)
        if seed is not None:
            # Cleanly stopped, the cluster is what a later session can start from; this one
            # starts it again (no initdb this time).
            handle.release()
            publish_seed(data_dir, seed)
            handle = _acquire(data_dir)
    except BaseException:
        _discard(data_dir, handle)
        raise
    return _session(data_dir, handle)


def _acquire(data_dir: Path) -> embedded.EmbeddedServer:
    try:
        return embedded.acquire(data_dir, unsafe_fast=True)
    except BaseException:
        shutil.rmtree(data_dir, ignore_errors=True)
        raise


def _discard(data_dir: Path, handle: embedded.EmbeddedServer) -> None:
    """Stop the session's server (if this process was its last holder) and remove its data."""
    try:
        handle.release()
    finally:
        shutil.rmtree(data_dir, ignore_errors=True)


def _session(
    data_dir: Path, handle: embedded.EmbeddedServer, *, from_cache: bool = False
) -> SessionServer:
    return SessionServer(
        handle.dsn("postgres"),
        TEMPLATE_DATABASE,
        embedded=True,
        data_dir=data_dir,
        from_cache=from_cache,
        close=functools.partial(_discard, data_dir, handle),
    )


def _start_from_seed(seed: Path) -> SessionServer:
    data_dir = _make_data_dir()
    try:
        copy_tree(seed, data_dir)
    except BaseException:
        shutil.rmtree(data_dir, ignore_errors=True)
        raise
    handle = _acquire(data_dir)
    try:
        # Also the check that the copy is whole: the template is there and answers.
        _run_trio(_migrate_template, handle.dsn("postgres"), TEMPLATE_DATABASE)
    except BaseException:
        _discard(data_dir, handle)
        raise
    try:
        os.utime(seed)  # in use: not pruned as stale
    except OSError:
        pass
    return _session(data_dir, handle, from_cache=True)
