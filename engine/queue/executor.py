"""Run one claimed job and turn its outcome into a completion.

| handler outcome                     | completion                                                |
|-------------------------------------|-----------------------------------------------------------|
| returns                             | completed                                                 |
| raises JobSnooze(d)                 | available if d <= 5 s, else scheduled; no attempt used    |
| raises JobCancel(reason)            | cancelled, reason recorded                                |
| raises anything else, attempts left | retryable at (errors+1)^4 s ±10 % (available if <= 5 s)   |
| raises anything else, none left     | discarded                                                 |
| cancelled by this job's remote cancel | cancelled                                               |
| cancelled by a hard stop            | available at once, attempt restored, no error (River #1290)|
| unknown kind / args that don't fit  | discarded / error, with a message saying which             |
| runs past its timeout               | error (retried or discarded as above), "job timed out"    |

Every outcome, the hard stop included, is handed to the completer with ``send_nowait`` on an
unbounded channel, so recording it can neither block nor be cancelled; the completer's write is
shielded. The two cancellation rows are recorded by the runner that owns the job's cancel scope
(:mod:`engine.queue.runners`); :func:`execute` records the rest.
"""

from __future__ import annotations

import logging
import traceback
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import attrs
import trio

from engine.queue.job import Job, JobCancel, JobSnooze
from engine.queue.retry import becomes_available_immediately, retry_backoff
from engine.queue.states import JobState
from engine.queue.workers import Workers

__all__ = ["Completion", "cancelled", "execute", "interrupted", "snoozed"]

log = logging.getLogger(__name__)


@attrs.frozen
class Completion:
    """What to write for one finished run; applied only while the row is still running."""

    job_id: int
    queue: str
    state: JobState
    delay: float | None = None
    error: dict[str, Any] | None = None
    snooze: bool = False
    restore: bool = False
    metadata: dict[str, Any] | None = None

    @property
    def plain(self) -> bool:
        """Nothing but the state to write (the completer has a cheaper statement for that)."""
        return (
            self.delay is None
            and self.error is None
            and not self.snooze
            and not self.restore
            and self.metadata is None
        )


def _error(job: Job, message: str, trace: str = "") -> dict[str, Any]:
    return {
        "at": datetime.now(UTC).isoformat(),
        "attempt": job.attempt,
        "error": message,
        "trace": trace,
    }


def _failed(job: Job, message: str, trace: str = "") -> Completion:
    err = _error(job, message, trace)
    if job.attempt >= job.max_attempts:
        return Completion(job.id, job.queue, JobState.DISCARDED, error=err)
    delay = retry_backoff(len(job.errors))
    state = JobState.AVAILABLE if becomes_available_immediately(delay) else JobState.RETRYABLE
    return Completion(job.id, job.queue, state, delay=delay, error=err)


def snoozed(job: Job, seconds: float) -> Completion:
    """The completion for a snooze: no attempt used."""
    state = JobState.AVAILABLE if becomes_available_immediately(seconds) else JobState.SCHEDULED
    return Completion(job.id, job.queue, state, delay=seconds, snooze=True)


def cancelled(job: Job) -> Completion:
    """The completion of a job stopped by its own (remote) cancel."""
    return Completion(job.id, job.queue, JobState.CANCELLED, error=_error(job, "job cancelled"))


def interrupted(job: Job) -> Completion:
    """The completion of a job cut short by a hard stop: available at once, its attempt
    restored and no error recorded, so another worker takes it without it counting as a
    failure (River #1290)."""
    return Completion(job.id, job.queue, JobState.AVAILABLE, delay=0.0, restore=True)


async def execute(
    job: Job,
    workers: Workers,
    record: Callable[[Completion], None],
    *,
    default_timeout: float | None = None,
) -> None:
    """Run ``job``'s handler and ``record`` its completion; see the module table.

    An interruption (``trio.Cancelled``, possibly inside a group from the handler's nursery, or
    any other ``BaseException``) is not recorded here: it propagates, and the caller, which
    owns the cancel scope, knows whether it was this job's cancel (:func:`cancelled`) or a
    hard stop (:func:`interrupted`). The handler's deadline is its worker's ``timeout``, else
    ``default_timeout`` (River: the worker's ``Timeout()``, else the client's ``JobTimeout``);
    None means no deadline.
    """
    worker = workers.get(job.kind)
    if worker is None:
        record(
            Completion(
                job.id,
                job.queue,
                JobState.DISCARDED,
                error=_error(job, f"no worker is registered for job kind {job.kind!r}"),
            )
        )
        return
    try:
        args = worker.structure(job.args)
    except Exception as exc:  # cattrs raises ClassValidationError and friends
        record(_failed(job, f"job args do not fit {worker.args_type.__name__}: {exc!r}"))
        return
    timeout = default_timeout if worker.timeout is None else worker.timeout
    try:
        if timeout is None:
            await worker.handler(job, args)
        else:
            with trio.move_on_after(timeout) as timer:
                await worker.handler(job, args)
            if timer.cancelled_caught:
                record(_failed(job, f"job timed out after {timeout} s"))
                return
        record(Completion(job.id, job.queue, JobState.COMPLETED))
    except JobSnooze as snooze:
        record(snoozed(job, snooze.seconds))
    except JobCancel as cancel:
        record(Completion(job.id, job.queue, JobState.CANCELLED, error=_error(job, cancel.reason)))
    except Exception as exc:
        log.warning(
            "job failed",
            extra={"event": "job_failed", "job_id": job.id, "kind": job.kind, "error": repr(exc)},
        )
        record(_failed(job, repr(exc), traceback.format_exc()))
