"""Holding back a model's submissions while its upstream says it is busy (429, 503).

When a submission is answered with :class:`~engine.providers.base.UpstreamBusy`, the runner
reports it (:meth:`Submission.busy`) with the upstream's ``Retry-After``, and every run of that
model in this process then waits in :meth:`UpstreamThrottle.submission` *before* it records
that it is about to submit, so a run stopped while it waits goes back to the queue cleanly.

When the hold ends, one submission goes first (the probe) and the others wait for its answer:
if the upstream takes it, they all go; if it is busy again, a new hold starts. So a storm of
429s costs about one refused request per ``Retry-After`` instead of one per waiting task, and
the model's throughput follows what the upstream accepts. Waiters wake spread over a short
window (jitter) so they do not arrive all at once. Holds are per process and in memory.
"""

from __future__ import annotations

import random
from types import TracebackType

import trio

__all__ = ["Submission", "UpstreamThrottle"]


class _ModelState:
    """One model's hold: until when nobody submits, and whether a probe must go first."""

    def __init__(self) -> None:
        self.until = float("-inf")
        self.length = 0.0
        #: True from a busy answer until a submission is taken again.
        self.recovering = False
        self.probing = False
        self.changed = trio.Event()

    def notify(self) -> None:
        self.changed.set()
        self.changed = trio.Event()


class Submission:
    """One submission let through by :meth:`UpstreamThrottle.submission`; say how it went."""

    def __init__(self, throttle: UpstreamThrottle, model: str, probe: bool) -> None:
        self._throttle = throttle
        self._model = model
        #: True when this submission is the one sent first after a hold.
        self.probe = probe
        self._busy = False

    def busy(self, seconds: float) -> None:
        """The upstream answered busy: hold the model back for ``seconds`` from now."""
        self._busy = True
        self._throttle.hold(self._model, seconds)


class UpstreamThrottle:
    """Per-model holds on submissions (see the module docstring).

    Args:
        jitter: the share of a hold (0.1 = up to 10 %, at most ``max_jitter`` seconds) over which
            waiters' wake-ups are spread.
        max_jitter: the most seconds a wake-up is delayed past the hold.
        rng: the random source of the jitter (seeded in tests).
    """

    def __init__(
        self, *, jitter: float = 0.1, max_jitter: float = 1.0, rng: random.Random | None = None
    ) -> None:
        self.jitter = jitter
        self.max_jitter = max_jitter
        self._rng = rng or random.Random()
        self._models: dict[str, _ModelState] = {}

    def hold(self, model: str, seconds: float) -> None:
        """Hold back the model's submissions for ``seconds`` from now (a longer hold already in
        place is kept); once it ends, a probe goes first."""
        state = self._models.setdefault(model, _ModelState())
        until = trio.current_time() + max(0.0, seconds)
        if until > state.until:
            state.until, state.length = until, max(0.0, seconds)
        state.recovering = True
        state.notify()

    def remaining(self, model: str) -> float:
        """Seconds the model's current hold still lasts (0 when there is none)."""
        state = self._models.get(model)
        if state is None:
            return 0.0
        return max(0.0, state.until - trio.current_time())

    def submission(self, model: str) -> _Passage:
        """``async with`` it: wait until the model may submit, then let one submission through
        (no wait, and no schedule point, when nothing holds it back: the write recording the
        submission comes next and waits anyway). Report a busy answer with
        :meth:`Submission.busy` inside."""
        return _Passage(self, model)

    def _passed(self, model: str, entry: Submission) -> None:
        """A submission let through has ended, however it went."""
        state = self._models.get(model)
        if entry.probe and state is not None:
            state.probing = False
            if not entry._busy:
                # Not busy (taken, or ended for another reason): the hold is over for
                # everyone; another busy answer starts a new one.
                state.recovering = False
            state.notify()
        if (
            state is not None
            and not state.recovering
            and not state.probing
            and state.until <= trio.current_time()
        ):
            del self._models[model]

    async def _wait(self, model: str) -> bool:
        while True:
            state = self._models.get(model)
            if state is None or not state.recovering:
                await trio.lowlevel.checkpoint_if_cancelled()
                return False
            left = state.until - trio.current_time()
            if left > 0:
                spread = min(self.max_jitter, state.length * self.jitter)
                await trio.sleep(left + self._rng.uniform(0.0, spread))
                continue
            if not state.probing:
                state.probing = True
                await trio.lowlevel.checkpoint()
                return True
            await state.changed.wait()


class _Passage:
    """:meth:`UpstreamThrottle.submission`'s context (a class rather than a generator: it is
    entered once per submission)."""

    __slots__ = ("_entry", "_model", "_throttle")

    def __init__(self, throttle: UpstreamThrottle, model: str) -> None:
        self._throttle = throttle
        self._model = model
        self._entry: Submission | None = None

    async def __aenter__(self) -> Submission:
        probe = await self._throttle._wait(self._model)
        self._entry = Submission(self._throttle, self._model, probe)
        return self._entry

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._entry is not None:
            self._throttle._passed(self._model, self._entry)
