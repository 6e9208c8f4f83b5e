"""Resource sampling (CPU, memory, pool use): fake /proc and cgroup trees, real pools."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest
import trio
import trio.testing

from engine.db.database import Database
from engine.load.clock import MonotonicClock, TrioClock
from engine.load.controller import LoadController, LoadSnapshot
from engine.load.pressure import PressureState, ResourceSample
from engine.load.sampler import CgroupPaths, LoadSamplerService, ProcessSampler, db_usage

PAGE = os.sysconf("SC_PAGE_SIZE")
MIB = 1 << 20
GIB = 1 << 30


class FakeClock:
    """A hand-driven clock."""

    def __init__(self, t: float = 100.0) -> None:
        self.t = t

    def now(self) -> float:
        return self.t


class FakeCpu:
    """Hand-driven process CPU seconds."""

    def __init__(self) -> None:
        self.seconds = 10.0

    def __call__(self) -> float:
        return self.seconds


class Tree:
    """A fake procfs and cgroup filesystem under ``tmp_path``."""

    def __init__(self, tmp_path: Path) -> None:
        self.proc = tmp_path / "proc"
        self.cgroup = tmp_path / "cgroup"
        (self.proc / "self").mkdir(parents=True)
        self.cgroup.mkdir()

    def write(self, relative: str, text: str, *, root: Path | None = None) -> None:
        path = (root if root is not None else self.cgroup) / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)

    def proc_file(self, relative: str, text: str) -> None:
        self.write(relative, text, root=self.proc)

    def v2(self, path: str = "/") -> Path:
        """Make the root a cgroup v2 mount and put the process in ``path``."""
        self.write("cgroup.controllers", "cpu memory io\n")
        self.proc_file("self/cgroup", f"0::{path}\n")
        directory = self.cgroup / path.lstrip("/")
        directory.mkdir(parents=True, exist_ok=True)
        return directory

    def host(self, mem_total_kib: int = 16 * GIB // 1024, rss_pages: int = 1000) -> None:
        self.proc_file("meminfo", f"MemTotal:       {mem_total_kib} kB\nMemFree: 1 kB\n")
        self.proc_file("self/statm", f"5000 {rss_pages} 300 5 0 123 0\n")

    def sampler(self, clock: FakeClock, cpu: FakeCpu, cpus: int | None = 8) -> ProcessSampler:
        return ProcessSampler(
            proc_root=self.proc,
            cgroup_root=self.cgroup,
            clock=clock,
            cpu_time=cpu,
            cpu_count=lambda: cpus,
        )


@pytest.fixture
def tree(tmp_path: Path) -> Tree:
    return Tree(tmp_path)


# --- CPU -------------------------------------------------------------------------------------


def test_v2_quota_and_cgroup_usage(tree: Tree) -> None:
    cg = tree.v2("/kubepods/pod1/ctr")
    tree.host()
    tree.write("kubepods/pod1/ctr/cpu.max", "200000 100000\n")  # 2 CPUs
    tree.write("kubepods/pod1/ctr/cpu.stat", "usage_usec 5000000\nuser_usec 1\nsystem_usec 1\n")
    clock, cpu = FakeClock(), FakeCpu()
    sampler = tree.sampler(clock, cpu, cpus=8)
    assert sampler.cgroups.v2 == cg
    assert sampler.cpu_limit() == 2.0  # the quota, tighter than the 8 CPUs of the mask

    # Over 2 s: the process used 0.4 CPU-s (0.1 of 2 CPUs), the cgroup 2 CPU-s (0.5): max wins.
    clock.t += 2
    cpu.seconds += 0.4
    tree.write("kubepods/pod1/ctr/cpu.stat", "usage_usec 7000000\n")
    sample = sampler.sample(3, 10)
    assert sample.cpu_fraction == pytest.approx(0.5)
    assert sample.sampled_at == clock.t
    assert (sample.db_connections, sample.db_max_connections) == (3, 10)

    # The next window: the process (3 CPU-s over 1 s on 2 CPUs) beats the cgroup figure.
    clock.t += 1
    cpu.seconds += 3.0
    tree.write("kubepods/pod1/ctr/cpu.stat", "usage_usec 7100000\n")
    assert sampler.sample(0, 0).cpu_fraction == pytest.approx(1.5)


def test_v2_quota_is_the_tightest_ancestor_and_capped_by_affinity(tree: Tree) -> None:
    tree.v2("/a/b")
    tree.write("a/cpu.max", "150000 100000\n")  # 1.5 CPUs on the parent
    tree.write("a/b/cpu.max", "max 100000\n")
    clock, cpu = FakeClock(), FakeCpu()
    assert tree.sampler(clock, cpu, cpus=8).cpu_limit() == 1.5
    assert tree.sampler(clock, cpu, cpus=1).cpu_limit() == 1.0


def test_v2_without_quota_uses_the_cpu_count(tree: Tree) -> None:
    tree.v2()
    tree.write("cpu.max", "max 100000\n")
    clock, cpu = FakeClock(), FakeCpu()
    sampler = tree.sampler(clock, cpu, cpus=4)
    assert sampler.cpu_limit() == 4.0
    clock.t += 1
    cpu.seconds += 1.0  # no cpu.stat: the process figure alone
    assert sampler.sample(0, 0).cpu_fraction == pytest.approx(0.25)


def test_short_window_keeps_the_baseline(tree: Tree) -> None:
    tree.v2()
    clock, cpu = FakeClock(), FakeCpu()
    sampler = tree.sampler(clock, cpu, cpus=1)
    clock.t += 0.01
    cpu.seconds += 0.01
    assert sampler.sample(0, 0).cpu_fraction is None  # too short to mean anything
    clock.t += 0.99
    cpu.seconds += 0.49
    # Measured from construction: 0.5 CPU-s over 1 s.
    assert sampler.sample(0, 0).cpu_fraction == pytest.approx(0.5)


def test_counter_going_backwards_is_ignored(tree: Tree) -> None:
    tree.v2()
    tree.write("cpu.stat", "usage_usec 9000000\n")
    clock, cpu = FakeClock(), FakeCpu()
    sampler = tree.sampler(clock, cpu, cpus=1)
    clock.t += 1
    cpu.seconds += 0.25
    tree.write("cpu.stat", "usage_usec 10\n")  # e.g. moved to another cgroup
    assert sampler.sample(0, 0).cpu_fraction == pytest.approx(0.25)


# --- memory ----------------------------------------------------------------------------------


def test_v2_memory_max_numeric_uses_the_working_set(tree: Tree) -> None:
    tree.v2("/ctr")
    tree.host(rss_pages=50 * MIB // PAGE)
    tree.write("ctr/memory.max", f"{GIB}\n")
    tree.write("ctr/memory.current", f"{600 * MIB}\n")
    tree.write("ctr/memory.stat", f"anon 1\nfile 2\ninactive_file {100 * MIB}\n")
    sampler = tree.sampler(FakeClock(), FakeCpu())
    assert sampler.memory_limit() == GIB
    assert sampler.cgroup_memory_bytes() == 500 * MIB
    assert sampler.resident_bytes() == (50 * MIB // PAGE) * PAGE
    assert sampler.sample(0, 0).memory_fraction == pytest.approx(500 / 1024)


def test_v2_memory_rss_wins_when_larger(tree: Tree) -> None:
    tree.v2()
    tree.host(rss_pages=300 * MIB // PAGE)
    tree.write("memory.max", f"{GIB}\n")
    tree.write("memory.current", f"{200 * MIB}\n")
    fraction = tree.sampler(FakeClock(), FakeCpu()).sample(0, 0).memory_fraction
    assert fraction == pytest.approx(((300 * MIB // PAGE) * PAGE) / GIB)


def test_v2_memory_max_unlimited_falls_back_to_mem_total(tree: Tree) -> None:
    tree.v2("/ctr")
    tree.host(mem_total_kib=4 * GIB // 1024)
    tree.write("ctr/memory.max", "max\n")
    tree.write("ctr/memory.current", f"{GIB}\n")
    sampler = tree.sampler(FakeClock(), FakeCpu())
    assert sampler.memory_limit() == 4 * GIB
    assert sampler.sample(0, 0).memory_fraction == pytest.approx(0.25)


def test_v2_memory_limit_of_an_ancestor_applies(tree: Tree) -> None:
    tree.v2("/pod/ctr")
    tree.host()
    tree.write("pod/memory.max", f"{512 * MIB}\n")
    tree.write("pod/ctr/memory.max", "max\n")
    assert tree.sampler(FakeClock(), FakeCpu()).memory_limit() == 512 * MIB


def test_namespaced_cgroup_path_falls_back_to_the_mount_root(tree: Tree) -> None:
    # /proc/self/cgroup names a host path that the container's mount does not show.
    tree.write("cgroup.controllers", "cpu memory\n")
    tree.proc_file("self/cgroup", "0::/kubepods/burstable/pod9/ctr\n")
    tree.write("memory.max", f"{GIB}\n")
    sampler = tree.sampler(FakeClock(), FakeCpu())
    assert sampler.cgroups.v2 == tree.cgroup
    assert sampler.memory_limit() == GIB


def test_cgroup_outside_the_namespace_uses_the_mount_root(tree: Tree) -> None:
    tree.write("cgroup.controllers", "memory\n")
    tree.proc_file("self/cgroup", "0::/../sibling\n")
    tree.write("memory.max", f"{GIB}\n")
    (tree.cgroup.parent / "sibling").mkdir()  # exists, but is not ours
    sampler = tree.sampler(FakeClock(), FakeCpu())
    assert sampler.cgroups.v2 == tree.cgroup
    assert sampler.memory_limit() == GIB


def test_v1_limits_and_usage(tree: Tree) -> None:
    tree.host(rss_pages=1)
    tree.proc_file(
        "self/cgroup",
        "12:memory:/docker/abc\n4:cpu,cpuacct:/docker/abc\n0::/\n",
    )
    tree.write("memory/docker/abc/memory.limit_in_bytes", f"{2 * GIB}\n")
    tree.write("memory/docker/abc/memory.usage_in_bytes", f"{GIB}\n")
    tree.write("memory/docker/abc/memory.stat", f"total_inactive_file {512 * MIB}\n")
    # Co-mounted controllers live under their joined name.
    tree.write("cpu,cpuacct/docker/abc/cpu.cfs_quota_us", "50000\n")
    tree.write("cpu,cpuacct/docker/abc/cpu.cfs_period_us", "100000\n")
    tree.write("cpu,cpuacct/docker/abc/cpuacct.usage", "1000000000\n")
    clock, cpu = FakeClock(), FakeCpu()
    sampler = tree.sampler(clock, cpu, cpus=8)
    assert sampler.cgroups == CgroupPaths(
        v1_memory=tree.cgroup / "memory/docker/abc",
        v1_cpu=tree.cgroup / "cpu,cpuacct/docker/abc",
        v1_cpuacct=tree.cgroup / "cpu,cpuacct/docker/abc",
    )
    assert sampler.cpu_limit() == 0.5
    clock.t += 2
    tree.write("cpu,cpuacct/docker/abc/cpuacct.usage", "1500000000\n")  # 0.5 CPU-s in 2 s
    sample = sampler.sample(0, 0)
    assert sample.cpu_fraction == pytest.approx(0.5)
    assert sample.memory_fraction == pytest.approx(0.25)


def test_v1_unlimited_memory_uses_mem_total(tree: Tree) -> None:
    tree.host(mem_total_kib=8 * GIB // 1024, rss_pages=GIB // PAGE)
    tree.proc_file("self/cgroup", "4:memory:/\n")
    tree.write("memory/memory.limit_in_bytes", "9223372036854771712\n")
    tree.write(
        "memory/memory.stat",
        "hierarchical_memory_limit 9223372036854771712\ntotal_inactive_file 0\n",
    )
    sampler = tree.sampler(FakeClock(), FakeCpu())
    assert sampler.memory_limit() == 8 * GIB
    assert sampler.sample(0, 0).memory_fraction == pytest.approx(0.125)


def test_status_vmrss_when_statm_is_missing(tree: Tree) -> None:
    tree.proc_file("self/status", "Name: python\nVmRSS:\t  2048 kB\n")
    tree.proc_file("meminfo", "MemTotal: 8192 kB\n")
    sampler = tree.sampler(FakeClock(), FakeCpu())
    assert sampler.resident_bytes() == 2048 * 1024
    assert sampler.sample(0, 0).memory_fraction == pytest.approx(0.25)


def test_missing_files_give_none(tree: Tree) -> None:
    clock, cpu = FakeClock(), FakeCpu()
    sampler = tree.sampler(clock, cpu, cpus=None)
    assert sampler.cgroups == CgroupPaths()
    clock.t += 5
    cpu.seconds += 1
    sample = sampler.sample(-1, -5)  # nonsense counts are clamped, not raised
    assert sample == ResourceSample(
        cpu_fraction=None,
        memory_fraction=None,
        db_connections=0,
        db_max_connections=0,
        sampled_at=clock.t,
    )


def test_garbage_files_give_none(tree: Tree) -> None:
    tree.v2()
    tree.proc_file("self/statm", "garbage\n")
    tree.proc_file("meminfo", "MemTotal: lots\n")
    tree.write("memory.max", "nonsense\n")
    tree.write("memory.current", "x\n")
    tree.write("cpu.max", "a b\n")
    tree.write("cpu.stat", "usage_usec ?\n")
    clock, cpu = FakeClock(), FakeCpu()
    sampler = tree.sampler(clock, cpu, cpus=None)
    clock.t += 1
    sample = sampler.sample(0, 0)
    assert (sample.cpu_fraction, sample.memory_fraction) == (None, None)


def test_real_system_smoke() -> None:
    """On the machine running the tests: whatever is known is a sane fraction."""
    sampler = ProcessSampler(min_cpu_window=0.0)
    sample = sampler.sample(1, 4)
    for value in (sample.cpu_fraction, sample.memory_fraction):
        assert value is None or 0 <= value < 64
    if Path("/proc/self/statm").exists():
        assert sample.memory_fraction is not None and 0 < sample.memory_fraction <= 1
    assert sample.sampled_at <= MonotonicClock().now()
    # The default clock is the controller's default: the sample is accepted.
    assert LoadController("observe", 4).observe(sample).sampled_at == sample.sampled_at


# --- database connections --------------------------------------------------------------------


async def test_db_usage_sums_distinct_pools(database: Database) -> None:
    pools = database.distinct_pools()
    assert len(pools) == 1  # one URL: the three roles share a pool, counted once
    assert db_usage(database) == (0, 10)
    async with database.tasks.acquire(), database.queue.acquire():
        assert db_usage(database) == (2, 10)
    assert db_usage(database) == (0, 10)


# --- the service -----------------------------------------------------------------------------


class ScriptedSampler:
    """Returns scripted readings on the trio clock; raises where the script says so."""

    def __init__(self, script: list[float | Exception]) -> None:
        self.script = script
        self.calls: list[tuple[int, int]] = []
        self.changed = trio.Event()

    def sample(self, db_connections: int, db_max: int) -> ResourceSample:
        self.calls.append((db_connections, db_max))
        self.changed.set()
        self.changed = trio.Event()
        step = self.script[min(len(self.calls), len(self.script)) - 1]
        if isinstance(step, Exception):
            raise step
        return ResourceSample(
            cpu_fraction=step,
            memory_fraction=None,
            db_connections=db_connections,
            db_max_connections=db_max,
            sampled_at=trio.current_time(),
        )

    async def wait_calls(self, n: int) -> None:
        while len(self.calls) < n:
            await self.changed.wait()


async def test_service_samples_on_a_period(autojump_clock: trio.testing.MockClock) -> None:
    controller = LoadController("adaptive", 10, clock=TrioClock())
    # normal, a failure (skipped), then sustained critical CPU.
    sampler = ScriptedSampler([0.1, RuntimeError("proc is gone"), 0.99])
    seen: list[LoadSnapshot] = []
    service = LoadSamplerService(
        controller,
        sampler,
        interval=2.0,
        connections=lambda: (3, 20),
        on_snapshot=seen.append,
    )
    assert service.latest == controller.snapshot()
    async with trio.open_nursery() as nursery:
        start = trio.current_time()
        await nursery.start(service.run)
        # started() came after the first sample.
        assert sampler.calls == [(3, 20)]
        assert service.samples == 1 and seen == [service.latest]
        await sampler.wait_calls(4)
        assert service.failures == 1
        assert trio.current_time() - start == pytest.approx(6.0)  # samples at 0, 2, 4, 6 s
        assert service.latest.pressure_state is PressureState.CRITICAL
        assert seen[-1] == service.latest
        assert len(seen) == 3  # the failed sample published nothing
        nursery.cancel_scope.cancel()


async def test_service_starts_even_if_the_first_sample_fails(
    autojump_clock: trio.testing.MockClock,
) -> None:
    controller = LoadController("observe", 4, clock=TrioClock())
    sampler = ScriptedSampler([RuntimeError("no /proc"), 0.2])

    def broken_callback(_snapshot: LoadSnapshot) -> None:
        raise ValueError("metrics are broken")

    service = LoadSamplerService(controller, sampler, interval=1.0, on_snapshot=broken_callback)
    async with trio.open_nursery() as nursery:
        await nursery.start(service.run)
        assert (service.samples, service.failures) == (0, 1)
        await sampler.wait_calls(2)
        # A failing callback does not count as a failed sample: the controller took it.
        assert (service.samples, service.failures) == (1, 1)
        assert sampler.calls[-1] == (0, 0)  # no connection source: unknown
        assert service.latest.sampled_at is not None
        nursery.cancel_scope.cancel()


async def test_service_logs_a_run_of_failures_once(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    controller = LoadController("observe", 4, clock=TrioClock())
    boom = RuntimeError("boom")
    sampler = ScriptedSampler([boom, boom, boom, 0.1, boom])
    service = LoadSamplerService(controller, sampler, interval=1.0)
    with caplog.at_level(logging.INFO, logger="engine.load.sampler"):
        async with trio.open_nursery() as nursery:
            await nursery.start(service.run)
            await sampler.wait_calls(5)
            nursery.cancel_scope.cancel()
    events = [getattr(r, "event", None) for r in caplog.records]
    assert events == ["load_sample_failed", "load_sample_recovered", "load_sample_failed"]
    assert (service.samples, service.failures) == (1, 4)


def test_sample_now_is_sample_worker_load() -> None:
    clock = FakeClock(50.0)
    controller = LoadController("adaptive", 4, clock=clock)

    class Fixed:
        def sample(self, db_connections: int, db_max: int) -> ResourceSample:
            return ResourceSample(None, None, db_connections, db_max, clock.now())

    service = LoadSamplerService(controller, Fixed(), interval=1.0, connections=lambda: (1, 2))
    snapshot = service.sample_now()
    assert snapshot.sampled_at == 50.0
    assert service.latest is snapshot


@pytest.mark.parametrize("interval", [0.0, -1.0, float("nan"), float("inf")])
def test_service_rejects_bad_intervals(interval: float) -> None:
    with pytest.raises(ValueError, match="interval"):
        LoadSamplerService(LoadController("legacy", 1), ScriptedSampler([]), interval=interval)
