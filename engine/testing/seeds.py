"""The ready cluster of the session server (:mod:`engine.testing.server`): a stopped copy of a
session's cluster, template included, kept in the cache directory under a key of the server
binaries, the migrations and the user, so that later sessions start from a copy instead of
``initdb`` and migrations.

:func:`publish_seed` writes the copy beside its place, flushes it to disk and renames it into
place (a reader never sees half of one); :func:`copy_tree` copies a cluster, owners included.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Final

from engine import embedded
from engine.db.sqlfiles import load_migrations

__all__ = ["copy_tree", "publish_seed", "seed_key", "seed_path"]

# The session server's logger: its messages keep one name wherever they come from.
log = logging.getLogger("engine.testing.server")

# Bumped when what a ready cluster holds changes in a way the key does not see.
_SEED_FORMAT: Final = "1"
_SEED_PREFIX: Final = "seed-"
#: Ready clusters of other keys unused this long are removed.
_SEED_MAX_AGE: Final = 7 * 86400.0


def publish_seed(data_dir: Path, seed: Path) -> None:
    """Keep a copy of the stopped cluster in ``data_dir`` as ``seed``. A failure only costs
    the cache (logged); another session publishing first is no failure."""
    try:
        if embedded.status(data_dir).running:
            return  # only a stopped cluster is a consistent copy
    except Exception as exc:  # cannot even tell (its binaries out of reach): no copy
        log.info(
            "the test cluster was not kept for later sessions",
            extra={"event": "testing_seed_not_kept", "error": repr(exc)},
        )
        return
    cache = seed.parent
    try:
        cache.mkdir(parents=True, exist_ok=True, mode=0o700)
        _prune_seeds(cache, keep=seed.name)
        incoming = Path(tempfile.mkdtemp(prefix=".incoming-", dir=cache))
        try:
            copy_tree(data_dir, incoming)
            _flush_tree(incoming)
            os.rename(incoming, seed)  # atomic; fails if another session published first
        except OSError:
            shutil.rmtree(incoming, ignore_errors=True)
            if not seed.is_dir():
                raise
    except OSError as exc:
        log.warning(
            "could not cache the test cluster",
            extra={"event": "testing_seed_skipped", "cache": str(cache), "error": repr(exc)},
        )


def seed_path(cache: Path) -> Path:
    """Where the ready cluster of this key is kept in the cache directory ``cache``."""
    return cache / f"{_SEED_PREFIX}{seed_key()}"


def seed_key() -> str:
    """The ready cluster's key: the server binaries, the migrations, the user and the format."""
    postgres = embedded.find_bindir() / "postgres"
    st = postgres.stat()
    digest = hashlib.sha256()
    for part in (_SEED_FORMAT, str(postgres), str(st.st_size), str(st.st_mtime_ns),
                 str(os.geteuid())):  # fmt: skip
        digest.update(part.encode() + b"\0")
    for migration in load_migrations():
        digest.update(f"{migration.version}:{migration.name}\0{migration.sql}\0".encode())
    return digest.hexdigest()[:20]


def _prune_seeds(cache: Path, *, keep: str) -> None:
    """Remove ready clusters of other keys that no session used for a week."""
    now = time.time()
    for entry in cache.iterdir():
        if entry.name == keep:
            continue
        stale = entry.name.startswith(".incoming-") or entry.name.startswith(_SEED_PREFIX)
        try:
            if stale and now - entry.stat().st_mtime > _SEED_MAX_AGE:
                shutil.rmtree(entry, ignore_errors=True)
        except OSError:
            pass


def copy_tree(src: Path, dst: Path) -> None:
    """Copy the contents of ``src`` into the existing directory ``dst``, keeping modes, times
    and, as root, owners (the cluster belongs to the server's user). ``cp -a`` when there is
    one (the faster), else Python's copy."""
    cp = shutil.which("cp")
    if cp is not None:
        subprocess.run([cp, "-a", f"{src}/.", str(dst)], check=True, capture_output=True)
        return
    shutil.copytree(src, dst, symlinks=True, dirs_exist_ok=True)
    if os.geteuid() == 0:
        for root, dirs, files in os.walk(src):
            for name in [*dirs, *files]:
                source = Path(root, name)
                st = source.lstat()
                os.lchown(dst / source.relative_to(src), st.st_uid, st.st_gid)


def _flush_tree(path: Path) -> None:
    """fsync every file and directory under ``path``: the cluster runs with fsync off, and
    the cached copy must survive a crash of the machine whole or not at all."""
    for root, _dirs, files in os.walk(path):
        for name in files:
            fd = os.open(os.path.join(root, name), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        fd = os.open(root, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
