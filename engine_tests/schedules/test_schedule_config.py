"""Schedules in the configuration file: ``[[schedules]]`` tables, and every mistake named by
its table and field before anything starts."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from engine.config import config_problems_exit_code, load_config
from engine.domain.tasks import RunMode
from engine.errors import ConfigError
from engine.schedules.model import CatchUp, Schedule, ScheduledJob, ScheduledTask

GOOD = """
[[schedules]]
name = "nightly-report"
cron = "0 3 * * *"
timezone = "Europe/Berlin"
run_on_start = true
[schedules.task]
model = "report"
tenant_id = "ops"
payload = { kind = "daily" }
run_mode = "simulation"

[[schedules]]
name = "sweep"
every = "15m"
catch_up = "latest"
[schedules.job]
kind = "cleanup"
args = { deep = true }
queue = "maintenance"
"""

BAD = """
[[schedules]]
name = "nightly"
cron = "61 3 * * *"
[schedules.task]
model = "report"

[[schedules]]
name = "sweep"
every = "15 minutes"
catch_up = "sometimes"
colour = "red"
[schedules.job]
kind = "cleanup"

[[schedules]]
name = "both"
every = "1m"
cron = "* * * * *"
[schedules.task]
model = "report"
tenant_id = "ops"

[[schedules]]
name = "sweep"
every = 60
[schedules.job]
kind = "x"
"""


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "engine.toml"
    path.write_text(text)
    return path


def test_schedules_are_read_from_the_file(tmp_path: Path) -> None:
    config = load_config(env={}, toml_path=_write(tmp_path, GOOD))
    assert config.schedules == (
        Schedule(
            name="nightly-report",
            cron="0 3 * * *",
            timezone="Europe/Berlin",
            run_on_start=True,
            task=ScheduledTask(
                model="report",
                tenant_id="ops",
                payload={"kind": "daily"},
                run_mode=RunMode.SIMULATION,
            ),
        ),
        Schedule(
            name="sweep",
            every="15m",
            catch_up=CatchUp.LATEST,
            job=ScheduledJob(kind="cleanup", args={"deep": True}, queue="maintenance"),
        ),
    )
    assert config.schedules[0].timing.describe() == "cron 0 3 * * * (Europe/Berlin)"


def test_every_mistake_is_named_by_its_table_and_field(tmp_path: Path) -> None:
    path = _write(tmp_path, BAD)
    with pytest.raises(ConfigError) as caught:
        load_config(env={}, toml_path=path)
    problems = [p.removesuffix(f" (from {path})") for p in caught.value.problems]
    assert problems == [
        "schedules[0] (nightly).cron: cron '61 3 * * *' is not a valid cron expression: "
        "[61 3 * * *] is not acceptable, out of range",
        "schedules[0] (nightly).task.tenant_id: required",
        "schedules[1] (sweep).colour: unknown setting; a schedule takes catch_up, cron, every, "
        "job, max_catch_up, name, run_on_start, task, timezone",
        "schedules[1] (sweep).catch_up = 'sometimes': all or latest",
        "schedules[1] (sweep).every: '15 minutes' is not a duration: write seconds (900) or "
        'amounts of s, m, h and d ("15m", "1h30m", "1d")',
        "schedules[2] (both).cron/every: give exactly one of cron (a cron expression) and "
        "every (an interval)",
    ]


def test_two_schedules_with_one_name_are_refused(tmp_path: Path) -> None:
    text = GOOD + '\n[[schedules]]\nname = "sweep"\nevery = 60\n[schedules.job]\nkind = "x"\n'
    with pytest.raises(ConfigError, match=r"schedules\[2\]\.name: 'sweep' is used by another"):
        load_config(env={}, toml_path=_write(tmp_path, text))


def test_schedules_must_be_an_array_of_tables(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"schedules .*must be an array of tables"):
        load_config(env={}, toml_path=_write(tmp_path, 'schedules = "daily"\n'))


def test_the_command_line_names_a_bad_schedule_and_exits_before_starting(
    tmp_path: Path,
) -> None:
    path = _write(tmp_path, BAD)
    done = subprocess.run(
        [sys.executable, "-m", "engine", "--config", str(path), "run"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == config_problems_exit_code
    assert "schedules[0] (nightly).cron: cron '61 3 * * *' is not a valid" in done.stderr
    assert "Traceback" not in done.stderr
