"""CPU time of this process and of a PostgreSQL server on this host, for per-task figures.

The server's CPU is its postmaster's own time, the time of the children it has reaped (an
exited backend's time lands in the postmaster's ``cutime``/``cstime`` once it is reaped) and
that of every live child. It is read from ``/proc``, so only a server on this host, readable by
this user, has a figure; elsewhere :func:`postmaster_of` returns None.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import attrs

__all__ = ["CpuSample", "postmaster_of", "sample_cpu", "server_cpu_seconds"]

_PROC = Path("/proc")


def _stat_fields(pid: int) -> list[str] | None:
    """The fields of ``/proc/<pid>/stat`` after the command name (field 3, the state, first);
    None if the process is gone or unreadable."""
    try:
        text = (_PROC / str(pid) / "stat").read_text()
    except OSError:
        return None
    # The command name is in parentheses and may hold spaces or parentheses itself.
    return text[text.rindex(")") + 2 :].split()


def postmaster_of(backend_pid: int) -> int | None:
    """The postmaster of the backend ``backend_pid`` (``pg_backend_pid()`` of a connection):
    its parent, if ``/proc`` shows both; None when the server is not on this host."""
    fields = _stat_fields(backend_pid)
    if fields is None:
        return None
    parent = int(fields[1])
    return parent if _stat_fields(parent) is not None else None


def server_cpu_seconds(postmaster: int) -> float | None:
    """CPU seconds the server of ``postmaster`` has used so far (see the module docstring);
    None if the postmaster is gone."""
    fields = _stat_fields(postmaster)
    if fields is None:
        return None
    # From field 3 on: utime, stime, cutime, cstime are fields 14-17 of stat(5).
    ticks = sum(int(v) for v in fields[11:15])
    for entry in _PROC.iterdir():
        if not entry.name.isdigit():
            continue
        child = _stat_fields(int(entry.name))
        if child is not None and int(child[1]) == postmaster:
            ticks += int(child[11]) + int(child[12])
    return ticks / os.sysconf("SC_CLK_TCK")


@attrs.frozen
class CpuSample:
    """CPU seconds used so far by this process (``python``) and by the server (``postgres``,
    None when it is not on this host); subtract two samples for the CPU of what ran between."""

    python: float
    postgres: float | None

    def __sub__(self, earlier: CpuSample) -> CpuSample:
        postgres = (
            None
            if self.postgres is None or earlier.postgres is None
            else self.postgres - earlier.postgres
        )
        return CpuSample(self.python - earlier.python, postgres)


def sample_cpu(postmaster: int | None) -> CpuSample:
    """This process's CPU time and that of the server of ``postmaster`` (if on this host)."""
    return CpuSample(
        time.process_time(), None if postmaster is None else server_cpu_seconds(postmaster)
    )
