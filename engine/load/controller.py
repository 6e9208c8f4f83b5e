"""The load controller: per-process admission and phase limits under load.

One :class:`LoadController` per worker process bounds *all* executions in the process, across
River-client generations. A job asks :meth:`LoadController.try_start` for a :class:`LoadLease`
before doing work; a refused job snoozes 250-750 ms without consuming an attempt. The
lease then moves through the phases ``preparing`` (heavy: input download, request build),
``waiting_upstream`` (cheap: provider polling) and ``finalizing`` (heavy: result transfer).

Three numbers bound the process:

- the **claim limit**: this instance's allocated capacity (its share of the global capacity),
  set on every refresh;
- the **safe capacity** (the "active limit" of the metrics): the claim limit reduced
  under resource pressure, computed from :class:`ResourceSample` readings;
- the **heavy limit**: how many leases may be in heavy phases at once.

Modes: ``legacy`` computes no pressure (state ``normal``, safe capacity = claim limit);
``observe`` computes pressure and safe capacity for reporting but admits as ``legacy``;
``adaptive`` enforces the safe capacity.

Not thread-safe: use it from one trio run. The synchronous methods never await, so each runs
atomically with respect to other trio tasks.
"""

from __future__ import annotations

import collections
from types import TracebackType
from typing import TYPE_CHECKING, Literal

import attrs
import trio

from engine.load.clock import Clock, MonotonicClock
from engine.load.config import LoadConfig
from engine.load.pressure import RANK, LoadThresholds, PressureState, ResourceSample
from engine.tasks.gates import LoadGate, Phase

__all__ = [
    "HEAVY_PHASES",
    "LoadController",
    "LoadLease",
    "LoadMode",
    "LoadSnapshot",
]

LoadMode = Literal["legacy", "observe", "adaptive"]
"""How much the controller enforces; see the module docstring."""

_MODES: frozenset[str] = frozenset({"legacy", "observe", "adaptive"})


HEAVY_PHASES: frozenset[Phase] = frozenset({Phase.PREPARING, Phase.FINALIZING})
"""Phases that count toward the heavy limit; ``waiting_upstream`` is cheap polling."""


@attrs.frozen(slots=True)
class LoadSnapshot:
    """The controller's state at one moment; reported in registration.

    Attributes:
        mode: the controller's mode.
        claim_limit: this instance's allocated capacity.
        safe_capacity: the active limit (the claim limit in ``legacy``).
        heavy_limit: the effective heavy-phase limit.
        active: leases held.
        preparing: leases in ``preparing``.
        waiting_upstream: leases in ``waiting_upstream``.
        finalizing: leases in ``finalizing``.
        pressure_state: the current pressure level.
        pressure_reason: the dominant resource (``""`` when normal).
        sampled_at: ``sampled_at`` of the last accepted sample, ``None`` before the first.
    """

    mode: LoadMode
    claim_limit: int
    safe_capacity: int
    heavy_limit: int
    active: int
    preparing: int
    waiting_upstream: int
    finalizing: int
    pressure_state: PressureState
    pressure_reason: str
    sampled_at: float | None


_WaiterOutcome = Literal["waiting", "granted", "released"]


@attrs.define(slots=True, eq=False)
class _HeavyWaiter:
    """A lease parked in :meth:`LoadLease.enter` until a heavy slot is handed to it."""

    lease: LoadLease
    phase: Phase
    previous: Phase
    event: trio.Event = attrs.Factory(trio.Event)
    outcome: _WaiterOutcome = "waiting"


class LoadLease:
    """One admitted execution; created only by :meth:`LoadController.try_start`.

    Owned by one task at a time: :meth:`enter` must not run concurrently on the same lease.
    :meth:`release` may be called from anywhere, any number of times; ``with lease:`` releases
    on exit.
    """

    __slots__ = ("_controller", "_phase", "_released", "_waiter")

    def __init__(self, controller: LoadController) -> None:
        """Bind the lease to ``controller``; the controller has already counted it."""
        self._controller = controller
        self._phase = Phase.PREPARING
        self._released = False
        self._waiter: _HeavyWaiter | None = None

    @property
    def phase(self) -> Phase:
        """The phase the lease is in (the last one it held if released)."""
        return self._phase

    @property
    def released(self) -> bool:
        """True once :meth:`release` ran."""
        return self._released

    def _check_usable(self) -> None:
        """Refuse phase changes on a released lease or during another ``enter``."""
        if self._released:
            raise RuntimeError("the load lease was released")
        if self._waiter is not None:
            raise RuntimeError("another enter() is already waiting on this lease")

    async def enter(self, phase: Phase | str) -> None:
        """Move the lease to ``phase``, waiting for a heavy slot if needed.

        Entering a heavy phase (``preparing``, ``finalizing``) from ``waiting_upstream`` while
        the heavy limit is reached waits, first come first served, until a slot frees. Moving
        between heavy phases keeps the slot already held; ``waiting_upstream`` never waits.
        The wait is cancellable: on cancellation the lease stays in its previous phase with no
        trace of the attempt, and ``trio.Cancelled`` propagates. (If the slot had already been
        handed over when the cancellation arrives, trio delivers the hand-over and ``enter``
        completes; the cancellation lands at the caller's next checkpoint.)

        Raises:
            RuntimeError: if the lease is (or gets, while waiting) released, or another
                ``enter`` is waiting on it.
        """
        target = Phase(phase)
        await trio.lowlevel.checkpoint_if_cancelled()
        self._check_usable()
        controller = self._controller
        if controller._can_enter_now(self, target):
            controller._move(self, target)
            controller._wake_heavy_waiters()
            await trio.lowlevel.cancel_shielded_checkpoint()
            return

        waiter = _HeavyWaiter(lease=self, phase=target, previous=self._phase)
        controller._waiters.append(waiter)
        self._waiter = waiter
        try:
            await waiter.event.wait()
        except BaseException:
            # trio.Cancelled (or KeyboardInterrupt): leave no trace of the attempt.
            if waiter.outcome == "waiting":
                controller._waiters.remove(waiter)
            elif waiter.outcome == "granted" and not self._released:
                # The slot was handed over just before the cancellation landed (trio normally
                # delivers one or the other, this is defensive): hand it back.
                controller._move(self, waiter.previous)
                controller._wake_heavy_waiters()
            raise
        finally:
            self._waiter = None
        if waiter.outcome == "released" or self._released:
            raise RuntimeError("the load lease was released while waiting for a heavy slot")

    def enter_nowait(self, phase: Phase | str) -> None:
        """Like :meth:`enter`, but raise ``trio.WouldBlock`` instead of waiting.

        Also refuses (``WouldBlock``) while other leases queue for a heavy slot, so it cannot
        jump the queue.
        """
        target = Phase(phase)
        self._check_usable()
        controller = self._controller
        if not controller._can_enter_now(self, target):
            raise trio.WouldBlock
        controller._move(self, target)
        controller._wake_heavy_waiters()

    def release(self) -> None:
        """Give the slot back (idempotent): decrement the counters and wake heavy waiters.

        If an :meth:`enter` is waiting on this lease, it is woken and raises ``RuntimeError``.
        """
        if self._released:
            return
        self._released = True
        controller = self._controller
        waiter = self._waiter
        if waiter is not None and waiter.outcome == "waiting":
            controller._waiters.remove(waiter)
            waiter.outcome = "released"
            waiter.event.set()
        controller._active -= 1
        controller._phase_counts[self._phase] -= 1
        controller._wake_heavy_waiters()

    def __enter__(self) -> LoadLease:
        """Return the lease; ``with`` releases it on exit."""
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        """Release the lease."""
        self.release()


class LoadController:
    """The load controller; see the module docstring for the model.

    How it decides:

    - **Escalation target**: after ``escalate_samples`` consecutive samples above the current
      level the state rises to the *lowest* level in that run (the level sustained by all of
      them); after ``recover_samples`` consecutive samples below, it falls to the *highest*
      level in that run. A sample at the current level breaks either run.
    - **Safe capacity** targets, re-evaluated on every accepted sample, always capped at the
      claim limit: ``normal`` -> claim limit; ``elevated`` -> ``max(1, floor(active * 0.9))``;
      ``critical`` -> ``max(1, min(active - 1, floor(active * 0.9)))``. The ``min`` keeps
      critical at least as strict as elevated when more than 10 leases are active (for 10 or
      fewer it equals ``active - 1``). Because the targets follow ``active``, a
      sustained pressure keeps shrinking the capacity sample by sample, down to 1.
    - **Hysteresis**: a lower target applies at once; a higher one is approached by at most
      +1 per sample, in every state (including the climb back after returning to normal).
    - **set_claim_limit**: lowering applies at once to the safe capacity and never interrupts
      holders (``active`` may exceed the new limit until leases end). Raising moves the safe
      capacity at once only when the state is ``normal`` and the safe capacity had fully
      recovered (equalled the old claim limit); otherwise the +1 ramp continues toward the new
      limit, so a raise cannot bypass recovery. In ``legacy`` the safe capacity is always the
      claim limit.
    - **Heavy limit**: ``heavy_limit`` if > 0, else the current claim limit (tracking it). It is
      enforced in every mode; with the default it only binds after the claim limit was lowered
      below the leases already held.
    - **try_start** refuses when the heavy phases are full (the new lease would start in
      ``preparing``) or when leases queue for a heavy slot: finishing work that already holds
      a lease comes before starting new work.
    - **Samples** must carry ``sampled_at`` on this controller's clock. A sample from the future
      raises ``ValueError`` (a timebase mix-up would otherwise silently disable the controller);
      one not newer than the last accepted sample, or older than ``max_sample_age``, is ignored.
    """

    def __init__(
        self,
        mode: LoadMode,
        claim_limit: int,
        heavy_limit: int = 0,
        thresholds: LoadThresholds | None = None,
        clock: Clock | None = None,
    ) -> None:
        """Create a controller.

        Args:
            mode: ``"legacy"``, ``"observe"`` or ``"adaptive"``.
            claim_limit: this instance's allocated capacity (>= 0).
            heavy_limit: the heavy-phase limit; 0 means "the claim limit".
            thresholds: pressure thresholds; those of the ``[load]`` defaults if ``None``.
            clock: the timebase of ``sampled_at``; :class:`MonotonicClock` if ``None``.

        Raises:
            ValueError: for an unknown mode or a negative limit.
        """
        if mode not in _MODES:
            raise ValueError(f"mode must be one of {sorted(_MODES)}, got {mode!r}")
        if claim_limit < 0:
            raise ValueError(f"claim_limit must be >= 0, got {claim_limit}")
        if heavy_limit < 0:
            raise ValueError(f"heavy_limit must be >= 0, got {heavy_limit}")
        self._mode: LoadMode = mode
        self._claim_limit = claim_limit
        self._heavy_config = heavy_limit
        self._thresholds = (
            thresholds if thresholds is not None else LoadThresholds.from_section(LoadConfig())
        )
        self._clock: Clock = clock if clock is not None else MonotonicClock()
        self._safe = claim_limit
        self._state = PressureState.NORMAL
        self._reason = ""
        # The current run of consecutive samples strictly above (or strictly below) the state.
        self._streak: list[tuple[PressureState, str]] = []
        self._last_sampled_at: float | None = None
        self._active = 0
        self._phase_counts: dict[Phase, int] = dict.fromkeys(Phase, 0)
        self._waiters: collections.deque[_HeavyWaiter] = collections.deque()

    # --- reading ---------------------------------------------------------------------------

    @property
    def mode(self) -> LoadMode:
        """The controller's mode."""
        return self._mode

    @property
    def heavy_limit(self) -> int:
        """The effective heavy limit: the configured one, or the claim limit if that is 0."""
        return self._heavy_config if self._heavy_config > 0 else self._claim_limit

    def snapshot(self) -> LoadSnapshot:
        """Return the current state."""
        return LoadSnapshot(
            mode=self._mode,
            claim_limit=self._claim_limit,
            safe_capacity=self._safe,
            heavy_limit=self.heavy_limit,
            active=self._active,
            preparing=self._phase_counts[Phase.PREPARING],
            waiting_upstream=self._phase_counts[Phase.WAITING_UPSTREAM],
            finalizing=self._phase_counts[Phase.FINALIZING],
            pressure_state=self._state,
            pressure_reason=self._reason,
            sampled_at=self._last_sampled_at,
        )

    def statistics(self) -> LoadSnapshot:
        """Same as :meth:`snapshot` (trio's naming for introspection)."""
        return self.snapshot()

    # --- pressure --------------------------------------------------------------------------

    def observe(self, sample: ResourceSample) -> LoadSnapshot:
        """Feed one resource sample; update pressure and safe capacity.

        In ``legacy`` mode only ``sampled_at`` is recorded.

        Raises:
            ValueError: if ``sample.sampled_at`` is later than the controller clock's now.
        """
        now = self._clock.now()
        if sample.sampled_at > now:
            raise ValueError(
                f"sample taken at {sample.sampled_at} is in the future of the controller clock "
                f"({now}); the sampler and the controller must share a timebase"
            )
        if self._last_sampled_at is not None and sample.sampled_at <= self._last_sampled_at:
            # A duplicate or out-of-order delivery must not count twice toward a run.
            return self.snapshot()
        max_age = self._thresholds.max_sample_age
        if max_age is not None and now - sample.sampled_at > max_age:
            return self.snapshot()
        self._last_sampled_at = sample.sampled_at
        if self._mode != "legacy":
            level, reason = self._thresholds.classify(sample)
            self._update_state(level, reason)
            self._update_safe_capacity()
        return self.snapshot()

    def _update_state(self, level: PressureState, reason: str) -> None:
        """Apply the escalate/recover sample counts (the hysteresis)."""
        current = RANK[self._state]
        rank = RANK[level]
        if rank == current:
            self._streak.clear()
            if level is not PressureState.NORMAL:
                # Same level; the dominant resource may have shifted.
                self._reason = reason
            return
        rising = rank > current
        if self._streak and (RANK[self._streak[0][0]] > current) != rising:
            self._streak.clear()
        self._streak.append((level, reason))
        if rising and len(self._streak) >= self._thresholds.escalate_samples:
            new_level = min(self._streak, key=lambda entry: RANK[entry[0]])[0]
            # Every sample of the run is at or above the new level; name the latest one's.
            self._set_state(new_level, self._streak[-1][1])
        elif not rising and len(self._streak) >= self._thresholds.recover_samples:
            new_level = max(self._streak, key=lambda entry: RANK[entry[0]])[0]
            latest = next(r for lvl, r in reversed(self._streak) if lvl is new_level)
            self._set_state(new_level, latest)

    def _set_state(self, level: PressureState, reason: str) -> None:
        """Switch to ``level`` and start counting runs afresh."""
        self._state = level
        self._reason = "" if level is PressureState.NORMAL else reason
        self._streak.clear()

    def _target_safe_capacity(self) -> int:
        """The safe capacity the current state asks for, capped at the claim limit."""
        active = self._active
        if self._state is PressureState.NORMAL:
            target = self._claim_limit
        elif self._state is PressureState.ELEVATED:
            target = max(1, active * 9 // 10)
        else:
            target = max(1, min(active - 1, active * 9 // 10))
        return min(target, self._claim_limit)

    def _update_safe_capacity(self) -> None:
        """Drop to a lower target at once; climb to a higher one by at most +1 per sample."""
        target = self._target_safe_capacity()
        if target < self._safe:
            self._safe = target
        elif target > self._safe:
            self._safe += 1

    # --- limits ----------------------------------------------------------------------------

    def set_claim_limit(self, claim_limit: int) -> LoadSnapshot:
        """Set this instance's allocated capacity (on every refresh).

        See the class docstring for how the safe capacity follows. Holders are never
        interrupted.

        Raises:
            ValueError: for a negative limit.
        """
        if claim_limit < 0:
            raise ValueError(f"claim_limit must be >= 0, got {claim_limit}")
        old = self._claim_limit
        self._claim_limit = claim_limit
        fully_recovered = self._state is PressureState.NORMAL and self._safe == old
        if self._mode == "legacy" or claim_limit < self._safe or fully_recovered:
            # legacy: safe capacity is the claim limit; lowering: applies at once; raising:
            # only a fully recovered controller jumps, otherwise the +1 ramp continues.
            self._safe = claim_limit
        # A raise may have raised the (default) heavy limit.
        self._wake_heavy_waiters()
        return self.snapshot()

    # --- admission -------------------------------------------------------------------------

    def try_start(self) -> LoadLease | None:
        """Admit one execution, or return ``None`` (the task runner then snoozes the job).

        Admits iff ``active < safe_capacity`` (adaptive) or ``active < claim_limit`` (legacy,
        observe), a heavy slot is free for the initial ``preparing`` phase, and no lease is
        queued for a heavy slot.
        """
        limit = self._safe if self._mode == "adaptive" else self._claim_limit
        if self._active >= limit:
            return None
        if self._waiters or self._heavy_in_use() >= self.heavy_limit:
            return None
        self._active += 1
        self._phase_counts[Phase.PREPARING] += 1
        return LoadLease(self)

    def _heavy_in_use(self) -> int:
        """Leases currently in heavy phases."""
        return self._phase_counts[Phase.PREPARING] + self._phase_counts[Phase.FINALIZING]

    def _can_enter_now(self, lease: LoadLease, target: Phase) -> bool:
        """True if ``lease`` may move to ``target`` without waiting."""
        if target is lease._phase or target not in HEAVY_PHASES or lease._phase in HEAVY_PHASES:
            return True
        return not self._waiters and self._heavy_in_use() < self.heavy_limit

    def _move(self, lease: LoadLease, target: Phase) -> None:
        """Move ``lease``'s bookkeeping to ``target`` (no limit checks)."""
        self._phase_counts[lease._phase] -= 1
        self._phase_counts[target] += 1
        lease._phase = target

    def _wake_heavy_waiters(self) -> None:
        """Hand free heavy slots to queued leases, first come first served.

        The handoff does the waiter's bookkeeping here, before it runs, so no other task can
        take the slot in between.
        """
        while self._waiters and self._heavy_in_use() < self.heavy_limit:
            waiter = self._waiters.popleft()
            self._move(waiter.lease, waiter.phase)
            waiter.outcome = "granted"
            waiter.event.set()


if TYPE_CHECKING:
    # The job handler is given the controller as its LoadGate (engine.tasks.gates), and each
    # LoadLease as the LoadSlot of an execution: mypy holds them to the protocols.
    _AS_LOAD_GATE: type[LoadGate] = LoadController
