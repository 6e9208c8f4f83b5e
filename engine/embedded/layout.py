"""The embedded server's data directory: where each file lives, the marker/state file that
says the directory is engine's, and the lock around every start/stop decision.

Nothing here starts a process; :mod:`engine.embedded.process` does, under :func:`locked`.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Final

import attrs

from engine.errors import DataDirError, EmbeddedPostgresError

__all__ = [
    "Layout",
    "State",
    "claim_directory",
    "default_data_dir",
    "is_ours",
    "locked",
    "mkdirs",
    "read_or_create_state",
    "read_state",
    "write_state",
]

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

_LOCK_TIMEOUT: Final = 300.0  # another process may be running initdb or copying binaries


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


@attrs.frozen
class Layout:
    """The paths of one data directory (see :mod:`engine.embedded` for what each holds)."""

    data_dir: Path

    @classmethod
    def of(cls, data_dir: str | os.PathLike[str]) -> Layout:
        """The layout of ``data_dir``, expanded and resolved."""
        # resolve() gives one key per directory for the in-process registry.
        return cls(Path(data_dir).expanduser().resolve())

    @property
    def marker(self) -> Path:
        """``engine-pg.json``: "this directory is ours", and its state."""
        return self.data_dir / _MARKER

    @property
    def lock(self) -> Path:
        """The file flock'ed around every start/stop decision."""
        return self.data_dir / _LOCK

    @property
    def holders(self) -> Path:
        """The directory of holder files, one per process using the server."""
        return self.data_dir / _HOLDERS

    @property
    def pinned(self) -> Path:
        """Present while ``python -m engine db start`` keeps the server up."""
        return self.data_dir / _PINNED

    @property
    def log(self) -> Path:
        """postgres' own log (``pg_ctl -l``)."""
        return self.data_dir / _LOG

    @property
    def pgdata(self) -> Path:
        """The cluster."""
        return self.data_dir / _PGDATA

    @property
    def bin_cache(self) -> Path:
        """As root only: copies of wheel binaries the server user could not reach."""
        return self.data_dir / _BIN_CACHE


@attrs.define
class State:
    """Contents of engine-pg.json."""

    port: int | None = None
    bindir: str | None = None  # where the binaries were found
    exec_bindir: str | None = None  # what we run (differs when copied to bin-cache)
    major: str | None = None

    def to_json(self) -> dict[str, Any]:
        """The marker file's JSON object."""
        return {"format": _FORMAT, "created_by": "engine", **attrs.asdict(self)}


def _not_ours_error(layout: Layout) -> EmbeddedPostgresError:
    return DataDirError(
        f"{layout.data_dir} is not empty and has no {_MARKER}, so it was not created by engine; "
        "nothing in it was changed. Choose a new or empty directory for the embedded server "
        "(set ENGINE_DATA_DIR), or set ENGINE_DATABASE_URL to use an existing PostgreSQL server."
    )


def is_ours(layout: Layout) -> bool:
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


def claim_directory(layout: Layout) -> None:
    """Create the data directory if needed; refuse (touching nothing) if it is not ours."""
    if is_ours(layout) or layout.data_dir.exists():
        return
    mkdirs(layout.data_dir)


def mkdirs(path: Path) -> None:
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


def read_state(layout: Layout) -> State:
    """The marker's state; raise if it is missing, damaged or from a newer engine."""
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

    return State(
        port=opt("port", int),
        bindir=opt("bindir", str),
        exec_bindir=opt("exec_bindir", str),
        major=opt("major", str),
    )


def write_state(layout: Layout, state: State) -> None:
    """Write the marker (atomically)."""
    # Atomic replace: a reader never sees half a file, and a crash leaves the old one.
    tmp = layout.data_dir / _MARKER_TMP
    tmp.write_text(json.dumps(state.to_json(), indent=2) + "\n")
    os.chmod(tmp, 0o644)
    os.replace(tmp, layout.marker)


def read_or_create_state(layout: Layout) -> State:
    """Under the lock: read the marker, or write a fresh one if the directory is (still) new."""
    if not is_ours(layout):
        # Checked again under the lock: something may have appeared since claim_directory.
        state = State()
        write_state(layout, state)
        return state
    return read_state(layout)


@contextlib.contextmanager
def locked(layout: Layout) -> Iterator[None]:
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
