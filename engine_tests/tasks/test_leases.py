"""An execution's sleep between polls: it ends at its deadline, at a wake (also one that came
before it), or at a cancel; one timer serves every sleeping execution of the run."""

from __future__ import annotations

import uuid

import trio
import trio.testing

from engine.tasks.leases import Execution


def _execution() -> Execution:
    return Execution(uuid.uuid4(), uuid.uuid4())


async def test_sleepers_wake_at_their_own_deadlines_in_order(
    autojump_clock: trio.testing.MockClock,
) -> None:
    start = trio.current_time()
    woke: list[tuple[int, float]] = []

    async def sleep(n: int, seconds: float) -> None:
        await _execution().sleep_until(start + seconds)
        woke.append((n, round(trio.current_time() - start, 6)))

    async with trio.open_nursery() as nursery:
        # Later deadlines first: each earlier one must pull the timer forward.
        for n, seconds in enumerate([5.0, 3.0, 1.0, 3.0, 0.5]):
            nursery.start_soon(sleep, n, seconds)
    # trio may run tasks woken together in either order: only the times are ordered.
    assert sorted(woke, key=lambda w: (w[1], w[0])) == [
        (4, 0.5),
        (2, 1.0),
        (1, 3.0),
        (3, 3.0),
        (0, 5.0),
    ]


async def test_a_wake_ends_the_sleep_at_once_and_is_consumed(
    autojump_clock: trio.testing.MockClock,
) -> None:
    execution = _execution()
    start = trio.current_time()
    async with trio.open_nursery() as nursery:

        async def wake_later() -> None:
            await trio.sleep(2)
            execution.wake()

        nursery.start_soon(wake_later)
        await execution.sleep_until(start + 60)
        assert round(trio.current_time() - start, 6) == 2
        assert not execution.woken
    # The alarm of the sleep a wake ended does not end the next sleep early.
    await execution.sleep_until(start + 100)
    assert round(trio.current_time() - start, 6) == 100


async def test_a_wake_before_the_sleep_ends_it_at_once(
    autojump_clock: trio.testing.MockClock,
) -> None:
    execution = _execution()
    execution.wake()
    assert execution.woken
    start = trio.current_time()
    await execution.sleep_until(start + 60)
    assert trio.current_time() == start
    assert not execution.woken
    await execution.sleep_until(start + 1)  # consumed: this one sleeps
    assert round(trio.current_time() - start, 6) == 1


async def test_a_cancelled_sleep_raises_and_its_alarm_wakes_nothing(
    autojump_clock: trio.testing.MockClock,
) -> None:
    execution = _execution()
    start = trio.current_time()
    with trio.move_on_after(1) as scope:
        await execution.sleep_until(start + 5)
    assert scope.cancelled_caught
    assert round(trio.current_time() - start, 6) == 1
    # The first sleep's alarm (at 5 s) passes while this one sleeps to 8 s.
    await execution.sleep_until(start + 8)
    assert round(trio.current_time() - start, 6) == 8


async def test_a_past_deadline_is_a_checkpoint() -> None:
    execution = _execution()
    with trio.CancelScope() as scope:
        scope.cancel()
        try:
            await execution.sleep_until(trio.current_time() - 1)
        except trio.Cancelled:
            raised = True
        else:
            raised = False
    assert raised
