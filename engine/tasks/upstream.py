"""The provider calls of one execution: prepare, the submission (again after a refusal, or
after an ambiguous answer when the provider submits idempotently), the wait upstream (polls,
and the callbacks recorded for the task), finalize; and a stop's grace for a submission under
way, so that a shutdown does not turn a request in flight into an ambiguous one.

Rows 5, 7, 7a and 7b and the provider's own exceptions of the decision table
(:mod:`engine.tasks.runner`) are decided here.
"""

from __future__ import annotations

import logging
import random
import types
import uuid
from collections.abc import Awaitable, Callable, Generator
from typing import Any, NoReturn, TypeVar

import trio

from engine.domain.tasks import Task, TaskPhase, TaskStatus
from engine.errors import EngineError, LeaseUnavailable, ManualReview
from engine.providers.base import (
    AmbiguousSubmission,
    NotSubmitted,
    PollResult,
    Provider,
    ProviderError,
    UpstreamBusy,
    callback_poll_interval,
    submits_idempotently,
)
from engine.providers.context import TaskContext
from engine.providers.throttle import UpstreamThrottle
from engine.queue.runners import work_nursery
from engine.tasks.fenced import FencedWrites
from engine.tasks.gates import LoadSlot, Phase
from engine.tasks.leases import Execution
from engine.tasks.observe import QUIET, TaskObserver
from engine.tasks.store import EventWriter, TaskStore

__all__ = ["ProviderCrash", "UpstreamCalls", "answer_despite_a_stop", "provider_call"]

#: The runner's log lines keep the one logger name they have always had.
log = logging.getLogger("engine.tasks.runner")

_T = TypeVar("_T")


class ProviderCrash(Exception):
    """A provider method raised an exception of its own (not a ProviderError or an
    AmbiguousSubmission, which are its answers, nor an engine error, which keeps its path)."""

    def __init__(self, phase: str, original: Exception) -> None:
        super().__init__(f"{type(original).__name__} in {phase}: {original}")
        self.phase = phase
        self.original = original

    def error(self, code: str = "provider_exception", note: str = "") -> dict[str, Any]:
        """The task's ``error``: what was raised, and by which provider method."""
        text = str(self.original)
        message = f"{type(self.original).__name__} in {self.phase}" + (f": {text}" if text else "")
        return {
            "code": code,
            "message": message + note,
            "type": type(self.original).__name__,
            "phase": self.phase,
        }


async def answer_despite_a_stop(
    call: Callable[[], Awaitable[_T]],
    grace: float,
    stops: trio.Nursery | None = None,
    *,
    shield: trio.CancelScope | None = None,
) -> tuple[_T | None, bool]:
    """Await ``call()`` shielded from a stop (a cancellation from outside): once one arrives,
    the call gets ``grace`` more seconds to answer. Returns (its result, False), or (None,
    True) when the stop cut it off. Without a stop the call takes as long as it takes (its
    own timeouts bound it): a slow answer is not a stop.

    The stop's cancellation is level-triggered: a caller that goes on after a result (to record
    it) meets it again at its next unshielded checkpoint.

    A watcher task turns a stop into the grace's deadline. It starts only once the call first
    waits (:func:`_watched`): a call that answers at once, without waiting on anything, cannot
    be cut off by a stop (a cancellation is delivered only where a task waits), so it needs no
    watcher, and the zero-latency path does not pay for a task it never uses.

    ``stops`` is where the watcher runs: a nursery outside the caller's own scopes that a stop
    cancels (a job's: :func:`engine.queue.runners.work_nursery`). Then a stop is a cancel of
    that nursery or from above it, or the deadline of any scope around the call, known up front
    (the call has until that deadline plus the grace); a cancel of a scope between the nursery
    and the call is not one, and waits for the answer. This path opens no nursery of its own,
    whose exit would cost every call a pass of the scheduler. Without ``stops`` the watcher
    runs in a nursery opened around the call, and sees every stop.

    ``shield`` is the shielding scope to run the call in (a new one if None): one that the
    caller may cancel itself, e.g. for a cancel of its own that must reach the call. Cut off
    that way, the call also returns (None, True).
    """
    if shield is None:
        shield = trio.CancelScope(shield=True)
    if stops is None:
        return await _answer_in_own_nursery(call, grace, shield)
    # An enclosing scope's deadline (a job's timeout) is a stop known in advance; -inf, a
    # scope already cancelled, is a stop now.
    stop_at = max(trio.current_effective_deadline(), trio.current_time())
    shield.deadline = min(shield.deadline, stop_at + grace)
    watch: trio.CancelScope | None = None

    def start_watch() -> None:
        nonlocal watch
        watch = trio.CancelScope()
        stops.start_soon(_watch_for_a_stop, watch, shield, grace)

    with shield:
        try:
            return await _watched(call(), start_watch), False
        finally:
            if watch is not None:
                watch.cancel()  # the call is over: nothing to watch for any more
    return None, True


async def _watch_for_a_stop(
    watch: trio.CancelScope, shield: trio.CancelScope, grace: float
) -> None:
    """Sleep in the stop's nursery until ``watch`` is cancelled (the call is over) or a stop
    cancels the nursery; a stop gives the call under ``shield`` ``grace`` more seconds."""
    with watch:
        try:
            await trio.sleep_forever()
        finally:
            if not watch.cancel_called:
                shield.deadline = min(shield.deadline, trio.current_time() + grace)


async def _answer_in_own_nursery(
    call: Callable[[], Awaitable[_T]], grace: float, shield: trio.CancelScope
) -> tuple[_T | None, bool]:
    """:func:`answer_despite_a_stop` without a nursery given: one opened here, around the
    call, is the stops' nursery, so that every stop cancels it."""
    answer: list[tuple[_T | None, bool]] = []
    error: list[Exception] = []
    try:
        async with trio.open_nursery() as stops:
            try:
                answer.append(await answer_despite_a_stop(call, grace, stops, shield=shield))
            except Exception as exc:  # raised below, as itself rather than in a group
                error.append(exc)
    except BaseException as exc:
        only_cancelled = isinstance(exc, trio.Cancelled) or (
            isinstance(exc, BaseExceptionGroup) and exc.split(trio.Cancelled)[1] is None
        )
        if not only_cancelled:
            raise
        # Only the stop's cancellation, seen by the watcher: the call's outcome comes first.
    if error:
        raise error[0]
    return answer[0]


@types.coroutine
def _watched(
    awaitable: Awaitable[_T], before_first_wait: Callable[[], None]
) -> Generator[Any, Any, _T]:
    """Await ``awaitable`` (as ``await`` does: every value it yields to trio is passed on, and
    trio's answer passed back), calling ``before_first_wait()`` just before it first waits,
    i.e. before its first yield reaches trio. Nothing runs in between, so the first wait is
    watched exactly as if the watcher had started before the call."""
    coro: Generator[Any, Any, _T] = awaitable.__await__()
    value: Any = None
    failure: BaseException | None = None
    waiting = False
    while True:
        try:
            trap = coro.send(value) if failure is None else coro.throw(failure)
        except StopIteration as done:
            answer: _T = done.value
            return answer
        if not waiting:
            waiting = True
            before_first_wait()
        try:
            value, failure = (yield trap), None
        except GeneratorExit:
            coro.close()
            raise
        except BaseException as exc:  # trio delivers a cancellation (or an error) by throwing
            value, failure = None, exc


async def provider_call(phase: str, call: Callable[..., Awaitable[_T]], *args: Any) -> _T:
    """Await ``call(*args)``, a provider method, naming ``phase`` on an exception of its own."""
    try:
        return await call(*args)
    except NotSubmitted as exc:
        if phase == "submit":  # an answer of submit; from any other method, its own error
            raise
        raise ProviderCrash(phase, exc) from exc
    except (EngineError, ProviderError, AmbiguousSubmission):
        raise
    except Exception as exc:
        raise ProviderCrash(phase, exc) from exc


def _backoff(first: float, n: int) -> float:
    """Seconds before the ``n``-th new submission: ``first`` doubling, at most 30 s, plus up
    to 50 % jitter so runs held back together do not come back together."""
    base = min(30.0, first * 2.0 ** (n - 1))
    return base * (1.0 + random.random() * 0.5)


class UpstreamCalls(FencedWrites):
    """An execution's provider calls, with the settings that bound them: a base of
    :class:`engine.tasks.runner.TaskRunner`."""

    def __init__(
        self,
        store: TaskStore,
        events: EventWriter,
        *,
        instance_id: str,
        observer: TaskObserver = QUIET,
    ) -> None:
        super().__init__(store, events, instance_id=instance_id, observer=observer)
        #: Seconds a stop waits for an upstream submission already under way to answer.
        self.submit_grace = 10.0
        #: Seconds a run keeps submitting again after NotSubmitted / UpstreamBusy answers (the
        #: request never reached the upstream) before the task fails ``upstream_unavailable``.
        self.submit_patience = 600.0
        #: How many times a run submits again, with the same idempotency key, after an
        #: ambiguous answer from a provider that submits idempotently; then manual review.
        self.ambiguous_resubmits = 3
        #: First backoff in seconds between those submissions (doubled each time, capped at
        #: 30 s, with up to 50 % jitter).
        self.resubmit_backoff = 0.5
        #: Models whose upstream answered "busy" (429, 503): their submissions wait here.
        self.upstream_busy = UpstreamThrottle()
        #: Where this process serves ``POST /hooks/<task id>`` (``http://host:port``), or None
        #: when it serves no hooks: then providers' callbacks are not waited for, and every
        #: model polls at its ``poll_interval``.
        self.hooks_base_url: str | None = None

    async def _run_provider(
        self,
        task: Task,
        token: uuid.UUID,
        lease: LoadSlot | None,
        execution: Execution,
        context: TaskContext,
    ) -> None:
        """Prepare and submit the task (or resume waiting on its recorded upstream job), wait
        for the upstream's answer, finalize it, and record the outcome: succeeded, or failed
        on the provider's refusal or the upstream's failure (row 5)."""
        provider = execution.provider
        assert provider is not None  # set by _execute
        ref: str | None = task.upstream_ref
        resumed = ref is not None
        phase_started = trio.current_time()
        try:
            if ref is None:
                prepared = await provider_call("prepare", provider.prepare, task)
                phase_started = self._phase_done("preparing", phase_started, task.model)
                context.phase = TaskPhase.WAITING_UPSTREAM
                ref = await self._submit(task, token, lease, execution, provider, prepared)
                # The prepared request (a provider's may be large: an upload, a long prompt) is
                # not kept for the wait upstream, which lasts minutes.
                del prepared
                execution.upstream_ref = ref
                # The upstream reference lives only in this process until it is written: a database
                # blip here must not turn a known submission into a lost one.
                upstream = ref
                if not await self._durably(
                    "record_upstream",
                    lambda: self.store.record_upstream(task.id, token, upstream),
                ):
                    raise LeaseUnavailable()
                self.emit(
                    task,
                    "task.submitted",
                    status="running",
                    phase="waiting_upstream",
                    progress=0.4,
                    payload={"upstream_ref": ref},
                )
            else:
                execution.upstream_ref = ref
                context.phase = TaskPhase.WAITING_UPSTREAM
                await self._enter(lease, Phase.WAITING_UPSTREAM)
                self.emit(
                    task,
                    "task.resumed",
                    status="running",
                    phase="waiting_upstream",
                    payload={"upstream_ref": ref},
                )
            polled = await self._wait_upstream(task, ref, provider, execution, context, resumed)
            phase_started = self._phase_done("waiting_upstream", phase_started, task.model)
            if polled.error is not None:
                raise ProviderError(polled.error, code="upstream_failed")
            context.phase = TaskPhase.FINALIZING
            await self._enter(lease, Phase.FINALIZING)
            # Informational, so buffered with the events rather than awaited (fenced: a write
            # that lands after the finish changes nothing).
            self.events.set_phase(task.id, token, TaskPhase.FINALIZING, 0.9)
            result = await provider_call("finalize", provider.finalize, task, polled.result)
            self._phase_done("finalizing", phase_started, task.model)
        except ProviderError as exc:
            await self._finish(
                task, token, TaskStatus.FAILED, error={"code": exc.code, "message": str(exc)}
            )
            return
        await self._finish(task, token, TaskStatus.SUCCEEDED, result=result)

    async def _wait_upstream(
        self,
        task: Task,
        ref: str,
        provider: Provider,
        execution: Execution,
        context: TaskContext,
        resumed: bool,
    ) -> PollResult:
        """Poll until the upstream says done, or a recorded callback does.

        A provider whose upstream calls back (``callback_poll_interval``), in a process that
        serves the hooks, is polled only every ``callback_poll_interval`` seconds (first after
        that long, or at once for a resumed run, whose callback may have come while nobody
        ran it): a lost callback never strands the task. Meanwhile the run sleeps until its
        next poll or until the callback's NOTIFY wakes it, and reads the callbacks recorded
        for the task. Whichever answers first, the outcome goes through the same fenced
        finish. Progress in a callback that is not final is reported as the provider's (a
        poll's progress is the provider's to report, with ``current_task_context()``).
        """
        fallback = callback_poll_interval(provider) if self.hooks_base_url is not None else None
        interval = provider.poll_interval if fallback is None else fallback
        now = trio.current_time()
        next_poll = now if fallback is None or resumed else now + interval
        while True:
            if fallback is not None:
                stored = await self.store.latest_callback(task.id)
                # A callback about another upstream job (an earlier submission's) says nothing.
                if stored is not None and stored.upstream_id in (None, ref):
                    if stored.result.done:
                        return stored.result
                    if stored.result.progress is not None:
                        context.report_progress(stored.result.progress)
            if trio.current_time() >= next_poll:
                polled = await provider_call("poll", provider.poll, task, ref)
                if polled.done:
                    return polled
                next_poll = trio.current_time() + interval
            await execution.sleep_until(next_poll)

    async def _submit(
        self,
        task: Task,
        token: uuid.UUID,
        lease: LoadSlot | None,
        execution: Execution,
        provider: Provider,
        prepared: Any,
    ) -> str:
        """Make the upstream call and return the upstream's reference.

        ``submitted_at`` is recorded before each call. ``NotSubmitted`` (nothing reached the
        upstream) submits again after its ``retry_after`` or a backoff, for up to
        ``submit_patience`` seconds, then fails the task (``upstream_unavailable``);
        ``UpstreamBusy`` also holds back every submission of the model in this process for
        that long (``upstream_busy``). An ambiguous answer (``AmbiguousSubmission``, or the
        provider's own exception) sends the task to manual review, unless the provider submits
        idempotently: then it is submitted again, with the same key, up to
        ``ambiguous_resubmits`` times first (never while the run is being stopped).
        """
        patience_ends = trio.current_time() + self.submit_patience
        keyed = submits_idempotently(provider)  # recorded with each call: see task_requeue_many
        refusals = resubmits = 0
        while True:
            await self._enter(lease, Phase.WAITING_UPSTREAM)
            pause = 0.0
            # Entered before submitted_at is written: a run stopped while the model is held
            # back goes back to the queue as if it had never tried.
            async with self.upstream_busy.submission(task.model) as gate:
                if not await self._durably(
                    "mark_submitting",
                    lambda: self.store.mark_submitting(task.id, token, idempotently=keyed),
                ):
                    raise LeaseUnavailable()
                stopping = False
                try:
                    # A stop that arrives mid-call waits for the answer (bounded): cut off
                    # here, the submission would be ambiguous and the task would need a human.
                    # A user's cancel still interrupts it (the execution's cancel reaches its
                    # shield).
                    try:
                        ref, cut_off = await answer_despite_a_stop(
                            lambda: provider_call("submit", provider.submit, task, prepared),
                            self.submit_grace,
                            work_nursery(),
                            shield=execution.shield(),
                        )
                    finally:
                        execution.unshield()
                    if cut_off and not execution.scope.cancel_called:
                        stopping = True
                        raise AmbiguousSubmission(
                            f"no answer from the upstream within {self.submit_grace} s of a stop"
                        )
                    if ref is None:
                        # The user's cancel cut the call short: deliver it (the execution
                        # scope is cancelled, so this checkpoint raises).
                        await trio.lowlevel.checkpoint()
                        raise AmbiguousSubmission("the upstream call was cut short")
                    return ref
                except NotSubmitted as refused:
                    # Nothing reached the upstream: say so, so that a requeue or a recovery
                    # before the next call does not take the task for an ambiguous one.
                    if not await self._durably(
                        "unmark_submitting",
                        lambda: self.store.unmark_submitting(task.id, token),
                    ):
                        raise LeaseUnavailable() from refused
                    refusals += 1
                    busy = isinstance(refused, UpstreamBusy)
                    delay = refused.retry_after
                    if delay is None:
                        delay = _backoff(self.resubmit_backoff, refusals)
                    if trio.current_time() + delay > patience_ends:
                        raise ProviderError(
                            f"the upstream did not take the request for "
                            f"{self.submit_patience:g} s: {refused}",
                            code="upstream_unavailable",
                        ) from refused
                    if busy:
                        gate.busy(delay)  # the next submission waits for the hold
                    else:
                        pause = delay
                    self.emit(
                        task,
                        "task.not_submitted",
                        status="running",
                        phase="waiting_upstream",
                        message=str(refused),
                        payload={"busy": busy, "delay": delay, "refusals": refusals},
                    )
                except (AmbiguousSubmission, ProviderCrash) as exc:
                    if (
                        stopping
                        or resubmits >= self.ambiguous_resubmits
                        or not submits_idempotently(provider)
                    ):
                        await self._manual_review_after_submit(task, token, exc)
                    # The upstream recognises the repeat by its idempotency key: the second
                    # call returns the job of the first if it had been accepted.
                    resubmits += 1
                    pause = _backoff(self.resubmit_backoff, resubmits)
                    self.emit(
                        task,
                        "task.resubmitting",
                        status="running",
                        phase="waiting_upstream",
                        message=str(exc),
                        payload={"resubmits": resubmits, "delay": pause},
                    )
                    log.info(
                        "ambiguous submission; submitting again with the same idempotency key",
                        extra={
                            "event": "task_resubmitting",
                            "task_id": str(task.id),
                            "resubmits": resubmits,
                        },
                    )
            await trio.sleep(pause)  # outside the gate: a probe's wait holds nobody else

    async def _manual_review_after_submit(
        self, task: Task, token: uuid.UUID, exc: AmbiguousSubmission | ProviderCrash
    ) -> NoReturn:
        """Record an ambiguous submission: manual review (row 7)."""
        if isinstance(exc, ProviderCrash):
            # Not a refusal (that is a ProviderError): the call may have reached the upstream
            # before it raised, e.g. while reading the answer. submitted_at is recorded, so
            # this is the ambiguous case, as if the answer were lost: manual review, never a
            # resubmission and never "failed" (which would say nothing runs upstream).
            error = exc.error("ambiguous_submission", " (the upstream may have received it)")
        else:
            error = {"code": "ambiguous_submission", "message": str(exc)}
        await self._finish(task, token, TaskStatus.MANUAL_REVIEW, error=error)
        raise ManualReview() from exc

    def _phase_done(self, phase: str, started: float, model: str) -> float:
        now = trio.current_time()
        self.observer.phase_done(phase, now - started, model)
        return now

    async def _enter(self, lease: LoadSlot | None, phase: Phase) -> None:
        if lease is None:
            return
        # Most moves need no wait: then no schedule point either (the write after it waits).
        try:
            lease.enter_nowait(phase)
        except trio.WouldBlock:
            await lease.enter(phase)
