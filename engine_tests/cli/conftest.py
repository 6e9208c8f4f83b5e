"""Fixtures of the command-line tests: run ``python -m engine`` on this test's database, and an
executing engine in this process for the commands that watch tasks run.

Children run with ``-W error``, without our ``ENGINE_*``, libpq or terminal-size variables, and
with an unused data directory, so a child that lost ``--database-url`` can never touch a real
embedded server. Every wait has a deadline.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
import trio

from engine.config import EngineConfig, load_config
from engine.db.bridge import Connection
from engine.db.database import DatabaseUrls
from engine.providers.simulated import SimulatedProvider
from engine.service.root import open as open_engine

DEADLINE = 30.0
MODEL = "sim-model"
#: Environment variables a child must not inherit: engine settings, libpq's, and the ones that
#: change how rich sees the terminal.
_DROPPED = ("ENGINE_", "PG", "PYTHONPATH", "COLUMNS", "LINES", "FORCE_COLOR", "NO_COLOR",
            "TTY_COMPATIBLE", "TTY_INTERACTIVE")  # fmt: skip


def child_env(data_dir: Path, **extra: str) -> dict[str, str]:
    """Our environment less :data:`_DROPPED`, with ``ENGINE_DATA_DIR`` and ``extra``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(_DROPPED)}
    env["ENGINE_DATA_DIR"] = str(data_dir)
    env.update(extra)
    return env


class Result:
    """A finished child: exit status and decoded output."""

    def __init__(self, proc: subprocess.CompletedProcess[bytes]) -> None:
        self.code = proc.returncode
        self.out = proc.stdout.decode()
        self.err = proc.stderr.decode()

    def __repr__(self) -> str:
        return f"Result(code={self.code}, out={self.out!r}, err={self.err!r})"

    def ok(self) -> str:
        """Assert exit 0 without a traceback; return stdout."""
        assert self.code == 0, self
        assert "Traceback" not in self.err, self.err
        return self.out

    def json(self) -> Any:
        """Assert exit 0 and one JSON document on stdout; return it."""
        return json.loads(self.ok())

    def error(self, code: int = 1) -> str:
        """Assert exit ``code`` without a traceback; return stderr."""
        assert self.code == code, self
        assert "Traceback" not in self.err, self.err
        return self.err


class Cli:
    """Runs ``python -m engine --database-url URL ...`` (``url`` None: the embedded server of
    the data directory)."""

    def __init__(self, db_url: str | None, data_dir: Path) -> None:
        self.db_url = db_url
        self.env = child_env(data_dir)

    def cmd(self, *args: str) -> list[str]:
        url = [] if self.db_url is None else ["--database-url", self.db_url]
        return [sys.executable, "-W", "error", "-m", "engine", *url, *args]

    async def __call__(self, *args: str, stdin: bytes | None = None) -> Result:
        with trio.fail_after(DEADLINE):
            proc = await trio.run_process(
                self.cmd(*args),
                stdin=stdin if stdin is not None else b"",
                capture_stdout=True,
                capture_stderr=True,
                check=False,
                env=self.env,
            )
        return Result(proc)


@pytest.fixture
def cli(db_url: str, tmp_path: Path) -> Cli:
    """``await cli("tasks", "list")`` runs the CLI on this test's (migrated) database."""
    return Cli(db_url, tmp_path / "unused-data-dir")


@pytest.fixture
async def model(conn: Connection) -> str:
    """An enabled, unlimited model for submissions."""
    await conn.execute("INSERT INTO engine_model (name) VALUES ($1)", MODEL)
    return MODEL


def engine_config() -> EngineConfig:
    """An executing engine for follow tests: fast polling, no migrations, registered in the
    instance registry (so ``submit --follow`` finds a live instance)."""
    return load_config(
        env={},
        overrides={
            "database.migrate_on_start": "false",
            "queue.fetch_poll_interval": "0.2",
            "queue.completer_tick": "0.01",
            "worker.stop_timeout": "2",
        },
    )


@pytest.fixture
async def executing(db_url: str, model: str) -> AsyncIterator[None]:
    """An executing engine in this process, serving every model."""
    async with open_engine(
        engine_config(), urls=DatabaseUrls.single(db_url), simulated=SimulatedProvider()
    ):
        yield


async def interrupt_when(
    cli: Cli, args: list[str], seen: Callable[[bytes], bool]
) -> tuple[int, str, str]:
    """Run ``python -m engine ARGS`` until ``seen(stdout so far)``, then SIGINT it and read the
    rest; its exit status, stdout and stderr."""
    done: list[subprocess.CompletedProcess[bytes]] = []

    async def run(*, task_status: trio.TaskStatus[trio.Process]) -> None:
        done.append(
            await trio.run_process(
                cli.cmd(*args),
                stdin=b"",
                stdout=subprocess.PIPE,
                capture_stderr=True,
                check=False,
                env=cli.env,
                task_status=task_status,
            )
        )

    out = b""
    with trio.fail_after(DEADLINE):
        async with trio.open_nursery() as nursery:
            proc: trio.Process = await nursery.start(run)
            assert proc.stdout is not None
            async with proc.stdout:
                while not seen(out):
                    chunk = await proc.stdout.receive_some()
                    assert chunk, out
                    out += chunk
                proc.send_signal(signal.SIGINT)
                while chunk := await proc.stdout.receive_some():
                    out += chunk
    (result,) = done
    return result.returncode, out.decode(), result.stderr.decode()
