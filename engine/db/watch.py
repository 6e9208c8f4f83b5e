"""Keep the embedded server up: a watcher that notices it stopped under the engine (killed, a
full disk, a crash), says why from the tail of its log, and starts it again with backoff.

The pools reconnect by themselves once it answers (it comes back on its port), and the task
runs ride the outage out (their writes are retried while their leases hold).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

import trio

from engine import embedded
from engine.errors import EmbeddedPostgresError

__all__ = ["watch_embedded"]

log = logging.getLogger(__name__)

#: Seconds between two looks at the server (a pg_ctl status and a connect probe).
CHECK_INTERVAL = 5.0
_BACKOFF_MAX = 60.0


async def watch_embedded(
    data_dir: Path,
    *,
    on_state: Callable[[bool], None] | None = None,
    interval: float = CHECK_INTERVAL,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Watch the server in ``data_dir`` until cancelled; ``on_state(up)`` after each look."""
    task_status.started()
    delay = interval
    while True:
        await trio.sleep(delay)
        try:
            revived = await trio.to_thread.run_sync(embedded.revive, data_dir)
        except EmbeddedPostgresError as exc:
            log.error(
                "the embedded PostgreSQL server is down and did not start again; retrying",
                extra={"event": "embedded_server_down", "data_dir": str(data_dir),
                       "error": str(exc), "retry_in": min(delay * 2, _BACKOFF_MAX)},
            )  # fmt: skip
            if on_state is not None:
                on_state(False)
            delay = min(delay * 2, _BACKOFF_MAX)
            continue
        if revived is not None:
            port, why = revived
            log.error(
                "the embedded PostgreSQL server had stopped; started it again",
                extra={"event": "embedded_server_restarted", "data_dir": str(data_dir),
                       "port": port, "server_log": why},
            )  # fmt: skip
        if on_state is not None:
            on_state(True)
        delay = interval
