"""``status --watch``: read and shown again every interval until Ctrl-C (exit 130)."""

from __future__ import annotations

import json

import trio

from .conftest import DEADLINE, Cli, interrupt_when
from .terminal import Screen, run_in_pty


async def _watch_until(cli: Cli, lines: int, *args: str) -> tuple[int, list[str]]:
    """Run ``status --watch ...`` until it printed ``lines`` lines, then SIGINT it."""
    code, out, err = await interrupt_when(
        cli, ["status", "--watch", *args], lambda seen: seen.count(b"\n") >= lines
    )
    assert "Traceback" not in err, err
    return code, out.splitlines()


async def test_watch_json_prints_one_document_a_line(cli: Cli) -> None:
    code, lines = await _watch_until(cli, 3, "0.1", "--json")
    assert code == 130
    docs = [json.loads(line) for line in lines[:3]]
    assert all(set(d) >= {"capacity", "tasks", "queues"} for d in docs)


async def test_watch_through_a_pipe_prints_the_status_again(cli: Cli) -> None:
    code, lines = await _watch_until(cli, 12, "0.1")
    assert code == 130
    heads = [x for x in lines if x.startswith("at ")]
    assert len(heads) >= 2 and sum(x.startswith("capacity: ") for x in lines) >= 2, lines


async def test_watch_on_a_terminal_redraws_in_place(cli: Cli) -> None:
    cmd = cli.cmd("status", "--watch", "0.1")
    result = await trio.to_thread.run_sync(
        lambda: run_in_pty(
            cmd,
            cli.env,
            columns=80,
            rows=40,
            timeout=DEADLINE,
            interrupt_when=lambda out: out.count("capacity: ") >= 3,
        )
    )
    assert result.code == 130, result
    screen = Screen(80).feed(result.raw)
    assert screen.wrapped == 0
    # Redrawn, not appended: the screen shows the status once.
    assert sum(x.startswith("capacity: ") for x in screen.visible()) == 1, screen.visible()
