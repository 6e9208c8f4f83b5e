"""``python -m engine`` inspection commands and ``submit``, as users run them.

Every command runs as a real subprocess (``python -W error -m engine --database-url <db_url>
...``) against this test's freshly migrated database, so ``database.migrate_on_start`` is off.
Setup and checks go straight to the database through the ``conn`` fixture. ``submit --follow``
needs tasks to run: those tests open an executing engine in this process while the child
follows. Every wait is on a condition with a deadline; nothing sleeps and hopes.

The last section covers the plain progress display in-process (the terminal's, drawn with rich,
is covered in a pseudo-terminal by engine_tests/cli/test_progress_tty.py).
"""

from __future__ import annotations

import io
import re
import signal
import subprocess
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import attrs
import pytest
import trio

from engine.capacity.registry import Registration, register_instance
from engine.cli.submit import Progress, ProgressDisplay
from engine.db.bridge import Connection
from engine.db.database import Database, DatabaseUrls
from engine.db.sqlfiles import QUERIES
from engine.domain.tasks import TaskStatus
from engine.providers.simulated import SimulatedProvider
from engine.service.root import open as open_engine
from engine_tests.cli.conftest import Cli, engine_config

DEADLINE = 30.0
MODEL = "sim-model"
TASK_KEYS = {
    "id", "model", "group_key", "status", "phase", "progress", "run_mode", "identity", "payload",
    "result", "error", "attempts", "river_job_id", "execution_owner", "lease_expires_at",
    "submitted_at", "upstream_ref", "cancel_requested_at", "next_run_at", "created_at",
    "updated_at", "started_at", "finished_at",
}  # fmt: skip
SUMMARY = re.compile(r"^(\d+) tasks?: (.+) \((?:interrupted after )?\d+\.\d s\)$")


# ---------------------------------------------------------------------------------------------
# Helpers


@pytest.fixture
def cli(db_url: str, tmp_path: Path) -> Cli:
    """``await cli("tasks", "list")`` runs the CLI on this test's database."""
    return Cli(db_url, tmp_path / "unused-data-dir")


@pytest.fixture
async def model(conn: Connection) -> str:
    """An enabled, unlimited model for submissions."""
    await conn.execute("INSERT INTO engine_model (name) VALUES ($1)", MODEL)
    return MODEL


async def submit(cli: Cli, count: int, *extra: str) -> list[str]:
    doc = (await cli("submit", "--model", MODEL, "--count", str(count), "--json", *extra)).json()
    assert doc["count"] == count and len(doc["ids"]) == count
    return list(doc["ids"])


# ---------------------------------------------------------------------------------------------
# Catalogue


async def test_models_set_then_list_shows_it_and_set_changes_only_what_is_given(cli: Cli) -> None:
    created = (await cli("models", "set", "m1", "--limit", "5", "--json")).json()["model"]
    assert created["name"] == "m1" and created["concurrency_limit"] == 5
    assert created["enabled"] is True and created["provider"] == "simulated"

    (await cli("models", "set", "m1", "--disable", "--provider", "acme")).ok()
    models = (await cli("models", "list", "--json")).json()["models"]
    assert [(m["name"], m["enabled"], m["concurrency_limit"], m["provider"]) for m in models] == [
        ("m1", False, 5, "acme")
    ]
    assert set(models[0]) == {
        "name", "enabled", "concurrency_limit", "rate_limit", "rate_interval", "provider",
        "settings", "created_at", "updated_at",
    }  # fmt: skip

    out = (await cli("models", "set", "m1", "--enable", "--unlimited")).ok()
    assert out.strip() == "model m1 updated: enabled, limit unlimited, rate none, provider acme"
    table = (await cli("models", "list")).ok()
    assert re.search(r"^m1\s+yes\s+unlimited\s+none\s+acme\s", table, re.MULTILINE), table

    err = (await cli("models", "set", "m1", "--limit", "2", "--unlimited")).error(2)
    assert "not allowed with argument" in err
    assert "--limit" in (await cli("models", "set", "m1", "--limit", "0")).error(2)


async def test_groups_set_then_list(cli: Cli) -> None:
    group = (await cli("groups", "set", "team-a", "--limit", "3", "--json")).json()["group"]
    assert (group["key"], group["enabled"], group["concurrency_limit"]) == ("team-a", True, 3)
    (await cli("groups", "set", "team-a", "--disable")).ok()
    groups = (await cli("groups", "list", "--json")).json()["groups"]
    assert [(g["key"], g["enabled"], g["concurrency_limit"]) for g in groups] == [
        ("team-a", False, 3)
    ]
    assert "team-a" in (await cli("groups", "list")).ok()


async def test_rate_limits_set_show_and_remove(cli: Cli, conn: Connection) -> None:
    created = (await cli("models", "set", "m1", "--rate", "10/1", "--json")).json()["model"]
    assert (created["rate_limit"], created["rate_interval"]) == (10, 1.0)
    assert created["concurrency_limit"] is None
    # Other options leave the rate alone; a new --rate replaces both numbers.
    out = (await cli("models", "set", "m1", "--limit", "3")).ok()
    assert out.strip() == "model m1 updated: enabled, limit 3, rate 10/1s, provider simulated"
    (await cli("models", "set", "m1", "--rate", "30/0.5")).ok()
    row = await conn.fetchrow("SELECT * FROM engine_model WHERE name = 'm1'")
    assert row is not None
    assert (row["concurrency_limit"], row["rate_limit"], row["rate_interval"]) == (3, 30, 0.5)
    # What admission reads for a task of the model: its scope, limits and interval.
    scopes = await conn.fetch(QUERIES["scope_limits_for_task"], "m1", None)
    assert [
        (r["scope"], r["concurrency_limit"], r["rate_limit"], r["rate_interval"]) for r in scopes
    ] == [("model:m1", 3, 30, 0.5)]
    models = (await cli("models", "list", "--json")).json()["models"]
    assert [(m["name"], m["rate_limit"], m["rate_interval"]) for m in models] == [("m1", 30, 0.5)]
    table = (await cli("models", "list")).ok()
    assert re.search(r"^m1\s+yes\s+3\s+30/0\.5s\s+simulated\s", table, re.MULTILINE), table

    gone = (await cli("models", "set", "m1", "--no-rate", "--json")).json()["model"]
    assert (gone["rate_limit"], gone["rate_interval"], gone["concurrency_limit"]) == (None, None, 3)
    assert await conn.fetchval("SELECT rate_limit FROM engine_model WHERE name = 'm1'") is None

    group = (await cli("groups", "set", "team-a", "--rate", "5/2", "--json")).json()["group"]
    assert (group["rate_limit"], group["rate_interval"]) == (5, 2.0)
    assert group["concurrency_limit"] is None
    out = (await cli("groups", "set", "team-a", "--limit", "4")).ok()
    assert out.strip() == "group team-a updated: enabled, limit 4, rate 5/2s"
    assert re.search(r"^team-a\s+yes\s+4\s+5/2s\s", (await cli("groups", "list")).ok(), re.M)
    groups = (await cli("groups", "list", "--json")).json()["groups"]
    assert [(g["key"], g["rate_limit"], g["rate_interval"]) for g in groups] == [("team-a", 5, 2.0)]
    (await cli("groups", "set", "team-a", "--no-rate")).ok()
    assert (await cli("groups", "list", "--json")).json()["groups"][0]["rate_limit"] is None

    for bad in ["10", "0/1", "-1/1", "10/0", "10/-1", "ten/1", "10/x", "1.5/1", "10/nan"]:
        assert "--rate" in (await cli("models", "set", "m1", f"--rate={bad}")).error(2), bad
    err = (await cli("groups", "set", "team-a", "--rate", "1/1", "--no-rate")).error(2)
    assert "not allowed with argument" in err


# ---------------------------------------------------------------------------------------------
# Submitting and tasks


async def test_submit_count_3_then_tasks_list_has_them(
    cli: Cli, model: str, conn: Connection
) -> None:
    ids = await submit(cli, 3, "--payload", '{"prompt": "a cat"}', "--tenant", "t9")
    listed = (await cli("tasks", "list", "--json")).json()["tasks"]
    assert sorted(t["id"] for t in listed) == sorted(ids)
    for task in listed:
        assert set(task) == TASK_KEYS
        assert task["status"] == "queued" and task["run_mode"] == "simulation"
        assert task["payload"] == {"prompt": "a cat"} and task["model"] == model
        assert task["identity"]["tenant_id"] == "t9" and task["identity"]["user_id"] == "cli"
        assert task["river_job_id"] is not None

    # Filters and the limit.
    assert len((await cli("tasks", "list", "--json", "--limit", "2")).json()["tasks"]) == 2
    assert (await cli("tasks", "list", "--json", "--status", "running")).json()["tasks"] == []
    assert (await cli("tasks", "list", "--json", "--model", "other")).json()["tasks"] == []
    table = (await cli("tasks", "list", "--status", "queued")).ok()
    assert all(i in table for i in ids) and "3 task(s)" in table

    # Plain output: ids one a line; a summary line past ten tasks.
    out = (await cli("submit", "--model", model, "--live")).ok()
    (live_id,) = out.split()
    assert await conn.fetchval("SELECT run_mode FROM engine_task WHERE id = $1", live_id) == "live"
    out = (await cli("submit", "--model", model, "--count", "11")).ok()
    assert re.fullmatch(
        r"submitted 11 tasks \(model sim-model, simulation\): first \S+, last \S+\n", out
    )
    assert await conn.fetchval("SELECT count(*) FROM engine_task") == 3 + 1 + 11


async def test_submit_rejects_bad_input(cli: Cli, model: str, conn: Connection) -> None:
    err = (await cli("submit", "--model", model, "--payload", "{not json")).error(2)
    assert "argument --payload: not valid JSON" in err
    assert "--count" in (await cli("submit", "--model", model, "--count", "0")).error(2)
    err = (await cli("submit", "--model", "no-such-model", "--count", "2")).error(1)
    assert "engine: error: task rejected; nothing was stored" in err
    assert "unknown model 'no-such-model'" in err
    assert await conn.fetchval("SELECT count(*) FROM engine_task") == 0


async def test_what_a_submitter_wrote_cannot_drive_the_operators_terminal(
    cli: Cli, model: str, conn: Connection
) -> None:
    """Escape sequences, a carriage return and a right-to-left override in a task's identity,
    payload and error come out of the human commands as visible escapes."""
    (task_id,) = await submit(cli, 1)
    await conn.execute(
        "UPDATE engine_task SET tenant_id = $2, error = $3::jsonb, group_key = $4 WHERE id = $1",
        uuid.UUID(task_id),
        "acme\x1b[2J\x1b]0;pwned\x07",
        '{"code": "x", "message": "ok\\u009b31m"}',
        "g\r\u202eevil",
    )
    for command in (("tasks", "show", task_id), ("tasks", "list")):
        out = (await cli(*command)).ok()
        assert not any(ch in out for ch in "\x1b\x07\x9b\r\u202e"), (command, out)
    shown = (await cli("tasks", "show", task_id)).ok()
    assert "acme\\x1b[2J" in shown and "\\u202eevil" in shown


async def test_tasks_show_cancel_and_retry(cli: Cli, model: str, conn: Connection) -> None:
    (task_id,) = await submit(cli, 1)
    shown = (await cli("tasks", "show", task_id, "--json")).json()
    assert shown["task"]["id"] == task_id and shown["task"]["status"] == "queued"
    assert [e["type"] for e in shown["events"]] == ["task.queued"]
    assert set(shown["events"][0]) == {
        "type", "status", "phase", "progress", "message", "payload", "simulated", "instance_id",
        "at",
    }  # fmt: skip
    human = (await cli("tasks", "show", task_id)).ok()
    assert "id:" in human and "task.queued" in human

    # A queued task cannot be retried: it has not run.
    err = (await cli("tasks", "retry", task_id)).error(1)
    assert f"engine: error: task {task_id} is queued" in err

    old_job = shown["task"]["river_job_id"]
    cancelled = (await cli("tasks", "cancel", task_id, "--json")).json()
    assert cancelled["outcome"] == "cancelled" and cancelled["task"]["status"] == "cancelled"
    assert await conn.fetchval("SELECT state::text FROM river_job WHERE id = $1", old_job) == (
        "cancelled"
    )
    again = (await cli("tasks", "cancel", task_id, "--json")).json()
    assert again["outcome"] == "already_cancelled"

    retried = (await cli("tasks", "retry", task_id, "--json")).json()
    task = retried["task"]
    assert task["status"] == "queued" and task["finished_at"] is None and task["error"] is None
    assert task["cancel_requested_at"] is None
    new_job = retried["job_id"]
    assert new_job != old_job and task["river_job_id"] == new_job
    row = await conn.fetchrow(
        "SELECT state::text AS state, args FROM river_job WHERE id = $1", new_job
    )
    assert row is not None and row["state"] == "available"
    assert row["args"] == {"task_id": task_id}
    events = (await cli("tasks", "show", task_id, "--json")).json()["events"]
    assert [e["type"] for e in events] == ["task.queued", "task.retried"]


async def test_retry_and_cancel_of_tasks_they_do_not_apply_to_are_errors(
    cli: Cli, model: str, conn: Connection
) -> None:
    # What Engine.retry refuses, and why, is covered in engine_tests/tasks/test_retry.py; here
    # the CLI reports it as an engine error (exit 1).
    succeeded, running = await submit(cli, 2)
    await conn.execute(
        "UPDATE engine_task SET status = 'succeeded', finished_at = now() WHERE id = $1",
        uuid.UUID(succeeded),
    )
    await conn.execute(
        "UPDATE engine_task SET status = 'running', phase = 'preparing', attempts = 1, "
        "execution_token = gen_random_uuid(), execution_owner = 'elsewhere', "
        "lease_expires_at = now() + interval '1 minute' WHERE id = $1",
        uuid.UUID(running),
    )
    err = (await cli("tasks", "retry", succeeded)).error(1)
    assert f"task {succeeded} is succeeded; only failed, cancelled and manual_review" in err
    err = (await cli("tasks", "cancel", succeeded)).error(1)
    assert "already finished (succeeded); nothing to cancel" in err

    # A running task: retry refuses; cancel asks its execution to stop.
    err = (await cli("tasks", "retry", running)).error(1)
    assert f"task {running} is running: cancel it first" in err
    cancelled = (await cli("tasks", "cancel", running, "--json")).json()
    assert cancelled["outcome"] == "cancel_requested"
    assert cancelled["task"]["status"] == "running" and cancelled["task"]["cancel_requested_at"]


async def test_unknown_or_malformed_task_ids(cli: Cli) -> None:
    missing = str(uuid.uuid4())
    for command in ("show", "cancel", "retry"):
        err = (await cli("tasks", command, missing)).error(1)
        assert err.strip() == f"engine: error: no task {missing}"
    assert "not a task id" in (await cli("tasks", "show", "nope")).error(2)


# ---------------------------------------------------------------------------------------------
# Jobs, queues, status


async def test_jobs_list(cli: Cli, model: str) -> None:
    ids = await submit(cli, 2)
    jobs = (await cli("jobs", "list", "--json")).json()["jobs"]
    assert sorted(j["args"]["task_id"] for j in jobs) == sorted(ids)
    assert {j["kind"] for j in jobs} == {"gateway_task_run"}
    assert set(jobs[0]) == {
        "id", "state", "kind", "queue", "priority", "attempt", "max_attempts", "args", "tags",
        "metadata", "errors", "scheduled_at", "created_at", "attempted_at", "finalized_at",
    }  # fmt: skip
    queue = jobs[0]["queue"]
    available = (await cli("jobs", "list", "--json", "--state", "available")).json()["jobs"]
    assert len(available) == 2
    assert (await cli("jobs", "list", "--json", "--state", "running")).json()["jobs"] == []
    assert (await cli("jobs", "list", "--json", "--queue", "other")).json()["jobs"] == []
    assert (
        len((await cli("jobs", "list", "--json", "--queue", queue, "--limit", "1")).json()["jobs"])
        == 1
    )
    assert ids[0] in (await cli("jobs", "list")).ok()
    assert "invalid choice" in (await cli("jobs", "list", "--state", "bogus")).error(2)


async def test_queue_pause_and_resume(cli: Cli, conn: Connection) -> None:
    # A queue nothing has used is refused (a typo would make a paused queue nobody works).
    err = (await cli("queue", "pause", "q1")).error(1)
    assert "no queue named 'q1'; known queues: none yet" in err
    assert await conn.fetchval("SELECT count(*) FROM river_queue") == 0
    await conn.execute("INSERT INTO river_job (kind, queue, max_attempts) VALUES ('k', 'q1', 25)")
    paused = (await cli("queue", "pause", "q1", "--json")).json()["queue"]
    assert paused["name"] == "q1" and paused["paused"] is True and paused["paused_at"]
    assert await conn.fetchval("SELECT paused_at FROM river_queue WHERE name = 'q1'") is not None
    out = (await cli("queue", "resume", "q1")).ok()
    assert out.strip() == "queue q1: running (not paused)"
    assert await conn.fetchval("SELECT paused_at FROM river_queue WHERE name = 'q1'") is None
    assert "known queues: q1" in (await cli("queue", "pause", "q2")).error(1)


async def test_limits_beyond_what_the_catalogue_stores_are_usage_errors(cli: Cli) -> None:
    err = (await cli("models", "set", MODEL, "--limit", "1000000000000")).error(2)
    assert "expected a positive integer up to 2,147,483,647, got 1000000000000" in err
    err = (await cli("models", "set", MODEL, "--rate", "1000000000000/1")).error(2)
    assert "expected N/S (N requests, 1 to 2,147,483,647" in err


async def test_status(cli: Cli, conn: Connection, database: Database) -> None:
    await conn.execute("INSERT INTO engine_model (name, concurrency_limit) VALUES ($1, 4)", MODEL)
    await register_instance(
        database.coordination,
        Registration(instance_id="host:1:2", desired_capacity=4, heartbeat_stale_after=30.0),
    )
    await conn.execute(
        "INSERT INTO river_leader (name, leader_id, elected_at, expires_at) "
        "VALUES ('default', 'host:1:2-leader', now(), now() + interval '30 seconds')"
    )
    await submit(cli, 2)

    status = (await cli("status", "--json")).json()
    assert set(status) == {
        "capacity", "leader", "instances", "queues", "tasks", "unserved_models", "schedules"
    }  # fmt: skip
    assert status["unserved_models"] == {}  # simulation tasks run anywhere
    assert status["schedules"] == []
    capacity = status["capacity"]
    assert (capacity["desired"], capacity["capacity"], capacity["hard_limit"]) == (4, 4, 100)
    assert capacity["capped"] is False
    assert status["leader"]["leader_id"] == "host:1:2-leader"
    assert set(status["leader"]) == {"leader_id", "elected_at", "expires_at"}
    (instance,) = status["instances"]
    assert instance["instance_id"] == "host:1:2" and instance["status"] == "active"
    assert instance["allocated"] == 4 and instance["heartbeat_age"] < DEADLINE
    assert instance["models"] is None  # registered without models: serves every model
    for key in (
        "desired_capacity",
        "safe_capacity",
        "active_tasks",
        "preparing_tasks",
        "waiting_upstream_tasks",
        "finalizing_tasks",
        "pressure_state",
        "pressure_reason",
    ):
        assert key in instance  # fmt: skip
    assert status["tasks"] == {s.value: 2 if s is TaskStatus.QUEUED else 0 for s in TaskStatus}
    ((name, queue),) = status["queues"].items()
    assert queue["paused"] is False and queue["jobs"]["available"] == 2
    assert set(queue["jobs"]) >= {"available", "running", "completed", "cancelled"}

    (await cli("status", "--set", "worker.hard_limit=3")).error(2)  # --set is global
    human = (await cli("--set", "worker.hard_limit=3", "status")).ok()
    assert "capacity: 3 (desired 4, hard limit 3, capped)" in human
    assert "host:1:2" in human and "leader: host:1:2-leader" in human
    assert name in human and "queued 2" in human


async def test_schedules_list_and_status_show_each_schedules_periods_and_errors(
    cli: Cli, conn: Connection
) -> None:
    assert (await cli("schedules", "list")).ok().startswith("no schedules")
    await conn.execute(
        "INSERT INTO engine_schedule (name, timing, target, last_period, next_period,"
        " fired_count, passed_over_count, last_error, declared_by) VALUES"
        " ('nightly', 'cron 0 3 * * *', 'task report', '2026-12-01T03:00Z', '2026-12-02T03:00Z',"
        "  7, 2, NULL, 'host:1:2'),"
        " ('sweep', 'every 15m', 'job cleanup → default', NULL, NULL, 0, 0,"
        "  'unknown model', 'host:1:2')"
    )
    listed = (await cli("schedules", "list", "--json")).json()["schedules"]
    assert [(x["name"], x["fired_count"], x["last_error"]) for x in listed] == [
        ("nightly", 7, None),
        ("sweep", 0, "unknown model"),
    ]
    assert listed[0]["next_period"] == "2026-12-02T03:00:00+00:00"
    table = (await cli("schedules", "list")).ok()
    assert "cron 0 3 * * *" in table and "7 (2 passed over)" in table and "unknown model" in table
    human = (await cli("status")).ok()
    assert "schedules (2):" in human and "every 15m" in human


async def test_status_names_models_with_queued_live_tasks_that_no_live_instance_serves(
    cli: Cli, conn: Connection, database: Database
) -> None:
    await conn.execute("INSERT INTO engine_model (name) VALUES ('echo'), ('flux'), ('sd')")
    for instance_id, models in (("flux-1", ["flux"]), ("sd-gone", ["sd"]), ("sim-1", [])):
        await register_instance(
            database.coordination,
            Registration(
                instance_id=instance_id,
                desired_capacity=4,
                heartbeat_stale_after=30.0,
                models=models,
            ),
        )
    await conn.execute(
        "UPDATE engine_worker_instance SET heartbeat_at = now() - interval '1 hour'"
        " WHERE instance_id = 'sd-gone'"
    )
    for model, count, mode in (
        ("echo", 12, "--live"),
        ("flux", 3, "--live"),
        ("sd", 1, "--live"),
        ("echo", 5, "--simulation"),
    ):
        await cli("submit", "--model", model, "--count", str(count), mode, "--json")

    status = (await cli("status", "--json")).json()
    assert status["unserved_models"] == {"echo": 12, "sd": 1}
    served = {i["instance_id"]: i["models"] for i in status["instances"]}
    assert served == {"flux-1": ["flux"], "sd-gone": ["sd"], "sim-1": []}

    human = (await cli("status")).ok()
    assert "model echo: 12 queued tasks, no live instance serves it" in human
    assert "model sd: 1 queued task, no live instance serves it" in human
    assert "model flux:" not in human
    assert "simulation only" in human  # sim-1's MODELS cell


async def test_help_lists_the_commands(cli: Cli) -> None:
    out = (await cli("--help")).ok()
    for line in (
        "status",
        "submit --model M",
        "tasks list|show|cancel|retry",
        "jobs list",
        "queue pause|resume NAME",
        "models list|set",
        "groups list|set",
    ):
        assert line in out  # fmt: skip


# ---------------------------------------------------------------------------------------------
# submit --follow


@pytest.fixture
async def executing(db_url: str) -> AsyncIterator[None]:
    """An executing engine in this process, with the model enabled."""
    async with open_engine(
        attrs.evolve(
            engine_config(), worker=attrs.evolve(engine_config().worker, capacity="fixed")
        ),
        urls=DatabaseUrls.single(db_url),
        simulated=SimulatedProvider(),
    ) as eng:
        await eng.set_model(MODEL)
        yield


@pytest.mark.slow
async def test_submit_follow_until_every_task_is_final(
    cli: Cli, executing: None, conn: Connection
) -> None:
    result = await cli("submit", "--model", MODEL, "--count", "20", "--follow")
    lines = result.ok().splitlines()
    assert lines[0].startswith("submitted 20 tasks (model sim-model, simulation)")
    match = SUMMARY.match(lines[-1])
    assert match is not None, lines
    assert match.group(1) == "20" and match.group(2) == "20 succeeded", lines[-1]
    assert "\r" not in result.out  # not a terminal: plain lines only
    counts = await conn.fetch("SELECT status, count(*) AS n FROM engine_task GROUP BY status")
    assert {r["status"]: r["n"] for r in counts} == {"succeeded": 20}

    doc = (await cli("submit", "--model", MODEL, "--count", "3", "--follow", "--json")).json()
    assert doc["counts"] == {"succeeded": 3} and doc["interrupted"] is False
    assert len(doc["ids"]) == 3 and doc["elapsed"] > 0


@pytest.mark.slow
async def test_submit_follow_interrupted_exits_130(cli: Cli, model: str) -> None:
    # Nothing executes: the tasks stay queued until SIGINT stops the follow.
    finished: list[subprocess.CompletedProcess[bytes]] = []

    async def run(*, task_status: trio.TaskStatus[trio.Process]) -> None:
        cmd = cli.cmd("submit", "--model", model, "--count", "2", "--follow")
        finished.append(
            await trio.run_process(
                cmd,
                stdout=subprocess.PIPE,
                capture_stderr=True,
                check=False,
                env=cli.env,
                task_status=task_status,
            )
        )

    seen = b""
    with trio.fail_after(DEADLINE):
        async with trio.open_nursery() as nursery:
            proc: trio.Process = await nursery.start(run)
            assert proc.stdout is not None
            async with proc.stdout:
                while b"0/2 final: 2 queued" not in seen:
                    chunk = await proc.stdout.receive_some()
                    assert chunk, seen
                    seen += chunk
                proc.send_signal(signal.SIGINT)
                while chunk := await proc.stdout.receive_some():
                    seen += chunk
    (result,) = finished
    assert result.returncode == 130, (seen, result.stderr)
    last = seen.decode().splitlines()[-1]
    assert last.startswith("2 tasks: 2 queued (interrupted after "), last
    assert "engine: interrupted; the tasks go on" in result.stderr.decode()


# ---------------------------------------------------------------------------------------------
# The progress display, in-process


def test_summary_line() -> None:
    progress = Progress(total=200, counts={"succeeded": 189, "failed": 11}, elapsed=12.34)
    assert progress.done and progress.final == 200
    assert progress.summary() == "200 tasks: 189 succeeded, 11 failed (12.3 s)"
    progress = Progress(total=3, counts={"running": 1, "succeeded": 1}, elapsed=2.0)
    assert not progress.done and progress.missing == 1
    assert progress.summary(interrupted=True) == (
        "3 tasks: 1 succeeded, 1 running, 1 missing (interrupted after 2.0 s)"
    )
    assert Progress(total=1, counts={"cancelled": 1}).summary() == "1 task: 1 cancelled (0.0 s)"


def test_plain_display_prints_changes_at_most_once_a_second() -> None:
    stream = io.StringIO()
    display = ProgressDisplay(stream, tty=False, line_interval=1.0)
    for elapsed, counts in [
        (0.0, {"queued": 2}),
        (0.5, {"queued": 1, "running": 1}),  # too soon
        (1.2, {"queued": 1, "running": 1}),
        (2.5, {"queued": 1, "running": 1}),  # unchanged
        (2.7, {"succeeded": 2}),
    ]:
        display.update(Progress(total=2, counts=counts, elapsed=elapsed))
    display.finish(Progress(total=2, counts={"succeeded": 2}, elapsed=2.7))
    assert stream.getvalue().splitlines() == [
        "0/2 final: 2 queued (0.0 s)",
        "0/2 final: 1 queued, 1 running (1.2 s)",
        "2/2 final: 2 succeeded (2.7 s)",
        "2 tasks: 2 succeeded (2.7 s)",
    ]
