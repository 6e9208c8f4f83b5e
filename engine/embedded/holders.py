"""Who holds the server: one holder file per process (``holders/<pid>``, holding the process'
start time), and in this process a registry of the live handles per data directory.

The server stops when its last live holder releases it and it is not pinned. Holders that died
without releasing are pruned on every decision (pid + start time, so a reused pid does not count
as alive); an atexit hook releases what this process never released, and a forked child holds
nothing.
"""

from __future__ import annotations

import atexit
import itertools
import os
import sys
import threading
from pathlib import Path

from engine.embedded.layout import Layout, State, locked, read_state
from engine.embedded.process import pg_ctl_stop, probe

__all__ = [
    "install_atexit",
    "live_holders",
    "register_holder",
    "release_token",
    "stop_if_unused",
    "unregister_holder",
]

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


def live_holders(layout: Layout, *, prune: bool) -> list[int]:
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


def register_holder(layout: Layout) -> int:
    """Under the lock: add a handle for this process (writing its holder file if first)."""
    pid = os.getpid()
    token = next(_tokens)
    with _registry_lock:
        # (Re)written on every registration: cheap, and repairs a file someone removed.
        layout.holders.mkdir(exist_ok=True)
        (layout.holders / str(pid)).write_text(f"{_proc_start_time(pid) or ''}\n")
        _registry.setdefault(layout.data_dir, set()).add(token)
    return token


def unregister_holder(layout: Layout, token: int) -> bool:
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


def release_token(data_dir: Path, token: int) -> None:
    """Release the handle ``token`` of ``data_dir`` (taking the lock); stop the server if it
    was the last live holder and the server is not pinned. Idempotent."""
    layout = Layout(data_dir)
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
    with locked(layout):
        if unregister_holder(layout, token):
            stop_if_unused(layout, read_state(layout))


def stop_if_unused(layout: Layout, state: State) -> None:
    """Under the lock: stop the server if no live process holds it and it is not pinned."""
    if live_holders(layout, prune=True) or layout.pinned.exists():
        return
    if probe(layout, state, answer_wait=0.0).process_running:
        pg_ctl_stop(layout, state)


def _release_all_at_exit() -> None:
    """atexit backstop: release handles this process never released."""
    with _registry_lock:
        held = [(d, sorted(t)) for d, t in _registry.items()]
    for data_dir, tokens in held:
        for token in tokens:
            try:
                release_token(data_dir, token)
            except Exception as exc:  # keep releasing the others; report, don't hide
                print(f"engine: could not release embedded PostgreSQL: {exc}", file=sys.stderr)


def install_atexit() -> None:
    """Register the atexit backstop once per process."""
    global _atexit_installed
    with _registry_lock:
        if _atexit_installed:
            return
        _atexit_installed = True
    atexit.register(_release_all_at_exit)
