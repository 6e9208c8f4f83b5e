"""``answer_despite_a_stop``: a stop gives a call in flight its grace, whether the call waits or
answers at once, and the call's own cancel scopes and errors pass through unchanged."""

from __future__ import annotations

import pytest
import trio

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


async def test_the_calls_own_scopes_and_errors_pass_through() -> None:
    async def own_timeout() -> str:
        with trio.move_on_after(0.01):
            await trio.sleep(30)
        await trio.lowlevel.checkpoint()
        raise ValueError("the call's own error")

    with pytest.raises(ValueError, match="own error"):
        await answer_despite_a_stop(own_timeout, 1.0)
