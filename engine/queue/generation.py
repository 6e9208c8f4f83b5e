"""A generation: one execution client, its producers and its running jobs, as one scope.

River's ``fetchCtx``/``workCtx`` pair becomes two nested trio scopes::

    work nursery (runner tasks, one job each at a time)   <- stop_and_cancel() cancels this
    └── fetch nursery (one producer per queue)   <- stop() cancels this

``stop()`` stops fetching and lets running jobs finish (a drain); ``stop_and_cancel()`` also
cancels them, and each records its outcome (requeued at once, attempt restored) before
:meth:`Generation.run` returns. The generation's clone of the completer channel closes when its
last job is done, which is how the completer knows when to make its final flush.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable, Iterable, Mapping

import attrs
import trio

from engine.db.bridge import Pool
from engine.queue.collector import tuned_collector
from engine.queue.completer import Completer
from engine.queue.config import MAX_WORKERS, QueueConfig
from engine.queue.job import Job
from engine.queue.notifier import Notifier
from engine.queue.observe import QUIET, QueueObserver
from engine.queue.producer import Producer, ProducerConfig, normalize_args_filter
from engine.queue.runners import Runners
from engine.queue.slots import SlotPool
from engine.queue.workers import Workers

__all__ = ["MAX_WORKERS", "Generation", "GenerationConfig"]

log = logging.getLogger(__name__)

_numbers = itertools.count(1)


@attrs.frozen
class GenerationConfig:
    """What one generation runs: ``queues`` maps queue name to ``max_workers``.

    Made by :meth:`from_section`: its timing comes from the ``[queue]`` section, the one home
    of those defaults.
    """

    client_id: str
    queues: Mapping[str, int]
    cooldown: float
    """``queue.fetch_cooldown``."""
    poll_interval: float
    """``queue.fetch_poll_interval``."""
    claim_timeout: float
    """``queue.hot_operation_timeout``."""
    job_timeout: float | None
    """Deadline of a job whose worker has no timeout of its own; None means none
    (``queue.job_timeout``)."""
    gc_tuning: bool
    """Tune the garbage collector while the generation runs (``queue.gc_tuning``)."""
    args_filter: tuple[str, tuple[str, ...]] | None = attrs.field(
        default=None, converter=normalize_args_filter
    )
    """``(key, values)``: every producer of the generation claims only jobs whose args lack
    ``key`` (or hold null there) or hold one of ``values``; None claims every job (see
    :mod:`engine.queue.producer`)."""

    @classmethod
    def from_section(
        cls,
        section: QueueConfig,
        *,
        client_id: str,
        queues: Mapping[str, int],
        args_filter: tuple[str, Iterable[str]] | None = None,
    ) -> GenerationConfig:
        """The generation of ``queues`` for ``client_id``, timed by the ``[queue]`` section."""
        return cls(
            client_id=client_id,
            queues=dict(queues),
            cooldown=section.fetch_cooldown,
            poll_interval=section.fetch_poll_interval,
            claim_timeout=section.hot_operation_timeout,
            job_timeout=section.job_timeout,
            gc_tuning=section.gc_tuning,
            args_filter=args_filter,
        )


class Generation:
    """One execution client; run it with ``await nursery.start(generation.run)``."""

    def __init__(
        self,
        config: GenerationConfig,
        *,
        pool: Pool,
        workers: Workers,
        notifier: Notifier,
        completer: Completer,
        slots: SlotPool,
        cancel_scopes: dict[int, trio.CancelScope],
        observer: QueueObserver = QUIET,
        on_stopped: Callable[[Generation], None] | None = None,
    ) -> None:
        for queue, max_workers in config.queues.items():
            if not 1 <= max_workers <= MAX_WORKERS:
                raise ValueError(f"max_workers for queue {queue!r} must be 1..{MAX_WORKERS}")
        self.number = next(_numbers)
        self.config = config
        self.pool = pool
        self.workers = workers
        self.notifier = notifier
        self.completer = completer
        self.slots = slots
        self.cancel_scopes = cancel_scopes
        #: Told of every claim of this generation's producers.
        self.observer = observer
        #: Called with this generation once it has ended (the client stops listing it).
        self.on_stopped = on_stopped
        self.producers: list[Producer] = []
        self._fetch_scope: trio.CancelScope | None = None
        self._work_scope: trio.CancelScope | None = None
        self._pending_stop: tuple[bool, str] | None = None
        #: Set once no producer of this generation fetches any more (claims in flight at the
        #: stop have returned and their jobs started).
        self.fetching_stopped = trio.Event()
        #: Set once the generation has ended: fetching stopped and every job recorded.
        self.stopped = trio.Event()

    @property
    def running(self) -> int:
        """Slots this generation holds: running jobs, plus those reserved by a claim in flight."""
        return sum(p.running for p in self.producers)

    def stop(self, reason: str = "stop") -> None:
        """Stop fetching; running jobs finish normally. Idempotent."""
        if self._fetch_scope is None:
            self._pending_stop = (False, reason)
            return
        self._fetch_scope.cancel(reason=reason)

    def stop_and_cancel(self, reason: str = "stop and cancel") -> None:
        """Stop fetching and cancel running jobs; each still records its outcome."""
        if self._work_scope is None:
            self._pending_stop = (True, reason)
            return
        self._fetch_scope.cancel(reason=reason) if self._fetch_scope else None
        self._work_scope.cancel(reason=reason)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Run until stopped; ``started()`` once every producer is fetching.

        Returns when fetching has stopped and every job of this generation has recorded its
        outcome with the completer.
        """
        sender = self.completer.sender()
        record = self.completer.record_with(sender)
        try:
            with tuned_collector(self.config.gc_tuning):
                async with trio.open_nursery() as work:
                    self._work_scope = work.cancel_scope
                    runners = Runners(
                        work,
                        self.workers,
                        record,
                        self.cancel_scopes,
                        default_timeout=self.config.job_timeout,
                    )
                    async with trio.open_nursery() as fetch:
                        self._fetch_scope = fetch.cancel_scope
                        for queue, max_workers in self.config.queues.items():
                            await fetch.start(self._run_producer, queue, max_workers, runners)
                        log.info(
                            "generation started",
                            extra={
                                "event": "generation_started",
                                "generation": self.number,
                                "client_id": self.config.client_id,
                                "queues": dict(self.config.queues),
                                "args_filter": self.config.args_filter,
                            },
                        )
                        task_status.started()
                        if self._pending_stop is not None:
                            hard, reason = self._pending_stop
                            (self.stop_and_cancel if hard else self.stop)(reason)
                    self.fetching_stopped.set()
                    runners.close()
        finally:
            with trio.CancelScope(shield=True):
                await sender.aclose()
            self.fetching_stopped.set()
            self.stopped.set()
            if self.on_stopped is not None:
                self.on_stopped(self)
            log.info(
                "generation stopped",
                extra={"event": "generation_stopped", "generation": self.number},
            )

    async def _run_producer(
        self,
        queue: str,
        max_workers: int,
        runners: Runners,
        *,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        with self.notifier.subscribe_queue(queue) as wakeup:
            producer: Producer
            finished: Callable[[], None]

            def start_job(job: Job) -> None:
                # One bound method for every job, not one more object per running job.
                runners.start(job, finished)

            producer = Producer(
                ProducerConfig(
                    queue=queue,
                    max_workers=max_workers,
                    client_id=self.config.client_id,
                    cooldown=self.config.cooldown,
                    poll_interval=self.config.poll_interval,
                    claim_timeout=self.config.claim_timeout,
                    args_filter=self.config.args_filter,
                ),
                self.pool,
                wakeup,
                self.slots,
                start_job,
                self.completer,
                observer=self.observer,
            )
            finished = producer.job_finished
            self.producers.append(producer)
            await producer.run(task_status=task_status)
