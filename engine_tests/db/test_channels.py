"""Every channel name lives in engine.db.channels: SQL's literals are among them, and no Python
module spells one out."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from engine.db import channels

ROOT = Path(__file__).resolve().parents[2]

# SQL comments: a channel named in prose is not a channel used.
_COMMENT = re.compile(r"--[^\n]*|/\*.*?\*/", re.DOTALL)
# The first argument of pg_notify, up to its comma.
_PG_NOTIFY = re.compile(r"\bpg_notify\s*\(\s*([^,)]*)", re.IGNORECASE)
# NOTIFY / LISTEN / UNLISTEN statements and the channel they name.
_STATEMENT = re.compile(
    r"\b(?:NOTIFY|LISTEN|UNLISTEN)\s+(\"[^\"]+\"|[A-Za-z_][\w.$]*)", re.IGNORECASE
)
# A bind parameter: the channel comes from Python, which imports it from engine.db.channels.
_PARAMETER = re.compile(r"\$\d+(::text)?")  # a parameter, perhaps cast to text


def sql_channel_problems(text: str) -> list[str]:
    """Why the channels ``text`` (SQL) NOTIFYs or LISTENs on are not all known names; empty
    when they are. ``pg_notify``'s channel must be a bind parameter or a literal known name
    (an expression could be anything)."""
    code = _COMMENT.sub("", text)
    problems = []
    for match in _PG_NOTIFY.finditer(code):
        argument = match.group(1).strip()
        if _PARAMETER.fullmatch(argument):
            continue
        literal = re.fullmatch(r"'([^']*)'", argument)
        if literal is None:
            problems.append(f"pg_notify's channel is neither a literal nor a parameter: {argument}")
        elif not channels.is_known_channel(literal.group(1)):
            problems.append(f"pg_notify on an unknown channel: {literal.group(1)!r}")
    for match in _STATEMENT.finditer(code):
        name = match.group(1).strip('"')
        if not channels.is_known_channel(name):
            problems.append(f"{match.group(0).split()[0]} on an unknown channel: {name!r}")
    return problems


def test_every_channel_in_sql_is_named_in_the_channels_module() -> None:
    files = sorted((ROOT / "sql").rglob("*.sql"))
    assert files
    problems = [
        f"{path.relative_to(ROOT)}: {problem}"
        for path in files
        for problem in sql_channel_problems(path.read_text())
    ]
    assert problems == []


def test_the_sql_literals_are_found() -> None:
    """The scan sees the triggers' literals (a scan that finds nothing proves nothing)."""
    text = "\n".join(p.read_text() for p in sorted((ROOT / "sql").rglob("*.sql")))
    literals = {
        m.group(1).strip().strip("'")
        for m in _PG_NOTIFY.finditer(_COMMENT.sub("", text))
        if not _PARAMETER.fullmatch(m.group(1).strip())
    }
    assert literals == {channels.TASK_FINISHED, channels.TASK_CALLBACK, channels.ADMISSION}


@pytest.mark.parametrize(
    ("sql", "problem"),
    [
        ("PERFORM pg_notify('engine_task_finishd', NEW.id::text);", "'engine_task_finishd'"),
        ("SELECT pg_notify( 'made_up' , '')", "'made_up'"),
        ("SELECT PG_NOTIFY('river_insert', '')", "'river_insert'"),  # River's need a schema
        ("SELECT pg_notify('engine_' || kind, '')", "neither a literal nor a parameter"),
        ("NOTIFY made_up, 'x';", "NOTIFY on an unknown channel: 'made_up'"),
        ('LISTEN "made.up";', "LISTEN on an unknown channel: 'made.up'"),
    ],
)
def test_the_checker_rejects_a_made_up_channel(sql: str, problem: str) -> None:
    [found] = sql_channel_problems(sql)
    assert problem in found


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT pg_notify($12, payload) FROM unnest($13::text[]) AS payload",
        "PERFORM pg_notify('engine_admission', '');",
        "SELECT pg_notify('public.river_control', '{}')",
        'NOTIFY "engine_catalog";',
        "LISTEN engine_task_cancel",
        "-- told through NOTIFY $2, or pg_notify('not_a_channel', '') in prose\nSELECT 1",
        "CREATE TRIGGER engine_task_finished_notify AFTER UPDATE ON engine_task",
    ],
)
def test_the_checker_accepts_known_channels_parameters_and_prose(sql: str) -> None:
    assert sql_channel_problems(sql) == []


def test_river_names_are_qualified_by_the_schema() -> None:
    river = channels.RiverChannels.for_schema("jobs")
    assert river.all == ("jobs.river_insert", "jobs.river_control", "jobs.river_leadership")
    assert set(channels.every_channel(river)) == {*river.all, *channels.ENGINE_CHANNELS}
    assert all(channels.is_known_channel(name) for name in channels.every_channel(river))
    assert not channels.is_known_channel("river_insert")
    assert not channels.is_known_channel(".river_insert")
    assert not channels.is_known_channel("jobs.engine_catalog")


def _names_spelled_out(path: Path) -> list[str]:
    """String constants of ``path`` that are a channel name (docstrings and prose are not)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    return [
        node.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and (channels.is_known_channel(node.value) or node.value in channels.RIVER_NAMES)
    ]


def test_python_takes_every_channel_name_from_the_channels_module() -> None:
    own = ROOT / "engine" / "db" / "channels.py"
    found = {
        str(path.relative_to(ROOT)): names
        for folder in ("engine", "examples")
        for path in sorted((ROOT / folder).rglob("*.py"))
        if path != own and (names := _names_spelled_out(path))
    }
    assert found == {}
    assert _names_spelled_out(own)  # the check sees a spelled-out name where there is one
