"""The log lines: a failed reconnect of asyncpg's pool is one line, not a traceback."""

from __future__ import annotations

import io
import logging
from collections.abc import Iterator

import pytest

from engine.logs import configure_logging


@pytest.fixture
def captured() -> Iterator[io.StringIO]:
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    stream = io.StringIO()
    configure_logging("kv", "INFO", stream=stream)
    yield stream
    root.handlers[:] = handlers
    root.setLevel(level)


def test_a_failed_reconnect_of_the_pool_is_one_line(captured: io.StringIO) -> None:
    try:
        raise ConnectionRefusedError(111, "Connect call failed ('127.0.0.1', 5432)")
    except OSError:
        logging.getLogger("asyncpg.pool").warning(
            "Failed to restore the pool connection floor; retrying", exc_info=True
        )
    (line,) = captured.getvalue().splitlines()
    assert "Traceback" not in line
    assert "error=\"ConnectionRefusedError: [Errno 111] Connect call failed" in line
    assert "Failed to restore the pool connection floor" in line


def test_other_tracebacks_are_kept(captured: io.StringIO) -> None:
    try:
        raise KeyError("boom")
    except KeyError:
        logging.getLogger("engine.tasks.runner").error("task failed", exc_info=True)
    assert "Traceback" in captured.getvalue()
