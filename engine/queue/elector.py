"""Leader election: one leader per database runs maintenance.

Elect with one statement (take the row if absent or expired); the leader extends its term every
``interval`` and steps down when the extension fails or its local trust window (TTL − 1 s since
the last good extension) runs out, so two leaders never trust themselves at once. Followers try
every ``interval`` + jitter, or at once when a leader resigns (NOTIFY on the leadership channel).
On stop the leader resigns, shielded and bounded.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Awaitable, Callable

import attrs
import trio

from engine.db.bridge import RELEASE_TIMEOUT, Pool
from engine.db.sqlfiles import QUERIES
from engine.errors import DatabaseError
from engine.queue.config import QueueConfig
from engine.queue.notifier import Notifier

__all__ = ["Elector", "ElectorConfig"]

log = logging.getLogger(__name__)

_ELECT = QUERIES["leader_attempt_elect"]
_REELECT = QUERIES["leader_attempt_reelect"]
_RESIGN = QUERIES["leader_resign"]


@attrs.frozen
class ElectorConfig:
    """Who campaigns and how often; made by :meth:`from_section`."""

    leader_id: str
    interval: float
    """Seconds between attempts, plus up to 1 s jitter (``queue.leader_elect_interval``)."""
    ttl: float
    """Seconds a term lasts without renewal (``queue.leader_ttl``)."""

    @classmethod
    def from_section(cls, section: QueueConfig, *, leader_id: str) -> ElectorConfig:
        """``leader_id``'s campaign, timed by the ``[queue]`` section."""
        return cls(
            leader_id=leader_id, interval=section.leader_elect_interval, ttl=section.leader_ttl
        )


class Elector:
    """Campaigns for leadership and runs ``lead()`` while leader; see the module docstring."""

    def __init__(
        self,
        pool: Pool,
        notifier: Notifier,
        config: ElectorConfig,
        lead: Callable[[], Awaitable[None]],
    ) -> None:
        self.pool = pool
        self.notifier = notifier
        self.config = config
        self.lead = lead
        self.is_leader = False
        self.terms = 0

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Campaign until cancelled; ``started()`` after the first attempt."""
        cfg = self.config
        with self.notifier.subscribe_leadership() as resigned:
            first = True
            while True:
                elected_at = None
                try:
                    row = await self.pool.fetchrow(_ELECT, cfg.leader_id, cfg.ttl)
                    elected_at = None if row is None else row["elected_at"]
                except DatabaseError as exc:
                    log.warning(
                        "election failed", extra={"event": "elect_failed", "error": str(exc)}
                    )
                if first:
                    first = False
                    task_status.started()
                if elected_at is not None:
                    await self._hold(elected_at)
                resigned.clear()
                with trio.move_on_after(cfg.interval + random.uniform(0, 1.0)):
                    await resigned.wait()

    async def _hold(self, elected_at: object) -> None:
        cfg = self.config
        self.is_leader = True
        self.terms += 1
        log.info("elected leader", extra={"event": "leader_elected", "leader_id": cfg.leader_id})
        trusted_until = trio.current_time() + cfg.ttl - 1.0
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self.lead)
                while True:
                    await trio.sleep(cfg.interval)
                    try:
                        row = await self.pool.fetchrow(_REELECT, cfg.leader_id, cfg.ttl, elected_at)
                    except DatabaseError as exc:
                        # Keep leading through a blip, but never past the trust window.
                        log.warning(
                            "re-election failed",
                            extra={"event": "reelect_failed", "error": str(exc)},
                        )
                        if trio.current_time() < trusted_until:
                            continue
                        row = None
                    if row is None:
                        nursery.cancel_scope.cancel(reason="leadership lost")
                        break
                    trusted_until = trio.current_time() + cfg.ttl - 1.0
        finally:
            self.is_leader = False
            with trio.move_on_after(RELEASE_TIMEOUT, shield=True):
                try:
                    await self.pool.fetchrow(
                        _RESIGN, cfg.leader_id, self.notifier.channels.leadership
                    )
                except DatabaseError:
                    pass  # the term expires by itself
            log.info(
                "leadership ended", extra={"event": "leader_resigned", "leader_id": cfg.leader_id}
            )
