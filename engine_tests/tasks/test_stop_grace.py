"""``answer_despite_a_stop``: a stop gives a call in flight its grace, whether the call waits or
answers at once, and the call's own cancel scopes and errors pass through unchanged; with a
nursery given for the watcher, as without."""

from __future__ import annotations

import pytest
import trio
import trio.testing

from engine.tasks.upstream import answer_despite_a_stop


async def _answer_after(seconds: float) -> str:
    await trio.sleep(seconds)
    return "answer"


async def test_an_answer_at_once_needs_no_wait() -> None:
    async def at_once() -> str:
        return "answer"

    assert await answer_despite_a_stop(at_once, 1.0) == ("answer", False)


async def test_an_answer_at_once_under_a_stop_is_kept_and_the_stop_stays() -> None:
    async def at_once() -> str:
        return "answer"

    with trio.CancelScope() as stop:
        stop.cancel()
        got = await answer_despite_a_stop(at_once, 1.0)
        assert got == ("answer", False)
        # Level-triggered: the caller meets the stop at its next checkpoint.
        await trio.lowlevel.checkpoint()
        pytest.fail("the stop was lost")
    assert stop.cancelled_caught


async def test_a_stop_before_a_waiting_call_gives_it_the_grace() -> None:
    with trio.CancelScope() as stop:
        stop.cancel()
        got = await answer_despite_a_stop(lambda: _answer_after(0.05), 5.0)
    assert got == ("answer", False)


async def test_a_stop_mid_call_cuts_it_off_after_the_grace() -> None:
    started = trio.current_time()
    async with trio.open_nursery() as nursery:
        stop = trio.CancelScope()
        got: list[tuple[str | None, bool]] = []

        async def run() -> None:
            with stop:
                got.append(await answer_despite_a_stop(lambda: _answer_after(30), 0.2))

        nursery.start_soon(run)
        await trio.sleep(0.05)
        stop.cancel()
    assert got == [(None, True)]
    assert trio.current_time() - started < 5


async def test_a_slow_call_without_a_stop_is_waited_for() -> None:
    assert await answer_despite_a_stop(lambda: _answer_after(0.3), 0.05) == ("answer", False)


@pytest.mark.parametrize("with_nursery", [False, True])
async def test_the_calls_own_scopes_and_errors_pass_through(with_nursery: bool) -> None:
    async def own_timeout() -> str:
        with trio.move_on_after(0.01):
            await trio.sleep(30)
        await trio.lowlevel.checkpoint()
        raise ValueError("the call's own error")

    async with trio.open_nursery() as stops:
        with pytest.raises(ValueError, match="own error"):
            await answer_despite_a_stop(own_timeout, 1.0, stops if with_nursery else None)


# With a nursery for the watcher (a job's: the generation's work nursery), a stop is a cancel of
# that nursery or from above it, or the deadline of a scope around the call.


async def test_with_a_nursery_an_answer_at_once_starts_no_watcher() -> None:
    async def at_once() -> str:
        return "answer"

    async with trio.open_nursery() as stops:
        assert await answer_despite_a_stop(at_once, 1.0, stops) == ("answer", False)
        assert not stops.child_tasks


async def test_with_a_nursery_the_watcher_ends_with_the_call() -> None:
    async with trio.open_nursery() as stops:
        got = await answer_despite_a_stop(lambda: _answer_after(0.05), 1.0, stops)
        assert got == ("answer", False)
        with trio.fail_after(5):
            while stops.child_tasks:
                await trio.sleep(0.01)


@pytest.mark.parametrize("answer_after", [0.1, 30.0])
async def test_a_cancel_of_the_nursery_is_a_stop(answer_after: float) -> None:
    """An answer within the grace of the stop is kept; none within it is cut off."""
    got: list[tuple[str | None, bool]] = []
    started = trio.current_time()
    async with trio.open_nursery() as outer, trio.open_nursery() as stops:

        async def run() -> None:
            got.append(await answer_despite_a_stop(lambda: _answer_after(answer_after), 0.3, stops))

        outer.start_soon(run)
        await trio.testing.wait_all_tasks_blocked()
        stops.cancel_scope.cancel()  # the stop: the generation's hard stop
    assert got == ([("answer", False)] if answer_after < 0.3 else [(None, True)])
    assert trio.current_time() - started < 5


@pytest.mark.parametrize(
    ("answer_after", "expected"), [(0.2, ("answer", False)), (30.0, (None, True))]
)
async def test_an_enclosing_deadline_is_a_stop_known_up_front(
    answer_after: float, expected: tuple[str | None, bool]
) -> None:
    """A job's timeout: the call has until the deadline plus the grace."""
    started = trio.current_time()
    async with trio.open_nursery() as stops:
        with trio.move_on_after(0.05):
            got = await answer_despite_a_stop(lambda: _answer_after(answer_after), 0.3, stops)
    assert got == expected
    assert trio.current_time() - started < 0.05 + 0.3 + 2


async def test_a_stop_already_come_gives_the_grace_from_now() -> None:
    async with trio.open_nursery() as stops:
        with trio.CancelScope() as stop:
            stop.cancel()
            got = await answer_despite_a_stop(lambda: _answer_after(0.05), 5.0, stops)
    assert got == ("answer", False)


async def test_a_cancel_between_the_nursery_and_the_call_waits_for_the_answer() -> None:
    """Only the nursery's cancel (or one from above it) is a stop: a scope of the job's own
    that is cancelled while the call waits lets the call answer, and is met afterwards."""
    async with trio.open_nursery() as stops:
        with trio.CancelScope() as own:
            got: list[tuple[str | None, bool]] = []

            async def cancel_soon() -> None:
                await trio.sleep(0.05)
                own.cancel()

            stops.start_soon(cancel_soon)
            got.append(await answer_despite_a_stop(lambda: _answer_after(0.3), 0.01, stops))
            await trio.lowlevel.checkpoint()
            pytest.fail("the cancel was lost")
    assert got == [("answer", False)]
    assert own.cancelled_caught
