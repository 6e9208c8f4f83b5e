"""The dashboard over real HTTP on a real engine: pages, escaping, and the safety rules."""

from __future__ import annotations

import base64
import re
from collections.abc import AsyncIterator
from urllib.parse import quote

import pytest

from engine.domain.tasks import TaskStatus
from engine.errors import ConfigError
from engine.web.auth import check_exposure
from engine_tests.tasks.conftest import make_config
from engine_tests.web.client import Reply, request
from engine_tests.web.fixtures import (
    EVIL_MODEL,
    EVIL_TENANT,
    EVIL_TEXT,
    Populated,
    populated,
    wait_status,
)

TOKEN = "a-test-token-of-some-length"


@pytest.fixture
async def dash(db_url: str) -> AsyncIterator[Populated]:
    async with populated(db_url) as p:
        yield p


class Browser:
    """Cookies and the CSRF token, as a browser on the dashboard's own pages keeps them."""

    def __init__(self, port: int, headers: dict[str, str] | None = None) -> None:
        self.port = port
        self.cookies: dict[str, str] = {}
        self.extra = headers or {}

    def _headers(self, more: dict[str, str] | None = None) -> dict[str, str]:
        h = dict(self.extra)
        if self.cookies:
            h["Cookie"] = "; ".join(f"{k}={v}" for k, v in self.cookies.items())
        return {**h, **(more or {})}

    async def get(self, path: str) -> Reply:
        reply = await request(self.port, "GET", path, headers=self._headers())
        self.cookies.update(reply.cookies)
        return reply

    async def post(
        self, path: str, form: dict[str, str] | list[tuple[str, str]], **headers: str
    ) -> Reply:
        origin = {"Origin": f"http://127.0.0.1:{self.port}", **headers}
        reply = await request(self.port, "POST", path, headers=self._headers(origin), form=form)
        self.cookies.update(reply.cookies)
        return reply

    def form(self, **fields: str) -> dict[str, str]:
        return {"csrf": self.cookies["engine_csrf"], **fields}


def _no_raw_markup(html: str) -> None:
    # The only script tag is the vendored htmx; no value arrives unescaped.
    assert set(re.findall(r"<script[^>]*>", html)) <= {'<script src="/static/htmx.min.js" defer>'}
    assert "<img src=x" not in html and "alert('" not in html.replace("alert(&#39;", "")


async def test_every_page_loads_and_escapes(dash: Populated) -> None:
    b = Browser(dash.port)
    task = dash.manual[0]
    pages = ["/", "/fragments/overview", "/tasks", f"/tasks/{task}", "/review", "/models",
             "/instances", "/queues", f"/tasks?model={quote(EVIL_MODEL)}",
             "/tasks?status=failed"]  # fmt: skip
    for path in pages:
        reply = await b.get(path)
        assert reply.status == 200, path
        assert reply.headers["content-security-policy"].startswith("default-src 'none'")
        assert reply.headers["x-frame-options"] == "DENY"
        _no_raw_markup(reply.text)
    detail = (await b.get(f"/tasks/{task}")).text
    assert "&lt;script&gt;alert(&#39;payload&#39;)&lt;/script&gt;" in detail
    assert "&lt;script&gt;alert(&#39;model&#39;)&lt;/script&gt;&#39;; DROP TABLE" in detail
    listing = (await b.get("/tasks")).text
    assert "tenant&#34;&gt;&lt;script&gt;" in listing or "tenant&quot;&gt;" in listing
    assert EVIL_TENANT not in listing and EVIL_TEXT not in detail
    assert (await b.get("/static/htmx.min.js")).status == 200


async def test_filters_lookup_and_cursor_paging(db_url: str) -> None:
    async with populated(db_url, failed=3, manual=1) as dash:
        b = Browser(dash.port)
        failed = (await b.get("/tasks?status=failed")).text
        assert all(str(t) in failed for t in dash.failed)
        assert not any(str(t) in failed for t in dash.manual + dash.queued)
        # A task id goes straight to its page.
        found = await b.get(f"/tasks?q={dash.failed[0]}")
        assert (found.status, found.headers["location"]) == (303, f"/tasks/{dash.failed[0]}")
        # Pages of 50: make more than a page, walk them, and see every task once.
        ids = await dash.engine.submit([r for r in [_queued(n) for n in range(60)]])
        seen: list[str] = []
        path = "/tasks?status=queued"
        while path:
            page = (await b.get(path)).text
            seen += re.findall(r'name="ids" value="([0-9a-f-]{36})"', page)
            more = re.search(r'href="(/tasks\?[^"]*after=[^"]*)" id="next-page"', page)
            path = more.group(1).replace("&amp;", "&") if more else ""
        assert sorted(seen) == sorted(str(t) for t in [*ids, *dash.queued])


def _queued(n: int) -> object:
    from datetime import UTC, datetime, timedelta

    from engine.domain.tasks import Identity, RunMode, TaskRequest

    return TaskRequest(
        model="sim-model",
        payload={"n": n},
        identity=Identity(tenant_id="t1", user_id="u1"),
        run_mode=RunMode.SIMULATION,
        run_at=datetime.now(UTC) + timedelta(hours=1),
    )


async def test_state_changes_need_same_origin_and_csrf(dash: Populated) -> None:
    b = Browser(dash.port)
    await b.get("/queues")
    target = "/queues/gateway_tasks/pause"
    # Nothing changes on GET.
    assert (await b.get(target)).status == 405
    cross = await b.post(target, b.form(), Origin="http://evil.example")
    assert cross.status == 403 and "cross-origin" in cross.text
    site = await b.post(target, b.form(), **{"Sec-Fetch-Site": "cross-site"})
    assert site.status == 403
    assert (await b.post(target, {"csrf": "forged"})).status == 403
    assert (await b.post(target, {})).status == 403
    paused = {r["name"]: r["paused_at"] for r in await dash.engine.db.queue.fetch(
        "SELECT name, paused_at FROM river_queue")}  # fmt: skip
    assert paused.get("gateway_tasks") is None
    ok = await b.post(target, b.form())
    assert ok.status == 303
    row = await dash.engine.db.queue.fetchrow(
        "SELECT paused_at FROM river_queue WHERE name = 'gateway_tasks'"
    )
    assert row is not None and row["paused_at"] is not None
    assert (await b.post("/queues/gateway_tasks/resume", b.form())).status == 303


async def test_no_credentials_answers_only_loopback_hosts(dash: Populated) -> None:
    rebound = await request(dash.port, "GET", "/tasks", headers={"Host": "evil.example:80"})
    assert rebound.status == 403
    # Metrics and health need no dashboard access at all.
    assert (await request(dash.port, "GET", "/healthz", headers={"Host": "x"})).status == 200


async def test_review_each_way_and_fencing(dash: Populated) -> None:
    eng, b = dash.engine, Browser(dash.port)
    await b.get("/review")
    ok_id, failed_id, again_id = dash.manual
    r = await b.post(
        f"/review/{ok_id}",
        b.form(
            decision="succeeded", result='{"url": "s3://x"}', reason="found upstream", actor="ana"
        ),
    )
    assert r.status == 303 and "marked%20succeeded" in r.headers["location"].replace("+", "%20")
    task = await eng.get(ok_id)
    assert task is not None and task.status is TaskStatus.SUCCEEDED
    assert task.result == {"url": "s3://x"}
    (resolved,) = [e for e in await eng.events(ok_id) if e.type == "task.resolved"]
    assert resolved.payload == {
        "actor": "ana",
        "reason": "found upstream",
        "decision": "succeeded",
    }
    # Deciding again is refused (fenced) and changes nothing.
    again = await b.post(f"/review/{ok_id}", b.form(decision="failed", reason="x", actor="bo"))
    assert "not%20manual_review" in again.headers["location"].replace("+", "%20")
    assert (await eng.get(ok_id)).status is TaskStatus.SUCCEEDED  # type: ignore[union-attr]
    await b.post(f"/review/{failed_id}", b.form(decision="failed", reason=EVIL_TEXT, actor="bo"))
    failed = await eng.get(failed_id)
    assert failed is not None and failed.status is TaskStatus.FAILED
    assert failed.error == {"code": "resolved_failed", "message": EVIL_TEXT}
    _no_raw_markup((await b.get(f"/tasks/{failed_id}")).text)
    # Resubmit needs the explicit may-run-twice confirmation.
    await b.post(f"/review/{again_id}", b.form(decision="resubmit", reason="lost", actor="cy"))
    assert (await eng.get(again_id)).status is TaskStatus.MANUAL_REVIEW  # type: ignore[union-attr]
    await b.post(
        f"/review/{again_id}",
        b.form(decision="resubmit", reason="lost", actor="cy", may_run_twice="yes"),
    )
    types = [e.type for e in await eng.events(again_id)]
    assert "task.resubmitted" in types


async def test_bulk_retry_and_cancel(dash: Populated) -> None:
    eng, b = dash.engine, Browser(dash.port)
    await b.get("/tasks")
    form = [("csrf", b.cookies["engine_csrf"]), ("action", "retry"),
            *(("ids", str(t)) for t in dash.failed[:2]), ("ids", str(dash.manual[0]))]  # fmt: skip
    r = await b.post("/tasks/bulk", form)
    assert r.status == 303 and "manual%20review" in r.headers["location"].replace("+", "%20")
    for task_id in dash.failed[:2]:
        # Retried: it runs again (and, on this upstream, ends in manual review).
        await wait_status(
            eng, task_id, TaskStatus.QUEUED, TaskStatus.RUNNING, TaskStatus.MANUAL_REVIEW
        )
        assert "task.retried" in [e.type for e in await eng.events(task_id)]
    assert (await eng.get(dash.manual[0])).status is TaskStatus.MANUAL_REVIEW  # type: ignore[union-attr]
    form = [("csrf", b.cookies["engine_csrf"]), ("action", "cancel"), ("ids", str(dash.queued[0]))]
    await b.post("/tasks/bulk", form)
    assert (await eng.get(dash.queued[0])).status is TaskStatus.CANCELLED  # type: ignore[union-attr]


async def test_model_limit_edit(dash: Populated) -> None:
    b = Browser(dash.port)
    await b.get("/models")
    r = await b.post(
        "/models/sim-model",
        b.form(enabled="on", concurrency_limit="7", rate_limit="", rate_interval="1"),
    )
    assert r.status == 303
    row = await dash.engine.db.coordination.fetchrow(
        "SELECT enabled, concurrency_limit, rate_limit FROM engine_model WHERE name = 'sim-model'"
    )
    assert row is not None and (row["enabled"], row["concurrency_limit"], row["rate_limit"]) == (
        True,
        7,
        None,
    )
    bad = await b.post("/models/sim-model", b.form(concurrency_limit="-3"))
    assert "at%20least%201" in bad.headers["location"].replace("+", "%20")


def test_exposure_rule() -> None:
    config = make_config()
    check_exposure("127.0.0.1", config.dashboard)
    check_exposure("::1", config.dashboard)
    check_exposure("localhost", config.dashboard)
    with pytest.raises(ConfigError, match=r"dashboard\.token"):
        check_exposure("0.0.0.0", config.dashboard)
    check_exposure("0.0.0.0", make_config(**{"dashboard.token": TOKEN}).dashboard)
    creds = {"dashboard.username": "ops", "dashboard.password": "secret-pass"}
    check_exposure("0.0.0.0", make_config(**creds).dashboard)
    with pytest.raises(ConfigError, match="go together"):
        make_config(**{"dashboard.username": "ops"})


async def test_service_refuses_an_exposed_dashboard_without_credentials(db_url: str) -> None:
    with pytest.raises(ConfigError, match=r"dashboard\.token"):
        async with populated(db_url, failed=0, manual=0, **{"metrics.host": "0.0.0.0"}):
            pass


async def test_token_and_session(db_url: str) -> None:
    async with populated(db_url, failed=0, manual=1, **{"dashboard.token": TOKEN}) as dash:
        port = dash.port
        anon = await request(port, "GET", "/tasks")
        assert (anon.status, anon.headers["location"]) == (303, "/login?next=/tasks")
        assert (await request(port, "POST", "/queues/x/pause")).status == 401
        # Metrics and health stay open.
        assert (await request(port, "GET", "/metrics")).status == 200
        bearer = await request(port, "GET", "/tasks", headers={"Authorization": f"Bearer {TOKEN}"})
        assert bearer.status == 200
        b = Browser(port)
        assert (await b.get("/login")).status == 200
        wrong = await b.post("/login", b.form(token="nope", next="/tasks"))
        assert "session" not in str(wrong.cookies) and "engine_session" not in wrong.cookies
        signed = await b.post("/login", b.form(token=TOKEN, next="/tasks"))
        assert signed.headers["location"] == "/tasks" and "engine_session" in signed.cookies
        assert TOKEN not in signed.cookies["engine_session"]
        assert (await b.get("/review")).status == 200


async def test_basic_auth_names_the_actor(db_url: str) -> None:
    creds = {"dashboard.username": "ops", "dashboard.password": "secret-pass"}
    async with populated(db_url, failed=0, manual=1, **creds) as dash:
        anon = await request(dash.port, "GET", "/")
        assert anon.status == 401 and anon.headers["www-authenticate"].startswith("Basic")
        wrong = base64.b64encode(b"ops:nope").decode()
        assert (
            await request(dash.port, "GET", "/", headers={"Authorization": f"Basic {wrong}"})
        ).status == 401
        good = base64.b64encode(b"ops:secret-pass").decode()
        b = Browser(dash.port, {"Authorization": f"Basic {good}"})
        await b.get("/review")
        (task_id,) = dash.manual
        await b.post(
            f"/review/{task_id}", b.form(decision="failed", reason="gone", actor="mallory")
        )
        (resolved,) = [e for e in await dash.engine.events(task_id) if e.type == "task.resolved"]
        assert resolved.payload["actor"] == "ops"
