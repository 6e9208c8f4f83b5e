"""``python -m engine --help`` and usage errors answer at once: they import no heavy module.

What is imported is checked, not how long it takes: the child prints ``sys.modules`` as argparse
exits (a wrapper runs the CLI under ``runpy``, as ``python -m engine`` does).
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

import engine
from engine.cli.args import JOB_STATES, TASK_STATUSES
from engine.domain.tasks import TaskStatus
from engine.queue.states import JobState

#: What a command line that only parses must not load.
HEAVY = ("trio", "asyncpg", "trio_asyncio", "prometheus_client", "cattrs", "attrs", "rich",
         "engine.config", "engine.db.bridge")  # fmt: skip

_WRAPPER = """
import atexit, json, runpy, sys
atexit.register(lambda: print("MODULES=" + json.dumps(sorted(sys.modules)), file=sys.stderr))
sys.argv = ["engine", *sys.argv[1:]]
runpy.run_module("engine", run_name="__main__", alter_sys=True)
"""


def _modules(*args: str) -> tuple[int, set[str], str]:
    done = subprocess.run(
        [sys.executable, "-c", _WRAPPER, *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    line = next(x for x in done.stderr.splitlines() if x.startswith("MODULES="))
    return done.returncode, set(json.loads(line.removeprefix("MODULES="))), done.stdout


@pytest.mark.parametrize(
    "args",
    [
        ["--help"],
        ["status", "--help"],
        ["submit", "--help"],
        ["tasks", "list", "--bogus"],
        ["models", "set", "m", "--rate", "-1/1"],
        ["submit", "--model", "m", "--count", "2000000"],
    ],
    ids=["help", "status-help", "submit-help", "bad-option", "bad-rate", "count-cap"],
)
def test_parsing_imports_no_heavy_module(args: list[str]) -> None:
    code, modules, _out = _modules(*args)
    assert code in (0, 2)
    loaded = sorted(m for m in modules for h in HEAVY if m == h or m.startswith(h + "."))
    assert not loaded, f"{args} imported {loaded}"


def test_the_wrapper_sees_a_command_that_runs_import_them() -> None:
    """The check can fail: a command that runs (here one that fails at once, on a data
    directory that does not exist) loads the configuration and trio."""
    code, modules, _ = _modules("--data-dir", "/nonexistent/engine-test-x", "status")
    assert code == 2
    assert {"engine.config", "trio"} <= modules


def test_help_lists_the_new_commands_and_options() -> None:
    out = _modules("--help")[2]
    assert "--json" in out and "-v, --verbose" in out
    out = _modules("models", "--help")[2]
    assert "delete" in out


def test_the_parsers_choices_are_the_enums() -> None:
    assert tuple(s.value for s in TaskStatus) == TASK_STATUSES
    assert sorted(JOB_STATES) == sorted(s.value for s in JobState)


def test_import_engine_is_lazy_but_every_public_name_resolves() -> None:
    code = (
        "import sys, engine\n"
        "assert 'trio' not in sys.modules and 'engine.config' not in sys.modules\n"
        "from engine import Engine, open, TaskRequest\n"
        "assert engine.Engine is Engine and engine.open is open\n"
        "print(sorted(n for n in engine.__all__ if getattr(engine, n) is None))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout.strip() == "[]", done
    for name in engine.__all__:
        assert getattr(engine, name) is not None, name
    assert set(engine.__all__) <= set(dir(engine))
    with pytest.raises(AttributeError):
        engine.no_such_name  # noqa: B018


def test_the_usage_status_is_the_configurations() -> None:
    from engine.cli.exits import EXIT_USAGE
    from engine.config import config_problems_exit_code

    assert config_problems_exit_code == EXIT_USAGE
