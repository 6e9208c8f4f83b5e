"""Running the server's commands, as a system user when engine runs as root.

PostgreSQL refuses to run as root, so as root every initdb/pg_ctl/postgres runs as the
cluster's owner, or as :data:`PG_SYSTEM_USER` (created with ``useradd --system`` on first use).
:func:`run_command` is the one way this package runs a command: a clean environment, no stdin,
output captured, a timeout.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shlex
import shutil
import stat
import subprocess
import time
from pathlib import Path
from typing import Any, Final

import attrs

from engine.embedded.layout import Layout
from engine.errors import EmbeddedPostgresError

__all__ = [
    "PG_SYSTEM_USER",
    "RunAs",
    "check_reachable",
    "ensure_system_user",
    "run_as",
    "run_command",
]

#: The system account the server runs as when engine itself runs as root.
PG_SYSTEM_USER: Final = "engine-pg"


@attrs.frozen
class RunAs:
    """The user a command runs as (instead of ourselves)."""

    uid: int
    gid: int
    name: str


def _child_env() -> dict[str, str]:
    # PGDATA, PGPORT, PGHOST... in our environment would silently redirect initdb/pg_ctl.
    env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
    env["LC_ALL"] = "C"  # stable, untranslated messages in the log and in our errors
    return env


def run_command(
    cmd: list[str], runas: RunAs | None, *, timeout: float
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


def ensure_system_user() -> RunAs:
    """Return the server account, creating it (``useradd --system``) if it does not exist."""
    for attempt in range(5):
        with contextlib.suppress(KeyError):
            pw = pwd.getpwnam(PG_SYSTEM_USER)
            return RunAs(pw.pw_uid, pw.pw_gid, PG_SYSTEM_USER)
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
                return RunAs(pw.pw_uid, pw.pw_gid, PG_SYSTEM_USER)
            raise EmbeddedPostgresError(
                f"could not create the system user {PG_SYSTEM_USER!r} needed to run PostgreSQL "
                f"as root: {result.stderr.strip() or f'useradd exit {result.returncode}'}. "
                "Create it yourself or run engine as a normal user."
            )
        time.sleep(0.05 * (attempt + 1))
    raise AssertionError("unreachable")  # pragma: no cover


def run_as(layout: Layout, *, create_user: bool) -> RunAs | None:
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
            return RunAs(owner, pw.pw_gid, pw.pw_name)
        except KeyError:
            return RunAs(owner, layout.pgdata.stat().st_gid, str(owner))
    if not create_user:
        # Only reads happen without a cluster; nobody needs to be created for them.
        return None
    return ensure_system_user()


def check_reachable(path: Path, runas: RunAs) -> None:
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
