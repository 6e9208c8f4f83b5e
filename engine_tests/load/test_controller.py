"""The workerload controller: pressure, safe capacity, phases and the heavy limit."""

from __future__ import annotations

import random
from typing import Any

import attrs
import pytest
import trio
import trio.testing

from engine.load.clock import MonotonicClock, TrioClock
from engine.load.config import LoadConfig
from engine.load.controller import (
    HEAVY_PHASES,
    LoadController,
    LoadLease,
    LoadMode,
    LoadSnapshot,
)
from engine.load.pressure import (
    REASON_CPU,
    REASON_DATABASE_CONNECTIONS,
    REASON_MEMORY,
    LoadThresholds,
    PressureState,
    ResourceSample,
)
from engine.load.retry_delay import refused_start_delay
from engine.tasks.gates import Phase


def thresholds(**changes: Any) -> LoadThresholds:
    """The thresholds of the default ``[load]`` section, with ``changes``."""
    return attrs.evolve(LoadThresholds.from_section(LoadConfig()), **changes)


NORMAL = PressureState.NORMAL
ELEVATED = PressureState.ELEVATED
CRITICAL = PressureState.CRITICAL

# Scripted resource readings.
N: dict[str, Any] = {}
E: dict[str, Any] = {"cpu": 0.85}
C: dict[str, Any] = {"mem": 0.95}


class FakeClock:
    """A hand-driven clock."""

    def __init__(self, start: float = 1000.0) -> None:
        self.t = start

    def now(self) -> float:
        return self.t


def sample(
    at: float,
    cpu: float | None = None,
    mem: float | None = None,
    db: tuple[int, int] = (0, 0),
) -> ResourceSample:
    return ResourceSample(
        cpu_fraction=cpu,
        memory_fraction=mem,
        db_connections=db[0],
        db_max_connections=db[1],
        sampled_at=at,
    )


class Driver:
    """Feeds scripted samples 5 s apart on a fake clock."""

    def __init__(self, controller: LoadController, clock: FakeClock) -> None:
        self.controller = controller
        self.clock = clock

    def feed(self, reading: dict[str, Any]) -> LoadSnapshot:
        self.clock.t += 5
        return self.controller.observe(sample(self.clock.t, **reading))

    def feed_many(self, *readings: dict[str, Any]) -> list[LoadSnapshot]:
        return [self.feed(r) for r in readings]


def make(
    mode: LoadMode = "adaptive",
    claim_limit: int = 20,
    heavy_limit: int = 0,
    thresholds: LoadThresholds | None = None,
) -> tuple[LoadController, Driver]:
    clock = FakeClock()
    controller = LoadController(mode, claim_limit, heavy_limit, thresholds, clock)
    return controller, Driver(controller, clock)


def start(controller: LoadController, count: int) -> list[LoadLease]:
    leases = []
    for _ in range(count):
        lease = controller.try_start()
        assert lease is not None
        leases.append(lease)
    return leases


def phase_of(lease: LoadLease) -> Phase:
    """The lease's phase, read through a call so mypy does not narrow it across awaits."""
    return lease.phase


def heavy(snapshot: LoadSnapshot) -> int:
    return snapshot.preparing + snapshot.finalizing


# --- classification ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("reading", "level", "reason"),
    [
        ({}, NORMAL, ""),
        ({"db": (69, 100)}, NORMAL, ""),
        ({"db": (70, 100)}, ELEVATED, REASON_DATABASE_CONNECTIONS),
        ({"db": (90, 100)}, CRITICAL, REASON_DATABASE_CONNECTIONS),
        ({"db": (95, 0)}, NORMAL, ""),  # unknown pool size: not judged
        ({"mem": 0.75}, ELEVATED, REASON_MEMORY),
        ({"mem": 0.90}, CRITICAL, REASON_MEMORY),
        ({"cpu": 0.79}, NORMAL, ""),
        ({"cpu": 0.80}, ELEVATED, REASON_CPU),
        ({"cpu": 0.94}, ELEVATED, REASON_CPU),
        ({"cpu": 0.95}, CRITICAL, REASON_CPU),
        ({"cpu": 1.7}, CRITICAL, REASON_CPU),  # over quota
        # Worst wins; ties go database > memory > cpu.
        ({"cpu": 0.96, "mem": 0.8}, CRITICAL, REASON_CPU),
        ({"cpu": 0.85, "mem": 0.8, "db": (75, 100)}, ELEVATED, REASON_DATABASE_CONNECTIONS),
        ({"cpu": 0.85, "mem": 0.8}, ELEVATED, REASON_MEMORY),
        ({"cpu": 0.99, "mem": 0.99, "db": (99, 100)}, CRITICAL, REASON_DATABASE_CONNECTIONS),
        ({"mem": 0.91, "db": (71, 100)}, CRITICAL, REASON_MEMORY),
    ],
)
def test_classify(reading: dict[str, Any], level: PressureState, reason: str) -> None:
    assert thresholds().classify(sample(0.0, **reading)) == (level, reason)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"cpu_elevated": 0.9, "cpu_critical": 0.8},
        {"memory_elevated": 0.0},
        {"db_elevated": -0.1},
        {"escalate_samples": 0},
        {"recover_samples": 0},
        {"max_sample_age": 0.0},
    ],
)
def test_thresholds_validation(kwargs: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        thresholds(**kwargs)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"cpu_fraction": -0.1},
        {"memory_fraction": float("nan")},
        {"cpu_fraction": float("inf")},
        {"db_connections": -1},
        {"db_max_connections": -1},
    ],
)
def test_sample_validation(kwargs: dict[str, Any]) -> None:
    base: dict[str, Any] = {
        "cpu_fraction": None,
        "memory_fraction": None,
        "db_connections": 0,
        "db_max_connections": 0,
        "sampled_at": 0.0,
    }
    with pytest.raises(ValueError):
        ResourceSample(**(base | kwargs))


def test_controller_argument_validation() -> None:
    with pytest.raises(ValueError, match="mode"):
        LoadController("turbo", 1)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="claim_limit"):
        LoadController("legacy", -1)
    with pytest.raises(ValueError, match="heavy_limit"):
        LoadController("legacy", 1, heavy_limit=-1)
    controller = LoadController("adaptive", 3)
    with pytest.raises(ValueError, match="claim_limit"):
        controller.set_claim_limit(-1)


# --- state transitions (hysteresis) ------------------------------------------------------------


def states(snapshots: list[LoadSnapshot]) -> list[PressureState]:
    return [s.pressure_state for s in snapshots]


def test_escalates_after_two_consecutive_samples() -> None:
    _, driver = make()
    assert states(driver.feed_many(E, E)) == [NORMAL, ELEVATED]


def test_interrupted_escalation_starts_over() -> None:
    _, driver = make()
    assert states(driver.feed_many(E, N, E, N, E, E)) == [NORMAL] * 5 + [ELEVATED]


def test_escalates_to_the_level_the_whole_run_sustained() -> None:
    _, driver = make()
    assert states(driver.feed_many(C, E)) == [NORMAL, ELEVATED]
    assert states(driver.feed_many(C, C)) == [ELEVATED, CRITICAL]


def test_straight_to_critical() -> None:
    _, driver = make()
    snaps = driver.feed_many(C, C)
    assert states(snaps) == [NORMAL, CRITICAL]
    assert snaps[-1].pressure_reason == REASON_MEMORY


def test_recovers_after_three_consecutive_lower_samples() -> None:
    _, driver = make()
    driver.feed_many(C, C)
    assert states(driver.feed_many(N, N, N)) == [CRITICAL, CRITICAL, NORMAL]


def test_recovery_goes_to_the_highest_level_of_the_run() -> None:
    _, driver = make()
    driver.feed_many(C, C)
    snaps = driver.feed_many(E, N, N)
    assert states(snaps) == [CRITICAL, CRITICAL, ELEVATED]
    assert snaps[-1].pressure_reason == REASON_CPU
    assert states(driver.feed_many(N, N, N)) == [ELEVATED, ELEVATED, NORMAL]


def test_same_level_sample_breaks_a_recovery_run() -> None:
    _, driver = make()
    driver.feed_many(E, E)
    assert states(driver.feed_many(N, N, E, N, N, N)) == [ELEVATED] * 5 + [NORMAL]


def test_higher_sample_breaks_a_recovery_run() -> None:
    _, driver = make()
    driver.feed_many(E, E)
    assert states(driver.feed_many(N, N, C, N, N, N)) == [ELEVATED] * 5 + [NORMAL]


def test_custom_sample_counts() -> None:
    _, driver = make(thresholds=thresholds(escalate_samples=1, recover_samples=1))
    assert states(driver.feed_many(E, N, C, E, N)) == [ELEVATED, NORMAL, CRITICAL, ELEVATED, NORMAL]


def test_reason_follows_the_dominant_resource() -> None:
    _, driver = make()
    snaps = driver.feed_many({"db": (80, 100)}, {"db": (80, 100)}, {"cpu": 0.85}, N, N, N)
    assert [s.pressure_reason for s in snaps] == [
        "",
        REASON_DATABASE_CONNECTIONS,
        REASON_CPU,  # same level, different dominant resource
        REASON_CPU,
        REASON_CPU,
        "",
    ]


# --- safe capacity ---------------------------------------------------------------------------


def test_safe_capacity_shrinks_under_pressure_and_recovers_by_one_per_sample() -> None:
    controller, driver = make(claim_limit=20)
    leases = start(controller, 20)

    assert driver.feed(E).safe_capacity == 20  # one sample is not enough
    assert driver.feed(E).safe_capacity == 18  # elevated: floor(20 * 0.9)
    assert driver.feed(E).safe_capacity == 18
    for lease in leases[:2]:
        lease.release()
    assert driver.feed(E).safe_capacity == 16  # floor(18 * 0.9): shedding continues

    driver.feed(C)
    snap = driver.feed(C)
    assert snap.pressure_state is CRITICAL
    assert snap.safe_capacity == 16  # min(18 - 1, floor(18 * 0.9)) = 16: no increase
    for lease in leases[2:15]:
        lease.release()
    assert driver.feed(C).safe_capacity == 4  # active 5: max(1, 5 - 1)

    # Recovery: two normal samples keep the state critical (and the target at active - 1).
    assert [s.safe_capacity for s in driver.feed_many(N, N)] == [4, 4]
    snap = driver.feed(N)
    assert snap.pressure_state is NORMAL
    assert snap.safe_capacity == 5  # +1, not straight back to 20
    assert [s.safe_capacity for s in driver.feed_many(*[N] * 14)] == list(range(6, 20))
    assert driver.feed(N).safe_capacity == 20
    assert driver.feed(N).safe_capacity == 20  # never above the claim limit


def test_critical_is_never_looser_than_elevated_for_many_leases() -> None:
    controller, driver = make(claim_limit=50)
    start(controller, 50)
    assert driver.feed_many(C, C)[-1].safe_capacity == 45  # min(49, 45)


def test_pressure_with_no_active_leases_keeps_one_slot() -> None:
    controller, driver = make(claim_limit=10)
    assert driver.feed_many(C, C)[-1].safe_capacity == 1
    lease = controller.try_start()
    assert lease is not None
    assert controller.try_start() is None


def test_adaptive_admission_follows_safe_capacity() -> None:
    controller, driver = make(claim_limit=10)
    leases = start(controller, 10)
    driver.feed_many(C, C)  # critical: 9
    for lease in leases[:5]:
        lease.release()
    assert controller.snapshot().active == 5
    snap = driver.feed(C)
    assert snap.safe_capacity == 4
    assert controller.try_start() is None  # 5 active >= 4: no interruption, no admission
    for lease in leases[5:7]:
        lease.release()
    assert controller.try_start() is not None  # 3 < 4
    assert controller.try_start() is None


def test_observe_mode_computes_but_admits_as_legacy() -> None:
    controller, driver = make(mode="observe", claim_limit=10)
    leases = start(controller, 10)
    snap = driver.feed_many(C, C)[-1]
    assert snap.pressure_state is CRITICAL
    assert snap.safe_capacity == 9
    leases[0].release()
    leases[1].release()
    assert controller.try_start() is not None  # 8 < claim 10, although safe is 9 - 1
    assert controller.try_start() is not None
    assert controller.try_start() is None


def test_legacy_mode_computes_no_pressure() -> None:
    controller, driver = make(mode="legacy", claim_limit=3)
    snaps = driver.feed_many(C, C, C)
    assert all(s.pressure_state is NORMAL and s.pressure_reason == "" for s in snaps)
    assert snaps[-1].safe_capacity == 3
    assert snaps[-1].sampled_at == driver.clock.t
    start(controller, 3)
    assert controller.try_start() is None


# --- samples and the clock -------------------------------------------------------------------


def test_future_sample_is_an_error() -> None:
    controller, driver = make()
    with pytest.raises(ValueError, match="future"):
        controller.observe(sample(driver.clock.t + 1, cpu=0.99))


def test_duplicate_and_out_of_order_samples_are_ignored() -> None:
    controller, driver = make()
    driver.clock.t += 5
    first = sample(driver.clock.t, cpu=0.85)
    controller.observe(first)
    assert controller.observe(first).pressure_state is NORMAL  # did not count twice
    assert controller.observe(sample(driver.clock.t - 1, cpu=0.85)).pressure_state is NORMAL
    assert controller.snapshot().sampled_at == driver.clock.t
    assert driver.feed(E).pressure_state is ELEVATED


def test_stale_samples_are_ignored() -> None:
    controller, driver = make(thresholds=thresholds(max_sample_age=10.0))
    driver.clock.t += 100
    assert controller.observe(sample(driver.clock.t - 11, cpu=0.99)).sampled_at is None
    controller.observe(sample(driver.clock.t - 10, cpu=0.99))  # exactly 10 s old: accepted
    assert controller.snapshot().sampled_at == driver.clock.t - 10


def test_clocks() -> None:
    assert MonotonicClock().now() <= MonotonicClock().now()
    controller = LoadController("adaptive", 2)  # default clock: monotonic
    assert controller.observe(sample(MonotonicClock().now())).sampled_at is not None


async def test_sampler_task_on_trio_clock(autojump_clock: trio.testing.MockClock) -> None:
    controller = LoadController("adaptive", 10, clock=TrioClock())
    start(controller, 10)
    script = [N, E, E, E, C, C, N, N, N]
    seen = []
    for reading in script:
        await trio.sleep(5)
        snap = controller.observe(sample(trio.current_time(), **reading))
        seen.append((snap.pressure_state, snap.safe_capacity))
    assert seen == [
        (NORMAL, 10),
        (NORMAL, 10),
        (ELEVATED, 9),
        (ELEVATED, 9),
        (ELEVATED, 9),
        (CRITICAL, 9),
        (CRITICAL, 9),
        (CRITICAL, 9),
        (NORMAL, 10),
    ]


# --- claim limit -------------------------------------------------------------------------------


def test_lowering_the_claim_limit_never_interrupts() -> None:
    controller, _ = make(claim_limit=5)
    start(controller, 5)
    snap = controller.set_claim_limit(2)
    assert (snap.claim_limit, snap.safe_capacity, snap.active) == (2, 2, 5)
    assert controller.try_start() is None


def test_raising_when_fully_recovered_applies_at_once() -> None:
    controller, _ = make(claim_limit=5)
    snap = controller.set_claim_limit(8)
    assert (snap.safe_capacity, snap.heavy_limit) == (8, 8)
    assert len(start(controller, 8)) == 8


def test_raising_while_ramping_keeps_the_plus_one_rule() -> None:
    controller, driver = make(claim_limit=10)
    driver.feed_many(C, C)  # safe 1 (no leases)
    driver.feed_many(N, N, N)  # normal, safe 2
    assert controller.snapshot().safe_capacity == 2
    assert controller.set_claim_limit(20).safe_capacity == 2
    assert [s.safe_capacity for s in driver.feed_many(N, N)] == [3, 4]


def test_raising_under_pressure_keeps_the_safe_capacity() -> None:
    controller, driver = make(claim_limit=10)
    start(controller, 10)
    driver.feed_many(E, E)  # 9
    assert controller.set_claim_limit(30).safe_capacity == 9


def test_legacy_safe_capacity_is_the_claim_limit() -> None:
    controller, _ = make(mode="legacy", claim_limit=4)
    assert controller.set_claim_limit(9).safe_capacity == 9
    assert controller.set_claim_limit(1).safe_capacity == 1


# --- leases, phases and the heavy limit --------------------------------------------------------


def test_lease_lifecycle_counts() -> None:
    controller, _ = make(claim_limit=3)
    lease = controller.try_start()
    assert lease is not None
    assert phase_of(lease) is Phase.PREPARING
    snap = controller.snapshot()
    assert (snap.active, snap.preparing, snap.waiting_upstream, snap.finalizing) == (1, 1, 0, 0)
    lease.enter_nowait(Phase.WAITING_UPSTREAM)
    snap = controller.statistics()
    assert (snap.active, snap.preparing, snap.waiting_upstream, snap.finalizing) == (1, 0, 1, 0)
    lease.enter_nowait("finalizing")
    snap = controller.snapshot()
    assert (snap.active, snap.preparing, snap.waiting_upstream, snap.finalizing) == (1, 0, 0, 1)
    lease.release()
    snap = controller.snapshot()
    assert (snap.active, snap.preparing, snap.waiting_upstream, snap.finalizing) == (0, 0, 0, 0)


def test_release_is_idempotent() -> None:
    controller, _ = make(claim_limit=3)
    a, b = start(controller, 2)
    a.release()
    a.release()
    a.release()
    assert a.released
    assert controller.snapshot().active == 1
    with b:
        pass
    b.release()
    assert controller.snapshot().active == 0
    assert controller.snapshot().preparing == 0


def test_released_lease_refuses_phase_changes() -> None:
    controller, _ = make(claim_limit=3)
    (lease,) = start(controller, 1)
    lease.release()
    with pytest.raises(RuntimeError, match="released"):
        lease.enter_nowait(Phase.WAITING_UPSTREAM)


async def test_released_lease_refuses_enter() -> None:
    controller, _ = make(claim_limit=3)
    (lease,) = start(controller, 1)
    lease.release()
    with pytest.raises(RuntimeError, match="released"):
        await lease.enter(Phase.FINALIZING)


def test_try_start_refuses_when_heavy_phases_are_full() -> None:
    controller, _ = make(claim_limit=10, heavy_limit=2)
    a, _b = start(controller, 2)
    assert controller.try_start() is None  # the new lease would start in preparing
    a.enter_nowait(Phase.WAITING_UPSTREAM)
    assert controller.try_start() is not None
    assert controller.snapshot().heavy_limit == 2


def test_heavy_limit_in_legacy_mode_when_configured() -> None:
    controller, _ = make(mode="legacy", claim_limit=10, heavy_limit=1)
    (a,) = start(controller, 1)
    assert controller.try_start() is None
    a.enter_nowait(Phase.WAITING_UPSTREAM)
    b = controller.try_start()
    assert b is not None
    with pytest.raises(trio.WouldBlock):
        a.enter_nowait(Phase.FINALIZING)


def test_heavy_to_heavy_keeps_the_slot() -> None:
    controller, _ = make(claim_limit=10, heavy_limit=1)
    (a,) = start(controller, 1)
    a.enter_nowait(Phase.FINALIZING)  # preparing -> finalizing: no wait even at the limit
    a.enter_nowait(Phase.FINALIZING)  # same phase: no-op
    snap = controller.snapshot()
    assert (snap.preparing, snap.finalizing) == (0, 1)


def test_default_heavy_limit_tracks_the_claim_limit() -> None:
    controller, _ = make(claim_limit=4)
    a, b, c, _d = start(controller, 4)
    controller.set_claim_limit(2)
    assert controller.snapshot().heavy_limit == 2
    a.enter_nowait(Phase.WAITING_UPSTREAM)  # 3 heavy left, over the new limit; nobody cut off
    with pytest.raises(trio.WouldBlock):
        a.enter_nowait(Phase.PREPARING)
    b.release()
    c.release()  # 1 heavy left
    a.enter_nowait(Phase.PREPARING)


async def test_enter_waits_for_a_heavy_slot_and_is_woken_when_it_frees() -> None:
    controller, _ = make(claim_limit=10, heavy_limit=1)
    (a,) = start(controller, 1)
    a.enter_nowait(Phase.WAITING_UPSTREAM)
    (b,) = start(controller, 1)  # b holds the only heavy slot
    entered = trio.Event()

    async def finalize_a() -> None:
        await a.enter(Phase.FINALIZING)
        entered.set()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(finalize_a)
        await trio.testing.wait_all_tasks_blocked()
        assert not entered.is_set()
        assert phase_of(a) is Phase.WAITING_UPSTREAM
        b.enter_nowait(Phase.WAITING_UPSTREAM)  # b leaves the heavy phase: a gets the slot
    assert entered.is_set()
    assert phase_of(a) is Phase.FINALIZING
    snap = controller.snapshot()
    assert (snap.preparing, snap.waiting_upstream, snap.finalizing) == (0, 1, 1)


async def test_waiting_upstream_never_waits() -> None:
    controller, _ = make(claim_limit=10, heavy_limit=1)
    (a,) = start(controller, 1)
    with trio.testing.assert_checkpoints():
        await a.enter(Phase.WAITING_UPSTREAM)
    (b,) = start(controller, 1)
    await b.enter(Phase.WAITING_UPSTREAM)
    assert controller.snapshot().waiting_upstream == 2


async def test_waiters_are_served_first_come_first_served() -> None:
    controller, _ = make(claim_limit=10, heavy_limit=1)
    waiting = []
    for _ in range(3):
        (lease,) = start(controller, 1)
        lease.enter_nowait(Phase.WAITING_UPSTREAM)
        waiting.append(lease)
    (holder,) = start(controller, 1)
    order: list[int] = []

    async def finalize(index: int) -> None:
        await waiting[index].enter(Phase.FINALIZING)
        order.append(index)
        assert heavy(controller.snapshot()) <= 1
        waiting[index].release()

    async with trio.open_nursery() as nursery:
        for index in (2, 0, 1):
            nursery.start_soon(finalize, index)
            await trio.testing.wait_all_tasks_blocked()  # queue in this order
        # A newcomer cannot jump the queue while leases wait for a heavy slot.
        assert controller.try_start() is None
        holder.release()
    assert order == [2, 0, 1]
    assert controller.snapshot().active == 0


async def test_cancel_while_waiting_undoes_bookkeeping() -> None:
    controller, _ = make(claim_limit=10, heavy_limit=1)
    (a,) = start(controller, 1)
    a.enter_nowait(Phase.WAITING_UPSTREAM)
    (b,) = start(controller, 1)
    before = controller.snapshot()
    cancel_scope = trio.CancelScope()

    async def finalize_a() -> None:
        with cancel_scope:
            await a.enter(Phase.FINALIZING)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(finalize_a)
        await trio.testing.wait_all_tasks_blocked()
        cancel_scope.cancel()
    assert cancel_scope.cancelled_caught
    assert controller.snapshot() == before
    assert phase_of(a) is Phase.WAITING_UPSTREAM

    # The cancelled attempt left no place in the queue: freeing the slot hands it to nobody.
    b.release()
    snap = controller.snapshot()
    assert (snap.active, snap.preparing, snap.waiting_upstream, snap.finalizing) == (1, 0, 1, 0)
    # And the lease is still usable.
    await a.enter(Phase.FINALIZING)
    assert controller.snapshot().finalizing == 1


async def test_cancelled_enter_already_cancelled_does_nothing() -> None:
    controller, _ = make(claim_limit=10, heavy_limit=5)
    (a,) = start(controller, 1)
    with trio.CancelScope() as scope:
        scope.cancel()
        await a.enter(Phase.WAITING_UPSTREAM)
    assert phase_of(a) is Phase.PREPARING
    assert controller.snapshot().preparing == 1


async def test_release_while_waiting_wakes_the_waiter_with_an_error() -> None:
    controller, _ = make(claim_limit=10, heavy_limit=1)
    (a,) = start(controller, 1)
    a.enter_nowait(Phase.WAITING_UPSTREAM)
    (b,) = start(controller, 1)
    raised = []

    async def finalize_a() -> None:
        with pytest.raises(RuntimeError, match="released while waiting"):
            await a.enter(Phase.FINALIZING)
        raised.append(True)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(finalize_a)
        await trio.testing.wait_all_tasks_blocked()
        a.release()
        a.release()
    assert raised == [True]
    snap = controller.snapshot()
    assert (snap.active, snap.preparing, snap.waiting_upstream, snap.finalizing) == (1, 1, 0, 0)
    b.release()
    assert controller.snapshot().active == 0


async def test_concurrent_enter_on_one_lease_is_refused() -> None:
    controller, _ = make(claim_limit=10, heavy_limit=1)
    (a,) = start(controller, 1)
    a.enter_nowait(Phase.WAITING_UPSTREAM)
    (b,) = start(controller, 1)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(a.enter, Phase.FINALIZING)
        await trio.testing.wait_all_tasks_blocked()
        with pytest.raises(RuntimeError, match="already waiting"):
            await a.enter(Phase.PREPARING)
        with pytest.raises(RuntimeError, match="already waiting"):
            a.enter_nowait(Phase.PREPARING)
        b.release()
    assert phase_of(a) is Phase.FINALIZING


async def test_raising_the_claim_limit_wakes_heavy_waiters() -> None:
    controller, _ = make(claim_limit=2)
    a, _b = start(controller, 2)
    a.enter_nowait(Phase.WAITING_UPSTREAM)
    controller.set_claim_limit(1)  # default heavy limit follows: 1 of 1 in use
    async with trio.open_nursery() as nursery:
        nursery.start_soon(a.enter, Phase.FINALIZING)
        await trio.testing.wait_all_tasks_blocked()
        assert phase_of(a) is Phase.WAITING_UPSTREAM
        controller.set_claim_limit(3)
    assert phase_of(a) is Phase.FINALIZING


@pytest.mark.parametrize("mode", ["legacy", "observe", "adaptive"])
async def test_heavy_limit_under_concurrency(
    mode: LoadMode, autojump_clock: trio.testing.MockClock
) -> None:
    heavy_limit = 3
    controller = LoadController(mode, claim_limit=12, heavy_limit=heavy_limit)
    rng = random.Random(1234)
    peak = 0
    finished = 0

    def check() -> None:
        nonlocal peak
        snap = controller.snapshot()
        assert heavy(snap) <= heavy_limit
        assert snap.active <= 12
        assert snap.active == snap.preparing + snap.waiting_upstream + snap.finalizing
        peak = max(peak, heavy(snap))

    async def job(task_id: str) -> None:
        nonlocal finished
        lease = controller.try_start()
        while lease is None:
            # Refused jobs snooze like River jobs do; virtual time under autojump.
            await trio.sleep(refused_start_delay(task_id))
            lease = controller.try_start()
        with lease:
            check()
            await trio.sleep(rng.uniform(0.1, 2.0))
            await lease.enter(Phase.WAITING_UPSTREAM)
            check()
            await trio.sleep(rng.uniform(0.1, 5.0))
            await lease.enter(Phase.FINALIZING)
            check()
            assert lease.phase in HEAVY_PHASES
            await trio.sleep(rng.uniform(0.1, 2.0))
        check()
        finished += 1

    async with trio.open_nursery() as nursery:
        for index in range(60):
            nursery.start_soon(job, f"task-{index}")
    assert finished == 60
    assert peak == heavy_limit  # the limit was actually reached
    snap = controller.snapshot()
    assert (snap.active, snap.preparing, snap.waiting_upstream, snap.finalizing) == (0, 0, 0, 0)


async def test_a_grant_already_delivered_wins_over_a_later_cancel() -> None:
    # trio delivers either the wake-up or the cancellation, never both: once the slot was
    # handed over, enter() completes and the lease holds the slot.
    controller, _ = make(claim_limit=10, heavy_limit=1)
    (a,) = start(controller, 1)
    a.enter_nowait(Phase.WAITING_UPSTREAM)
    (b,) = start(controller, 1)
    cancel_scope = trio.CancelScope()

    async def finalize_a() -> None:
        with cancel_scope:
            await a.enter(Phase.FINALIZING)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(finalize_a)
        await trio.testing.wait_all_tasks_blocked()
        b.release()  # grants the slot to a and reschedules it ...
        cancel_scope.cancel()  # ... before a runs again
    assert not cancel_scope.cancelled_caught
    assert phase_of(a) is Phase.FINALIZING
    snap = controller.snapshot()
    assert (snap.active, snap.preparing, snap.waiting_upstream, snap.finalizing) == (1, 0, 0, 1)
