"""The client commands as users run them: ``--json`` placement, deletes, ``tasks list`` paging
and its error column, payloads from files and stdin, batched submission, rounding, quiet logs,
rich tables that keep user data inert, and the database rules (never create a cluster, never
migrate on a read-only command)."""

from __future__ import annotations

import contextlib
import functools
import json
import re
import uuid
from pathlib import Path

import pytest
import trio

from engine.cli.render import Col, make_console, print_out, table
from engine.db.bridge import Connection, connect
from engine.db.resolve import scratch_database

from .conftest import DEADLINE, MODEL, Cli, child_env
from .terminal import Screen, run_in_pty

# ---------------------------------------------------------------------------------------------
# --json before or after the command


async def test_json_before_or_after_the_command_is_the_same(cli: Cli, model: str) -> None:
    (await cli("submit", "--model", model, "--count", "2")).ok()
    for command in (["status"], ["tasks", "list"], ["models", "list"], ["jobs", "list"]):
        after = (await cli(*command, "--json")).json()
        before = (await cli("--json", *command)).json()
        if command == ["status"]:  # ages move between two reads
            for doc in (after, before):
                for instance in doc["instances"]:
                    instance.pop("heartbeat_age")
        assert before == after, command
    err = (await cli("--json", "migrate")).error(2)
    assert "--json: `migrate` has no JSON output" in err


# ---------------------------------------------------------------------------------------------
# models delete, groups delete


async def test_models_delete_refuses_while_tasks_are_unfinished(
    cli: Cli, model: str, conn: Connection
) -> None:
    (await cli("models", "set", "typo-model")).ok()
    assert (await cli("models", "delete", "typo-model")).ok().strip() == "model typo-model deleted"
    assert await conn.fetchval("SELECT count(*) FROM engine_model WHERE name = 'typo-model'") == 0
    err = (await cli("models", "delete", "typo-model")).error(1)
    assert "no model named 'typo-model'" in err

    (task_id,) = (await cli("submit", "--model", model, "--json")).json()["ids"]
    err = (await cli("models", "delete", model)).error(1)
    assert f"model '{model}' is not deleted: 1 queued or running task uses it" in err
    assert await conn.fetchval("SELECT count(*) FROM engine_model WHERE name = $1", model) == 1
    (await cli("tasks", "cancel", task_id)).ok()
    doc = (await cli("models", "delete", model, "--json")).json()
    assert doc["deleted"] is True and doc["model"]["name"] == model
    err = (await cli("submit", "--model", model)).error(1)
    assert f"unknown model '{model}'" in err


async def test_groups_delete_refuses_while_tasks_are_unfinished(
    cli: Cli, model: str, conn: Connection
) -> None:
    (await cli("groups", "set", "team-a", "--limit", "2")).ok()
    (task_id,) = (await cli("submit", "--model", model, "--json")).json()["ids"]
    await conn.execute(
        "UPDATE engine_task SET group_key = 'team-a' WHERE id = $1", uuid.UUID(task_id)
    )
    err = (await cli("groups", "delete", "team-a")).error(1)
    assert "group 'team-a' is not deleted: 1 queued or running task uses it" in err
    (await cli("tasks", "cancel", task_id)).ok()
    assert (await cli("groups", "delete", "team-a")).ok().strip() == "group team-a deleted"
    assert (await cli("groups", "list", "--json")).json()["groups"] == []
    assert "no group named 'nope'" in (await cli("groups", "delete", "nope")).error(1)


# ---------------------------------------------------------------------------------------------
# tasks list


async def test_tasks_list_by_tenant_pages_with_before_and_shows_errors(
    cli: Cli, model: str, conn: Connection
) -> None:
    ids_a = await cli("submit", "--model", model, "--count", "5", "--tenant", "a", "--json")
    ids_b = await cli("submit", "--model", model, "--count", "2", "--tenant", "b", "--json")
    a = ids_a.json()["ids"]
    b = ids_b.json()["ids"]
    listed = (await cli("tasks", "list", "--tenant", "b", "--json")).json()["tasks"]
    assert sorted(t["id"] for t in listed) == sorted(b)
    # Pages of two through tenant a's five tasks: each page starts after the last one.
    seen: list[str] = []
    out = (await cli("tasks", "list", "--tenant", "a", "--limit", "2")).ok()
    while True:
        page = re.findall(r"^([0-9a-f-]{36})\s", out, re.MULTILINE)
        seen += page
        more = re.search(r"the next page: tasks list --before (\S+)$", out, re.MULTILINE)
        if more is None:
            break
        assert more.group(1) == page[-1]
        out = (
            await cli("tasks", "list", "--tenant", "a", "--limit", "2", "--before", page[-1])
        ).ok()
    assert sorted(seen) == sorted(a) and len(seen) == 5
    # The JSON pages agree with the table's order (newest first, ties by id).
    first = (await cli("tasks", "list", "--tenant", "a", "--limit", "3", "--json")).json()
    rest = (
        await cli("tasks", "list", "--tenant", "a", "--json", "--before", first["tasks"][-1]["id"])
    ).json()
    assert [t["id"] for t in first["tasks"] + rest["tasks"]] == seen
    # A timestamp: nothing was created before 2000.
    assert (await cli("tasks", "list", "--before", "2000-01-01T00:00:00Z", "--json")).json() == {
        "tasks": []
    }
    unknown = str(uuid.uuid4())
    assert f"no task {unknown}" in (await cli("tasks", "list", "--before", unknown)).error(1)

    await conn.execute(
        "UPDATE engine_task SET status = 'failed', finished_at = now(),"
        ' error = \'{"code": "upstream_error", "message": "the GPU caught fire"}\''
        " WHERE id = $1",
        uuid.UUID(b[0]),
    )
    table_out = (await cli("tasks", "list", "--tenant", "b")).ok()
    header = table_out.splitlines()[0]
    assert "TENANT" in header and header.rstrip().endswith("ERROR")
    row = next(x for x in table_out.splitlines() if x.startswith(b[0]))
    assert re.search(r"\sfailed\s.*\sb\s.*upstream_error: the GPU caught fire$", row), row


async def test_progress_is_rounded(cli: Cli, model: str, conn: Connection) -> None:
    (task_id,) = (await cli("submit", "--model", model, "--json")).json()["ids"]
    await conn.execute("UPDATE engine_task SET progress = 0.1 WHERE id = $1", uuid.UUID(task_id))
    await conn.execute(
        "UPDATE engine_task_event SET progress = 0.7 WHERE task_id = $1", uuid.UUID(task_id)
    )
    assert (
        await conn.fetchval(
            "SELECT progress::float8 FROM engine_task WHERE id = $1", uuid.UUID(task_id)
        )
        != 0.1
    )  # a real: the test would see 0.10000000149011612 unrounded
    shown = (await cli("tasks", "show", task_id, "--json")).json()
    assert shown["task"]["progress"] == 0.1 and shown["events"][0]["progress"] == 0.7
    assert (await cli("tasks", "list", "--json")).json()["tasks"][0]["progress"] == 0.1
    human = (await cli("tasks", "show", task_id)).ok()
    assert re.search(r"^progress:\s+10%$", human, re.MULTILINE), human


# ---------------------------------------------------------------------------------------------
# submit


async def test_submit_payload_from_a_file_and_from_stdin(
    cli: Cli, model: str, tmp_path: Path
) -> None:
    path = tmp_path / "payload.json"
    path.write_text(json.dumps({"prompt": "from a file"}), encoding="utf-8")
    (task_id,) = (await cli("submit", "--model", model, "--payload", f"@{path}", "--json")).json()[
        "ids"
    ]
    shown = (await cli("tasks", "show", task_id, "--json")).json()["task"]
    assert shown["payload"] == {"prompt": "from a file"}
    doc = (
        await cli("submit", "--model", model, "--payload", "-", "--json", stdin=b'{"n": [1, 2]}')
    ).json()
    (task_id,) = doc["ids"]
    assert (await cli("tasks", "show", task_id, "--json")).json()["task"]["payload"] == {
        "n": [1, 2]
    }
    err = (await cli("submit", "--model", model, "--payload", "-", stdin=b"{nope")).error(2)
    assert "argument --payload: not valid JSON" in err and "standard input" in err


@pytest.mark.slow
async def test_submit_streams_in_batches_of_one_transaction_each(
    cli: Cli, model: str, conn: Connection
) -> None:
    doc = (await cli("submit", "--model", model, "--count", "2500", "--json")).json()
    assert doc["count"] == 2500 and len(doc["ids"]) == len(set(doc["ids"])) == 2500
    assert await conn.fetchval("SELECT count(*) FROM engine_task") == 2500
    # now() is the transaction's start: one created_at per batch of 1,000.
    batches = await conn.fetch(
        "SELECT created_at, count(*) AS n FROM engine_task GROUP BY created_at ORDER BY 1"
    )
    assert [r["n"] for r in batches] == [1000, 1000, 500]
    err = (await cli("submit", "--model", model, "--count", "1000001")).error(2)
    assert "from 1 to 1,000,000" in err


# ---------------------------------------------------------------------------------------------
# Logs


async def test_client_commands_log_nothing_at_info_unless_asked(cli: Cli, model: str) -> None:
    # A write command migrates first (already done here: an INFO line `database_migrated`).
    quiet = await cli("models", "set", "m1")
    quiet.ok()
    assert "level=info" not in quiet.err and quiet.err == "", quiet.err
    assert (await cli("status")).error(0) == ""
    loud = await cli("-v", "models", "set", "m1")
    loud.ok()
    assert "level=info" in loud.err and "event=database_migrated" in loud.err, loud.err
    # A warning still shows.
    warned = await cli("--set", "logging.level=WARNING", "-v", "status")
    assert "level=info" not in warned.error(0)


# ---------------------------------------------------------------------------------------------
# What reaches the terminal


async def test_markup_and_escapes_in_user_data_stay_inert_in_a_terminal(
    cli: Cli, model: str, conn: Connection
) -> None:
    (task_id,) = (
        await cli("submit", "--model", model, "--tenant", "[bold red]x[/]", "--json")
    ).json()["ids"]
    await conn.execute(
        "UPDATE engine_task SET status = 'failed', finished_at = now(), error = $2::jsonb,"
        " group_key = $3 WHERE id = $1",
        uuid.UUID(task_id),
        {"code": "[blink]boom[/blink]", "message": "ok\x1b]0;pwned\x07\x1b[2J"},
        "g\r\u202eevil",
    )
    for columns in (200, 60):
        result = await trio.to_thread.run_sync(
            functools.partial(
                run_in_pty, cli.cmd("tasks", "list"), cli.env, columns=columns, timeout=DEADLINE
            )
        )
        assert result.code == 0, result
        assert "\x1b]0;pwned" not in result.raw and "\x1b[2J" not in result.raw
        assert "\x07" not in result.raw and "\u202e" not in result.raw
        assert "\x1b[" in result.raw  # a terminal: colours (failed is red)
        screen = Screen(columns).feed(result.raw)
        assert screen.wrapped == 0, result.raw  # the table fits the width
        text = "\n".join(screen.visible())
        if columns == 200:
            assert "[bold red]x[/]" in text, text  # printed as written
            assert "[blink]boom[/blink]: ok\\x1b]0;pwned\\x07\\x1b[2J" in text, text
    shown = (await cli("tasks", "show", task_id)).ok()
    assert "tenant_id=[bold red]x[/]" in shown and "\\u202eevil" in shown


def test_tables_fit_narrow_terminals_cutting_free_text_then_dropping_columns() -> None:
    """In-process, on consoles of 60, 80 and 200 columns as a terminal's."""
    import io

    from rich.console import Console

    columns: list[str | Col] = [
        Col("ID", keep=True),
        "STATUS",
        Col("CREATED", drop=1),
        Col("ERROR", cut=True),
    ]
    rows: list[list[str | None]] = [
        [str(uuid.uuid4()), "failed", "2026-12-01 10:00:00", "boom: " + "x" * 200],
        [str(uuid.uuid4()), "manual_review", "2026-12-01 10:00:01", None],
    ]
    shown: dict[int, list[str]] = {}
    for width in (60, 80, 200):
        stream = io.StringIO()
        console = Console(file=stream, width=width, force_terminal=True, color_system=None)
        print_out(console, table(columns, rows))
        lines = stream.getvalue().splitlines()
        assert len(lines) == 3 and max(len(x) for x in lines) <= width, lines
        shown[width] = lines[0].split()
    assert shown[200] == ["ID", "STATUS", "CREATED", "ERROR"]
    assert shown[80] == ["ID", "STATUS", "ERROR"]  # CREATED left out, the error cut
    assert shown[60] == ["ID", "STATUS"]
    # Not a terminal: the natural width, nothing cut.
    stream = io.StringIO()
    print_out(make_console(stream), table(columns, rows))
    assert "x" * 200 in stream.getvalue()


# ---------------------------------------------------------------------------------------------
# Where the database is: never create a cluster, never migrate on a read-only command


@pytest.mark.parametrize("command", [["status"], ["tasks", "list"], ["submit", "--model", "m"]])
async def test_a_missing_data_dir_is_reported_and_never_created(
    tmp_path: Path, command: list[str]
) -> None:
    typo = tmp_path / "engine-dta"
    cli = Cli(None, typo)
    err = (await cli(*command)).error(2)
    assert f"engine: error: no engine data directory at {typo}" in err
    assert "python -m engine db start" in err and "python -m engine run" in err
    assert not typo.exists()
    # A directory that exists but holds no cluster: the same, and it stays empty.
    typo.mkdir()
    err = (await cli(*command)).error(2)
    assert f"no engine data cluster at {typo}" in err
    assert list(typo.iterdir()) == []
    # The service's own commands still create one (not run here: initdb is slow); the
    # environment the children got has no database URL.
    assert "ENGINE_DATABASE_URL" not in child_env(typo)


@pytest.mark.parametrize(
    "command",
    [["status"], ["tasks", "list"], ["tasks", "show", str(uuid.UUID(int=1))], ["jobs", "list"],
     ["models", "list"], ["groups", "list"], ["schedules", "list"]],
)  # fmt: skip
async def test_read_only_commands_never_migrate(
    pg_admin_url: str, aio_loop: None, tmp_path: Path, command: list[str]
) -> None:
    async with scratch_database(pg_admin_url, "engine_cli_empty_", migrated=False) as url:
        cli = Cli(url, tmp_path / "unused")
        err = (await cli(*command)).error(1)
        assert "is behind" in err and "python -m engine migrate" in err, err
        conn = await connect(url)
        try:
            tables = await conn.fetchval(
                "SELECT count(*) FROM pg_tables WHERE schemaname = 'public'"
            )
        finally:
            await conn.close()
        assert tables == 0
        if command == ["status"]:
            # A write command migrates, as the service does; then status works.
            (await cli("models", "set", MODEL)).ok()
            assert (await cli("status", "--json")).json()["tasks"]["queued"] == 0


@pytest.mark.slow
async def test_an_existing_cluster_is_started_for_the_command_and_stopped_after() -> None:
    import os
    import shutil
    import tempfile

    from engine import embedded

    # As root the server runs as another user, who must be able to enter the directory.
    data_dir = Path(tempfile.mkdtemp(prefix="engine-test-cli-"))
    os.chmod(data_dir, 0o755)
    try:
        cli = Cli(None, data_dir)
        (await cli("db", "start")).ok()
        (await cli("db", "stop")).ok()
        assert not embedded.status(data_dir).running
        # A read-only command on the new, empty engine database: started, refused, stopped.
        err = (await cli("status")).error(1)
        assert "is behind" in err and "python -m engine migrate" in err
        assert not embedded.status(data_dir).running
        (await cli("migrate")).ok()
        assert (await cli("tasks", "list")).ok().strip() == "no tasks"
        assert not embedded.status(data_dir).running
    finally:
        with contextlib.suppress(Exception):
            if embedded.status(data_dir).running:
                embedded.stop(data_dir)
        shutil.rmtree(data_dir, ignore_errors=True)
