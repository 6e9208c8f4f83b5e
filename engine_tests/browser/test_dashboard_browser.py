"""The dashboard in a real browser: every page, filters, paging, retry, manual review each
way, a model limit, a paused queue, and the htmx live refresh; a screenshot of each step.

Chromium runs in a child process (:mod:`engine_tests.browser.flow`): Playwright's sync API
needs an asyncio loop of its own, which trio-asyncio's loop policy in this process does not
give. The test checks the database before and after it.
"""

from __future__ import annotations

import json
import sys
from datetime import UTC, datetime, timedelta

import pytest
import trio

from engine.domain.tasks import Identity, RunMode, TaskRequest, TaskStatus
from engine_tests.web.fixtures import EVIL_MODEL, populated

pytestmark = pytest.mark.browser


def _later(n: int) -> TaskRequest:
    return TaskRequest(
        model="sim-model",
        payload={"n": n},
        identity=Identity(tenant_id="paging", user_id="u1"),
        run_mode=RunMode.SIMULATION,
        run_at=datetime.now(UTC) + timedelta(hours=1),
    )


async def _run_flow(name: str, **args: object) -> dict[str, object]:
    with trio.fail_after(150):
        proc = await trio.run_process(
            [sys.executable, "-m", "engine_tests.browser.flow", name, json.dumps(args)],
            capture_stdout=True,
            capture_stderr=True,
            check=False,
        )
    assert proc.returncode == 0, proc.stderr.decode()[-4000:]
    result: dict[str, object] = json.loads(proc.stdout.decode().strip().splitlines()[-1])
    return result


async def test_dashboard_in_chromium(db_url: str) -> None:
    async with populated(db_url) as dash:
        eng = dash.engine
        await eng.submit([_later(n) for n in range(60)])
        await _run_flow(
            "dashboard",
            base=dash.base,
            failed=str(dash.failed[0]),
            manual=[str(t) for t in dash.manual],
            instance=eng.instance_id,
            evil_model=EVIL_MODEL,
        )
        ok, bad, again = dash.manual
        assert (await eng.get(dash.failed[0])).status is not TaskStatus.FAILED  # type: ignore[union-attr]
        assert "task.retried" in [e.type for e in await eng.events(dash.failed[0])]
        assert (await eng.get(ok)).result == {"url": "s3://out"}  # type: ignore[union-attr]
        assert (await eng.get(bad)).status is TaskStatus.FAILED  # type: ignore[union-attr]
        assert "task.resubmitted" in [e.type for e in await eng.events(again)]
        limit = await eng.db.coordination.fetchval(
            "SELECT concurrency_limit FROM engine_model WHERE name = 'sim-model'"
        )
        assert limit == 5
        paused = await eng.db.queue.fetchval(
            "SELECT paused_at FROM river_queue WHERE name = 'gateway_tasks'"
        )
        assert paused is not None


async def test_cross_origin_form_is_refused_in_chromium(db_url: str) -> None:
    """A page on another origin that posts to the dashboard gets 403, and nothing changes."""
    async with populated(db_url, failed=0, manual=0) as dash:
        result = await _run_flow("cross_origin", base=dash.base)
        assert result["status"] == 403
        paused = await dash.engine.db.queue.fetchval(
            "SELECT paused_at FROM river_queue WHERE name = 'gateway_tasks'"
        )
        assert paused is None
