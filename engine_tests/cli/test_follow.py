"""``submit --follow`` as users see it: in a pseudo-terminal (one line redrawn in place, never
wider than the terminal), through a pipe (plain lines), interrupted (exit 130), and warning
when nothing will run the tasks.

The terminal tests run the child in a pty of 80 and 60 columns and replay its output as a
terminal would (:class:`~engine_tests.cli.terminal.Screen`): after the carriage returns and
erase-line sequences, what remains is the ``submitted`` line and the summary, no line ever went
past the width, and nothing but the ``submitted`` line's newline came before the summary (the
bar never scrolled).
"""

from __future__ import annotations

import re

import pytest
import trio

from engine.capacity.registry import Registration, register_instance
from engine.cli.submit import Progress, TaskIds, follow_tasks
from engine.db.database import Database

from .conftest import DEADLINE, MODEL, Cli, interrupt_when
from .terminal import Screen, run_in_pty

SUMMARY = re.compile(r"^(\d+) tasks?: (.+) \((?:interrupted after )?\d+\.\d s\)$")


@pytest.mark.slow
@pytest.mark.parametrize("columns", [80, 60])
async def test_on_a_terminal_the_progress_is_one_line_that_fits(
    cli: Cli, executing: None, columns: int
) -> None:
    cmd = cli.cmd("submit", "--model", MODEL, "--count", "40", "--follow")
    result = await trio.to_thread.run_sync(
        lambda: run_in_pty(cmd, cli.env, columns=columns, timeout=DEADLINE)
    )
    assert result.code == 0, result
    assert "Traceback" not in result.err and "warning" not in result.err, result.err
    screen = Screen(columns).feed(result.raw)
    assert screen.wrapped == 0, result.raw
    lines = screen.visible()
    # The `submitted` line, wrapped between words to the width, then the summary: the bar is
    # gone.
    submitted = " ".join(lines[:-1])
    assert re.fullmatch(
        r"submitted 40 tasks \(model sim-model, simulation\): first \S+, last \S+", submitted
    ), (lines, result.raw)
    match = SUMMARY.match(lines[-1])
    assert match is not None and match.group(2) == "40 succeeded", lines
    # The bar was drawn (rate and ETA columns) and redrawn in place: no newline from its first
    # frame to its last; rich then writes one and moves back up over the bar to erase it.
    assert "ETA" in result.raw and "/40" in result.raw, result.raw
    bar = result.raw[result.raw.index("\x1b[?25l") : result.raw.rindex("\x1b[?25h")]
    assert bar.count("\r") >= 2 and bar.count("\n") == 1 and bar.endswith("\n"), result.raw
    after_bar = result.raw[result.raw.rindex("\x1b[?25h") : result.raw.rindex(lines[-1])]
    assert "\n" not in after_bar and "\x1b[1A" in after_bar, after_bar
    for frame in re.split(r"[\r\n]", bar):
        assert len(re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", frame)) <= columns, frame


@pytest.mark.slow
async def test_interrupted_on_a_terminal_exits_130_and_says_so(cli: Cli, model: str) -> None:
    # Nothing executes: the tasks stay queued until SIGINT stops the follow.
    cmd = cli.cmd("submit", "--model", model, "--count", "3", "--follow")
    result = await trio.to_thread.run_sync(
        lambda: run_in_pty(
            cmd, cli.env, columns=70, timeout=DEADLINE, interrupt_when=lambda out: "ETA" in out
        )
    )
    assert result.code == 130, result
    lines = Screen(70).feed(result.raw).visible()
    assert lines[-1].startswith("3 tasks: 3 queued (interrupted after "), lines
    assert "engine: interrupted; the tasks go on" in result.err
    # No instance is registered at all: warned once, followed anyway.
    assert result.err.count("engine: warning: no live engine instance is registered") == 1


@pytest.mark.slow
async def test_through_a_pipe_the_progress_is_plain_lines(cli: Cli, executing: None) -> None:
    result = await cli("submit", "--model", MODEL, "--count", "20", "--follow")
    out = result.ok()
    assert "\r" not in out and "\x1b" not in out
    lines = out.splitlines()
    assert lines[0].startswith("submitted 20 tasks (model sim-model, simulation)")
    assert all(re.fullmatch(r"\d+/20 final: .+ \(\d+\.\d s\)", x) for x in lines[1:-1]), lines
    match = SUMMARY.match(lines[-1])
    assert match is not None and match.group(2) == "20 succeeded", lines
    assert "warning" not in result.err  # the executing engine is registered and live


async def _follow_until(cli: Cli, text: str, *args: str) -> tuple[int, str, str]:
    """Run ``submit ... --follow`` until ``text`` is on its stdout, then SIGINT it."""
    return await interrupt_when(
        cli, ["submit", "--follow", *args], lambda out: text.encode() in out
    )


@pytest.mark.slow
async def test_live_tasks_no_live_instance_serves_warn_once_and_follow_on(
    cli: Cli, model: str, database: Database
) -> None:
    # A live instance that serves another model only (it runs no task: this test's tasks stay
    # queued, and SIGINT ends each follow).
    await register_instance(
        database.coordination,
        Registration(
            instance_id="elsewhere:1:2",
            desired_capacity=4,
            heartbeat_stale_after=30.0,
            models=["flux"],
        ),
    )
    code, out, err = await _follow_until(
        cli, "0/2 final: 2 queued", "--model", model, "--live", "--count", "2"
    )
    assert code == 130, (out, err)
    assert err.count(f"engine: warning: no live engine instance serves model '{model}'") == 1
    assert out.splitlines()[-1].startswith("2 tasks: 2 queued (interrupted after ")
    # Simulation tasks: any live instance runs them, so no warning.
    code, out, err = await _follow_until(cli, "0/1 final: 1 queued", "--model", model)
    assert code == 130 and "warning" not in err, (out, err)


async def test_running_tasks_show_how_far_their_providers_got(database: Database) -> None:
    """Providers' progress reports move the follow line: running tasks show their average
    progress, read with the counts."""
    rows = await database.tasks.fetch(
        """
        INSERT INTO engine_task (id, model, tenant_id, user_id, run_mode, payload, status,
                                 progress, finished_at)
        SELECT gen_random_uuid(), 'm', 't', 'u', 'simulation', '{}', s, p,
               CASE WHEN s = 'succeeded' THEN now() END
        FROM (VALUES ('running', 0.2::real), ('running', 0.6::real), ('succeeded', 1.0::real))
             AS v(s, p)
        RETURNING id
        """
    )
    progress = Progress(total=3)
    shown: list[str] = []

    class Display:
        def update(self, seen: Progress) -> None:
            shown.append(", ".join(seen.parts([], live=True)))
            raise _Stop

    class Engine:
        db = database

    ids = TaskIds(r["id"] for r in rows)
    with pytest.raises(_Stop):
        await follow_tasks(
            Engine(),  # type: ignore[arg-type]  # follow reads only engine.db
            ids,
            progress,
            Display(),  # type: ignore[arg-type]
            started=trio.current_time(),
        )
    assert shown == ["2 running at 40%, 1 succeeded"]
    # The closing summary is counts only.
    assert progress.parts([]) == ["2 running", "1 succeeded"]


class _Stop(Exception):
    pass
