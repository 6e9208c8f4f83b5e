"""Resource sampling for the load controller: CPU, memory and pool use, read every period.

:class:`ProcessSampler` reads CPU and memory use of this process (and of its cgroup) from
``/proc`` and the cgroup filesystem, with no third-party dependency; the database figures
(connections in use, the pools' maximum) are passed in by the caller, who owns the pools.
:class:`LoadSamplerService` samples on a period, feeds :meth:`LoadController.observe` and hands
each snapshot to an optional callback (the metrics).

Every reading that cannot be made (no such file, no permission, unparsable content, no time
elapsed yet) is ``None`` rather than an error: the controller judges pressure on what it knows,
and an unknown resource is never taken as pressure.

Files under ``/proc`` and the cgroup filesystem are served from kernel memory and never wait on a
disk, so :meth:`ProcessSampler.sample` reads them synchronously, in the trio thread.
"""

from __future__ import annotations

import logging
import math
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

import attrs
import trio

from engine.db.database import Database
from engine.load.clock import Clock, MonotonicClock
from engine.load.controller import LoadController, LoadSnapshot
from engine.load.pressure import ResourceSample

__all__ = [
    "CgroupPaths",
    "LoadSamplerService",
    "ProcessSampler",
    "Sampler",
    "db_usage",
]

log = logging.getLogger(__name__)

# cgroup v1 writes "no limit" as a huge page-aligned number (PAGE_COUNTER_MAX * page size);
# anything at or above 2**62 bytes is that, not a real limit.
_V1_UNLIMITED = 1 << 62


class Sampler(Protocol):
    """Something that reads the process's resources."""

    def sample(self, db_connections: int, db_max: int) -> ResourceSample:
        """Return one reading; the database figures come from the caller's pools.

        ``sampled_at`` must be on the controller's clock timebase.
        """
        ...


def db_usage(db: Database) -> tuple[int, int]:
    """Return ``(connections in use, maximum connections)`` summed over the distinct pools.

    Roles that share a URL share one pool; :meth:`Database.distinct_pools` lists it once, so a
    shared pool is not counted two or three times.
    """
    used = 0
    maximum = 0
    for pool in db.distinct_pools():
        used += pool.in_use()
        maximum += pool.max_size()
    return used, maximum


# --- small readers: every failure is "unknown" ---------------------------------------------


def _read_text(path: Path | None) -> str | None:
    """The file's text, or ``None`` if there is no path or it cannot be read."""
    if path is None:
        return None
    try:
        return path.read_text(encoding="ascii", errors="replace")
    except OSError:
        # Missing, permission denied, or a cgroup file the kernel refuses to read: unknown.
        return None


def _read_int(path: Path | None) -> int | None:
    """The file's content as one integer, or ``None``."""
    text = _read_text(path)
    if text is None:
        return None
    try:
        return int(text.strip())
    except ValueError:
        return None


def _read_keyed(path: Path | None) -> dict[str, int]:
    """A ``key value`` per line file (``cpu.stat``, ``memory.stat``, ``/proc/meminfo``).

    Values keep only their first number (``MemTotal:  1024 kB`` -> ``MemTotal: 1024``); lines
    that do not parse are skipped.
    """
    text = _read_text(path)
    result: dict[str, int] = {}
    if text is None:
        return result
    for line in text.splitlines():
        parts = line.split()
        if len(parts) < 2:
            continue
        try:
            result[parts[0].rstrip(":")] = int(parts[1])
        except ValueError:
            continue
    return result


def _affinity_count() -> int | None:
    """CPUs this process may be scheduled on (``sched_getaffinity``), else the CPU count."""
    try:
        return len(os.sched_getaffinity(0)) or None
    except (AttributeError, OSError):
        # Not Linux (no sched_getaffinity): the machine's count is the best we have.
        return os.cpu_count()


@attrs.frozen(slots=True)
class CgroupPaths:
    """Where this process's cgroup files live; resolved once by :meth:`discover`.

    Attributes:
        v2: the process's cgroup v2 directory, or ``None`` if the root is not a v2 mount.
        v2_root: the v2 mount root (where walking up the ancestors stops).
        v1_memory: the cgroup v1 ``memory`` controller directory, or ``None``.
        v1_cpu: the cgroup v1 ``cpu`` controller directory, or ``None``.
        v1_cpuacct: the cgroup v1 ``cpuacct`` controller directory, or ``None``.
    """

    v2: Path | None = None
    v2_root: Path | None = None
    v1_memory: Path | None = None
    v1_cpu: Path | None = None
    v1_cpuacct: Path | None = None

    @classmethod
    def discover(cls, proc_root: Path, cgroup_root: Path) -> CgroupPaths:
        """Find the process's cgroup directories from ``<proc_root>/self/cgroup``.

        The path in ``/proc/self/cgroup`` is relative to the hierarchy's root as the kernel sees
        it. In a container with its own cgroup namespace the mount shows only the container's
        cgroup, and the path may not exist under the mount (``/`` or a host path): then the
        mount root itself is the process's cgroup.
        """
        membership: list[tuple[str, list[str], str]] = []
        text = _read_text(proc_root / "self" / "cgroup") or ""
        for line in text.splitlines():
            parts = line.split(":", 2)
            if len(parts) == 3:
                membership.append((parts[0], parts[1].split(",") if parts[1] else [], parts[2]))

        def inside(mount: Path, path: str) -> Path:
            # A cgroup outside our namespace shows as "/../x": not ours to read, use the mount.
            if ".." in Path(path).parts:
                return mount
            candidate = mount / path.lstrip("/")
            return candidate if candidate.is_dir() else mount

        v2: Path | None = None
        v2_root: Path | None = None
        if (cgroup_root / "cgroup.controllers").exists():
            # A pure v2 host (or container): the unified hierarchy is mounted at the root.
            v2_root = cgroup_root
            path = next((p for hid, ctl, p in membership if hid == "0" and not ctl), "/")
            v2 = inside(cgroup_root, path)

        def v1(controller: str) -> Path | None:
            for _hid, controllers, path in membership:
                if controller not in controllers:
                    continue
                # Distributions mount co-mounted controllers as "cpu,cpuacct" with symlinks
                # "cpu" and "cpuacct"; try the single name first, then the joined one.
                for name in (controller, ",".join(controllers)):
                    mount = cgroup_root / name
                    if mount.is_dir():
                        return inside(mount, path)
            mount = cgroup_root / controller
            return mount if v2 is None and mount.is_dir() else None

        return cls(
            v2=v2,
            v2_root=v2_root,
            v1_memory=v1("memory"),
            v1_cpu=v1("cpu"),
            v1_cpuacct=v1("cpuacct"),
        )

    def v2_ancestors(self) -> list[Path]:
        """The v2 directory and its parents up to the mount root (limits are hierarchical)."""
        if self.v2 is None or self.v2_root is None:
            return []
        chain = [self.v2]
        current = self.v2
        while current != self.v2_root and current.parent != current:
            current = current.parent
            chain.append(current)
        return chain


class ProcessSampler:
    """Reads CPU and memory use from ``/proc`` and the cgroup filesystem.

    **CPU** is the use since the previous sample (or since construction, for the first one),
    as a fraction of the CPUs this process may use: the cgroup quota (v2 ``cpu.max``, the
    smallest over the ancestors; v1 ``cpu.cfs_quota_us``) capped at the affinity mask's CPU
    count. Both the process's own CPU time and the cgroup's usage (v2 ``cpu.stat``
    ``usage_usec``, v1 ``cpuacct.usage``) are measured and the larger fraction wins: the quota
    throttles the whole cgroup, sidecar processes included. A window shorter than
    ``min_cpu_window`` gives ``None`` and keeps the previous baseline, so a quick second call
    cannot produce a noisy reading.

    **Memory** is the larger of the process's resident set (``statm``, else ``status`` VmRSS)
    and the cgroup's working set (v2 ``memory.current``, v1 ``memory.usage_in_bytes``, minus
    the inactive file cache, which the kernel reclaims before it would OOM-kill; this is the
    figure the kubelet uses), over the tightest limit among the cgroup's (v2 ``memory.max`` of
    the cgroup and its ancestors; v1 ``hierarchical_memory_limit`` or ``memory.limit_in_bytes``)
    and the host's ``MemTotal``.

    Not thread-safe: each sample updates the CPU baseline.
    """

    def __init__(
        self,
        *,
        proc_root: str | os.PathLike[str] = "/proc",
        cgroup_root: str | os.PathLike[str] = "/sys/fs/cgroup",
        clock: Clock | None = None,
        cpu_time: Callable[[], float] = time.process_time,
        cpu_count: Callable[[], int | None] = _affinity_count,
        min_cpu_window: float = 0.1,
    ) -> None:
        """Create a sampler and take the CPU baseline.

        Args:
            proc_root: the procfs mount (tests point it at fake files).
            cgroup_root: the cgroup filesystem mount.
            clock: the timebase of ``sampled_at`` and of the CPU window; it must be the load
                controller's. :class:`MonotonicClock` (the controller's default) if ``None``.
            cpu_time: this process's CPU seconds (user + system, all threads).
            cpu_count: CPUs the process may be scheduled on, ``None`` if unknown.
            min_cpu_window: seconds below which a CPU window is too short to report.
        """
        self.proc_root = Path(proc_root)
        self.cgroup_root = Path(cgroup_root)
        self.clock: Clock = clock if clock is not None else MonotonicClock()
        self._cpu_time = cpu_time
        self._cpu_count = cpu_count
        self.min_cpu_window = min_cpu_window
        self.cgroups = CgroupPaths.discover(self.proc_root, self.cgroup_root)
        self._page_size = _page_size()
        self._last_wall = self.clock.now()
        self._last_process_cpu = self._process_cpu_seconds()
        self._last_cgroup_cpu = self._cgroup_cpu_seconds()

    # --- the protocol ----------------------------------------------------------------------

    def sample(self, db_connections: int, db_max: int) -> ResourceSample:
        """Read CPU and memory now; see the class docstring."""
        now = self.clock.now()
        return ResourceSample(
            cpu_fraction=self._cpu_fraction(now),
            memory_fraction=self.memory_fraction(),
            db_connections=max(0, db_connections),
            db_max_connections=max(0, db_max),
            sampled_at=now,
        )

    # --- CPU -------------------------------------------------------------------------------

    def cpu_limit(self) -> float | None:
        """CPUs this process may use: the cgroup quota capped at the affinity count."""
        quota = self._cgroup_cpu_quota()
        affinity = self._cpu_count()
        known = [c for c in (quota, float(affinity) if affinity else None) if c]
        return min(known) if known else None

    def _cgroup_cpu_quota(self) -> float | None:
        """The cgroup CPU quota in CPUs, ``None`` when unlimited or unknown."""
        quotas: list[float] = []
        for directory in self.cgroups.v2_ancestors():
            # "max 100000" (no quota) or "<quota> <period>" in microseconds.
            fields = (_read_text(directory / "cpu.max") or "").split()
            if len(fields) == 2 and fields[0] != "max":
                try:
                    quota, period = int(fields[0]), int(fields[1])
                except ValueError:
                    continue
                if quota > 0 and period > 0:
                    quotas.append(quota / period)
        if self.cgroups.v1_cpu is not None:
            quota_us = _read_int(self.cgroups.v1_cpu / "cpu.cfs_quota_us")
            period_us = _read_int(self.cgroups.v1_cpu / "cpu.cfs_period_us")
            # -1 means no quota.
            if quota_us is not None and period_us and quota_us > 0:
                quotas.append(quota_us / period_us)
        return min(quotas) if quotas else None

    def _process_cpu_seconds(self) -> float | None:
        """This process's CPU seconds so far."""
        try:
            return self._cpu_time()
        except OSError:
            return None

    def _cgroup_cpu_seconds(self) -> float | None:
        """The cgroup's CPU seconds so far (all its processes), ``None`` if unknown."""
        if self.cgroups.v2 is not None:
            usage_usec = _read_keyed(self.cgroups.v2 / "cpu.stat").get("usage_usec")
            if usage_usec is not None:
                return usage_usec / 1e6
        if self.cgroups.v1_cpuacct is not None:
            usage_ns = _read_int(self.cgroups.v1_cpuacct / "cpuacct.usage")
            if usage_ns is not None:
                return usage_ns / 1e9
        return None

    def _cpu_fraction(self, now: float) -> float | None:
        """CPU use over the window since the last baseline; moves the baseline forward."""
        elapsed = now - self._last_wall
        if elapsed < self.min_cpu_window:
            # Too short to mean anything; the next sample measures the longer window.
            return None
        process_cpu = self._process_cpu_seconds()
        cgroup_cpu = self._cgroup_cpu_seconds()
        fractions: list[float] = []
        limit = self.cpu_limit()
        if limit:
            for before, after in (
                (self._last_process_cpu, process_cpu),
                (self._last_cgroup_cpu, cgroup_cpu),
            ):
                # A counter that went backwards (a cgroup move, a reset) gives no reading.
                if before is not None and after is not None and after >= before:
                    fractions.append((after - before) / elapsed / limit)
        self._last_wall = now
        self._last_process_cpu = process_cpu
        self._last_cgroup_cpu = cgroup_cpu
        fractions = [f for f in fractions if math.isfinite(f)]
        return max(fractions) if fractions else None

    # --- memory ----------------------------------------------------------------------------

    def memory_fraction(self) -> float | None:
        """Memory in use over the memory limit (see the class docstring), or ``None``."""
        used_candidates = [
            u for u in (self.resident_bytes(), self.cgroup_memory_bytes()) if u is not None
        ]
        limit = self.memory_limit()
        if not used_candidates or not limit:
            return None
        return max(used_candidates) / limit

    def resident_bytes(self) -> int | None:
        """This process's resident set size in bytes."""
        statm = (_read_text(self.proc_root / "self" / "statm") or "").split()
        if len(statm) >= 2 and self._page_size:
            try:
                return int(statm[1]) * self._page_size
            except ValueError:
                pass
        rss_kib = _read_keyed(self.proc_root / "self" / "status").get("VmRSS")
        return rss_kib * 1024 if rss_kib is not None else None

    def cgroup_memory_bytes(self) -> int | None:
        """The cgroup's working set in bytes: usage minus reclaimable inactive file cache."""
        if self.cgroups.v2 is not None:
            current = _read_int(self.cgroups.v2 / "memory.current")
            if current is not None:
                inactive = _read_keyed(self.cgroups.v2 / "memory.stat").get("inactive_file", 0)
                return max(0, current - inactive)
        if self.cgroups.v1_memory is not None:
            usage = _read_int(self.cgroups.v1_memory / "memory.usage_in_bytes")
            if usage is not None:
                stat = _read_keyed(self.cgroups.v1_memory / "memory.stat")
                inactive = stat.get("total_inactive_file", stat.get("inactive_file", 0))
                return max(0, usage - inactive)
        return None

    def memory_limit(self) -> int | None:
        """The tightest of the cgroup memory limits and the host's ``MemTotal``, in bytes."""
        limits: list[int] = []
        for directory in self.cgroups.v2_ancestors():
            value = _read_int(directory / "memory.max")  # "max" does not parse: no limit.
            if value is not None and value > 0:
                limits.append(value)
        if self.cgroups.v1_memory is not None:
            # hierarchical_memory_limit already folds in the ancestors' limits.
            stat = _read_keyed(self.cgroups.v1_memory / "memory.stat")
            for value in (
                stat.get("hierarchical_memory_limit"),
                _read_int(self.cgroups.v1_memory / "memory.limit_in_bytes"),
            ):
                if value is not None and 0 < value < _V1_UNLIMITED:
                    limits.append(value)
        total_kib = _read_keyed(self.proc_root / "meminfo").get("MemTotal")
        if total_kib:
            limits.append(total_kib * 1024)
        return min(limits) if limits else None


def _page_size() -> int | None:
    """The memory page size in bytes (``statm`` counts pages)."""
    try:
        return os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, OSError, ValueError):
        return None


class LoadSamplerService:
    """Samples resources every ``interval`` seconds and feeds the load controller.

    :meth:`sample_now` takes one sample: database figures from
    ``connections`` (usually ``lambda: db_usage(database)``), one :meth:`Sampler.sample`,
    :meth:`LoadController.observe`. :meth:`run` calls it on a steady period and keeps
    :attr:`latest` for readers such as registration and the metrics.
    """

    def __init__(
        self,
        controller: LoadController,
        sampler: Sampler,
        *,
        interval: float,
        connections: Callable[[], tuple[int, int]] | None = None,
        on_snapshot: Callable[[LoadSnapshot], None] | None = None,
    ) -> None:
        """Create the service.

        Args:
            controller: the process's load controller.
            sampler: the resource reader; its ``sampled_at`` must be on the controller's clock.
            interval: seconds between samples (``load.sample_interval``), > 0.
            connections: returns ``(in use, maximum)`` database connections; ``(0, 0)``
                (unknown, not judged) if ``None``.
            on_snapshot: called with every new snapshot (e.g. :meth:`Metrics.set_load`).

        Raises:
            ValueError: if ``interval`` is not a positive finite number.
        """
        if not (math.isfinite(interval) and interval > 0):
            raise ValueError(f"interval must be a positive number of seconds, got {interval!r}")
        self.controller = controller
        self.sampler = sampler
        self.interval = interval
        self.connections = connections
        self.on_snapshot = on_snapshot
        self.latest: LoadSnapshot = controller.snapshot()
        #: Samples taken and samples that failed, for tests and introspection.
        self.samples = 0
        self.failures = 0

    def sample_now(self) -> LoadSnapshot:
        """Take one sample, feed it to the controller and publish the snapshot.

        Raises:
            Exception: whatever the connection count, the sampler or the controller raised;
                :attr:`latest` is then unchanged. An ``on_snapshot`` failure is logged, not
                raised: the controller has already taken the sample.
        """
        used, maximum = self.connections() if self.connections is not None else (0, 0)
        sample = self.sampler.sample(used, maximum)
        self.latest = self.controller.observe(sample)
        self.samples += 1
        if self.on_snapshot is not None:
            try:
                self.on_snapshot(self.latest)
            except Exception:
                log.exception(
                    "load snapshot callback failed",
                    extra={"event": "load_snapshot_callback_failed"},
                )
        return self.latest

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Sample forever; ``task_status.started()`` after the first attempt.

        A failing sample is skipped and the loop goes on; the first failure of a run is logged
        with its traceback, and the recovery once. The start is signalled even if the first
        sample fails, so a broken ``/proc`` cannot keep the engine from starting (the controller
        then stays at its last state, ``normal`` at first). Samples keep a steady period; ticks
        missed while the event loop was blocked are dropped, not bunched up.
        """
        deadline = trio.current_time()
        started = False
        failing = False
        while True:
            try:
                self.sample_now()
            except Exception:
                self.failures += 1
                if not failing:
                    # Once per run of failures: a broken source would otherwise log every tick.
                    log.exception("load sample failed", extra={"event": "load_sample_failed"})
                failing = True
            else:
                if failing:
                    log.info("load sampling recovered", extra={"event": "load_sample_recovered"})
                failing = False
            if not started:
                task_status.started()
                started = True
            deadline += self.interval
            now = trio.current_time()
            if deadline < now:
                deadline = now + self.interval
            await trio.sleep_until(deadline)
