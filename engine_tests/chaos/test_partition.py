"""Partitions, in network namespaces: three engine instances, each in a namespace of its own,
reach PostgreSQL over one veth link and their HTTP upstream over another.

* **Cut off from the database** for longer than the stale window while its tasks wait upstream
  (the upstream still reachable): the others take its tasks over; after the takeover the
  isolated instance writes nothing to them (fencing: every effective ``engine_task`` update is
  audited with the client port it came through, and each instance has its own proxy to the
  server); nothing is accepted twice upstream; healed, it rejoins the split.
* **Cut off from the upstream** (the database reachable): its submissions and polls fail and are
  retried while it keeps its leases; healed, every task succeeds, none is taken over.

Short intervals (the chaos workers': stale after 3 s, 3 s leases); needs root (skipped
otherwise, with the reason).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio

from engine.bench.chaos.harness import bench_databases, private_server
from engine.bench.chaos.run import WORKER_SETTINGS, Monitor
from engine.bench.proxy import TcpProxy, tcp_proxy
from engine.db.bridge import connect
from engine.domain.tasks import Identity, RunMode, TaskRequest
from engine.providers.http.fake import Dials, FakeUpstream, serve_upstream
from engine.service.engine import Engine
from engine_tests import netns

pytestmark = [
    pytest.mark.chaos,
    pytest.mark.slow,
    pytest.mark.skipif(bool(netns.unavailable()), reason=netns.unavailable() or ""),
]

MODEL = "partition-http"
TASKS = 45
JOB_SECONDS = 4.0  # each job runs this long upstream: the tasks wait upstream, polling

_AUDIT = """
CREATE TABLE partition_audit (
    task_id uuid, port int, status text, at timestamptz DEFAULT clock_timestamp()
);
CREATE FUNCTION partition_audit() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO partition_audit (task_id, port, status)
    VALUES (NEW.id, inet_client_port(), NEW.status);
    RETURN NEW;
END $$;
CREATE TRIGGER partition_audit AFTER UPDATE ON engine_task
    FOR EACH ROW EXECUTE FUNCTION partition_audit();
"""

_MODEL_TOML = f"""
[[http_models]]
model = "{MODEL}"
poll_interval = 0.3
connect_timeout = 1
read_timeout = 2
poll_retries = 30
poll_backoff = 0.2
error_path = "error.message"

[http_models.submit]
url = "{{{{ env.PARTITION_UPSTREAM }}}}/jobs"
body = "{{{{ payload }}}}"

[http_models.poll]
method = "GET"
url = "{{{{ env.PARTITION_UPSTREAM }}}}/jobs/{{{{ upstream_id }}}}"
"""


@attrs.define
class Instance:
    """One worker in its namespace, with its proxy to the database."""

    ns: netns.Namespace
    proxy: TcpProxy
    proc: trio.Process
    instance_id: str = ""


@attrs.define
class Cluster:
    """Three instances, the fake upstream and the bench's view of the database."""

    url: str
    monitor: Monitor
    client: Engine
    fake: FakeUpstream
    instances: list[Instance] = attrs.field(factory=list)
    submitted: list[uuid.UUID] = attrs.field(factory=list)


async def _forward(url: str, host: str, *, task_status: trio.TaskStatus[TcpProxy]) -> None:
    async with tcp_proxy(url, host=host) as proxy:
        task_status.started(proxy)
        await trio.sleep_forever()


async def _spawn(
    nursery: trio.Nursery,
    ns: netns.Namespace,
    url: str,
    ledger_url: str,
    upstream_url: str,
    config: Path,
    log_dir: Path,
) -> Instance:
    db_proxy = await nursery.start(_forward, url, ns.db_host)
    ledger_proxy = await nursery.start(_forward, ledger_url, ns.upstream_host)
    upstream_proxy = await nursery.start(_forward, upstream_url, ns.upstream_host)
    cmd = [sys.executable, "-m", "engine.bench.chaos.worker", "--url", db_proxy.url(url),
           "--ledger-url", ledger_proxy.url(ledger_url), "--config", str(config)]  # fmt: skip
    for key, value in WORKER_SETTINGS.items():
        cmd += ["--set", f"{key}={value}"]
    env = {"PARTITION_UPSTREAM": f"http://{upstream_proxy.host}:{upstream_proxy.port}"}
    with (log_dir / f"{ns.name}.log").open("ab") as log:
        proc = await trio.lowlevel.open_process(
            ns.command(cmd), stdout=subprocess.PIPE, stderr=log, env={**os.environ, **env}
        )
    assert proc.stdout is not None
    line = b""
    with trio.fail_after(60):
        while not line.endswith(b"\n"):
            chunk = await proc.stdout.receive_some(1)
            assert chunk, (log_dir / f"{ns.name}.log").read_text()[-2000:]
            line += chunk
    instance = Instance(ns, db_proxy, proc, line.decode().strip().removeprefix("ready "))
    return instance


@asynccontextmanager
async def cluster(admin_url: str, tmp_path: Path) -> AsyncIterator[Cluster]:
    """Three workers in namespaces on a private server, a fake upstream, a client."""
    async with AsyncExitStack() as stack:
        spaces = stack.enter_context(netns.namespaces(3))
        server = await stack.enter_async_context(private_server())
        dbs = await stack.enter_async_context(
            bench_databases(server.dsn("postgres"), admin_url, prefix="engine_part_")
        )
        url, ledger_url = dbs.url, dbs.ledger_url
        conn = await connect(url)
        try:
            await conn.execute(_AUDIT)
        finally:
            await conn.close()
        fake = FakeUpstream(Dials(job_seconds=JOB_SECONDS))
        upstream_url = await stack.enter_async_context(serve_upstream(fake))
        config = tmp_path / "upstream.toml"
        config.write_text(_MODEL_TOML)
        await dbs.client.set_model(MODEL)
        found = Cluster(url, dbs.monitor, dbs.client, fake)
        async with trio.open_nursery() as nursery:
            try:
                for ns in spaces:
                    found.instances.append(
                        await _spawn(nursery, ns, url, ledger_url, upstream_url, config, tmp_path)
                    )
                await _until_allocated(found, [i.instance_id for i in found.instances])
                yield found
            finally:
                with trio.CancelScope(shield=True):
                    for instance in found.instances:
                        for link in ("db", "upstream"):
                            instance.ns.heal(link)
                        instance.proc.kill()
                        await instance.proc.wait()
                nursery.cancel_scope.cancel()


async def _until_allocated(found: Cluster, ids: list[str], timeout: float = 60) -> None:
    with trio.fail_after(timeout):
        while await found.monitor.fetchval(
            "SELECT count(*) FROM engine_worker_instance"
            " WHERE status = 'active' AND allocated > 0 AND instance_id = ANY($1::text[])",
            ids,
        ) != len(ids):
            await trio.sleep(0.1)


async def _submit(found: Cluster) -> None:
    requests = [
        TaskRequest(
            model=MODEL,
            payload={"n": n},
            identity=Identity(tenant_id="partition", user_id="partition"),
            run_mode=RunMode.LIVE,
        )
        for n in range(TASKS)
    ]
    found.submitted = await found.client.submit(requests)


async def _held_waiting(found: Cluster, owner: str, at_least: int) -> list[Any]:
    """Wait until ``owner`` holds ``at_least`` tasks waiting upstream; its running tasks."""
    with trio.fail_after(30):
        while True:
            rows = await found.monitor.fetch(
                "SELECT id, upstream_ref IS NOT NULL AS polling, submitted_at IS NOT NULL"
                " AS submitted FROM engine_task WHERE status = 'running'"
                " AND execution_owner = $1",
                owner,
            )
            if sum(1 for r in rows if r["polling"]) >= at_least:
                return rows
            await trio.sleep(0.02)


async def _until_final(found: Cluster, timeout: float = 90) -> dict[str, int]:
    with trio.fail_after(timeout):
        while True:
            counts = {
                r["status"]: int(r["n"])
                for r in await found.monitor.fetch(
                    "SELECT status, count(*) AS n FROM engine_task GROUP BY status"
                )
            }
            if not counts.get("queued") and not counts.get("running"):
                return counts
            await trio.sleep(0.2)


def _accepted_twice(fake: FakeUpstream) -> int:
    jobs: dict[Any, int] = {}
    for job in fake.accepted:
        key = json.dumps(job.body, sort_keys=True)
        jobs[key] = jobs.get(key, 0) + 1
    return sum(1 for n in jobs.values() if n > 1)


async def test_an_instance_cut_off_from_the_database_is_fenced_taken_over_and_rejoins(
    pg_admin_url: str, aio_loop: None, tmp_path: Path
) -> None:
    async with cluster(pg_admin_url, tmp_path) as found:
        isolated = found.instances[0]
        await _submit(found)
        held = await _held_waiting(found, isolated.instance_id, at_least=3)
        in_submission = sum(1 for r in held if r["submitted"] and not r["polling"])
        cut_at = await found.monitor.fetchval("SELECT clock_timestamp()")
        isolated.ns.cut("db")
        cut = time.monotonic()

        # Past the stale window (3 s), the others take every one of its tasks over.
        ids = [r["id"] for r in held]
        with trio.fail_after(30):
            while await found.monitor.fetchval(
                "SELECT count(*) FROM engine_task WHERE id = ANY($1::uuid[])"
                " AND status IN ('running', 'queued') AND execution_owner = $2",
                ids,
                isolated.instance_id,
            ):
                await trio.sleep(0.1)
        taken_over_after = time.monotonic() - cut
        await trio.sleep(2.0)  # its executions keep polling and try to finish meanwhile
        isolated.ns.heal("db")

        counts = await _until_final(found)
        # Healed, it comes back into the split.
        await _until_allocated(found, [isolated.instance_id])

        audit = await found.monitor.fetch(
            "SELECT task_id, port, at FROM partition_audit WHERE task_id = ANY($1::uuid[])"
            " AND at > $2 ORDER BY at",
            ids,
            cut_at,
        )
    mine = isolated.proxy.server_ports
    late_writes = []
    for task_id in ids:
        rows = [r for r in audit if r["task_id"] == task_id]
        takeover = next((r["at"] for r in rows if r["port"] not in mine), None)
        assert takeover is not None, f"task {task_id} was never taken over"
        late_writes += [r for r in rows if r["port"] in mine and r["at"] > takeover]
    assert late_writes == []  # fenced: nothing the isolated instance wrote after the takeover
    assert _accepted_twice(found.fake) == 0
    assert counts.get("succeeded", 0) + counts.get("manual_review", 0) == TASKS, counts
    # A submission under way at the cut cannot have its answer recorded: those, and only
    # those, may need a human.
    assert counts.get("manual_review", 0) <= in_submission, (counts, in_submission)
    assert taken_over_after < 15, taken_over_after


async def test_an_instance_cut_off_from_its_upstream_keeps_its_tasks_and_finishes_them(
    pg_admin_url: str, aio_loop: None, tmp_path: Path
) -> None:
    async with cluster(pg_admin_url, tmp_path) as found:
        isolated = found.instances[0]
        await _submit(found)
        held = await _held_waiting(found, isolated.instance_id, at_least=3)
        ids = [r["id"] for r in held]
        isolated.ns.cut("upstream")
        await trio.sleep(6.0)  # longer than the stale window: the database still sees it
        isolated.ns.heal("upstream")
        counts = await _until_final(found)
        requeued = await found.monitor.fetchval(
            "SELECT count(*) FROM engine_task_event WHERE task_id = ANY($1::uuid[])"
            " AND type = 'task.requeued'",
            ids,
        )
    assert counts == {"succeeded": TASKS}, counts
    assert requeued == 0  # nobody took its tasks: its leases held through the cut
    assert _accepted_twice(found.fake) == 0
