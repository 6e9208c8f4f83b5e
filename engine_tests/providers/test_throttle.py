"""UpstreamThrottle: a busy answer holds the model back; one probe goes first after a hold."""

from __future__ import annotations

import random

import trio
import trio.testing

from engine.providers.throttle import UpstreamThrottle


async def test_nothing_waits_without_a_hold() -> None:
    throttle = UpstreamThrottle()
    start = trio.current_time()
    async with throttle.submission("m") as entry:
        assert not entry.probe
    assert trio.current_time() - start < 0.5  # no wait


async def test_after_a_hold_one_probe_goes_first_and_its_answer_decides(
    autojump_clock: trio.testing.MockClock,
) -> None:
    throttle = UpstreamThrottle(jitter=0.0, rng=random.Random(1))
    throttle.hold("m", 1.0)
    start = trio.current_time()
    through: list[tuple[int, float, bool]] = []
    probe_busy = [True, False]  # the first probe is refused again, the second is taken

    async def submitter(n: int) -> None:
        async with throttle.submission("m") as entry:
            through.append((n, trio.current_time() - start, entry.probe))
            await trio.sleep(0.1)  # the upstream call
            if entry.probe and probe_busy.pop(0):
                entry.busy(1.0)

    async with trio.open_nursery() as nursery:
        for n in range(3):
            nursery.start_soon(submitter, n)
    probes = [(at, n) for n, at, probe in through if probe]
    others = sorted(at for _, at, probe in through if not probe)
    assert [round(at, 3) for at, _ in probes] == [1.0, 2.1]  # the second after the new hold
    assert len(others) == 1 and others[0] >= 2.2  # let through only once a probe was taken
    assert throttle.remaining("m") == 0.0


async def test_another_model_is_not_held_back() -> None:
    throttle = UpstreamThrottle()
    throttle.hold("busy", 60.0)
    with trio.fail_after(1):
        async with throttle.submission("other") as entry:
            assert not entry.probe
    assert throttle.remaining("busy") > 59
