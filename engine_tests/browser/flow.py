"""The browser side of the browser tests, run as ``python -m engine_tests.browser.flow NAME
JSON``: it drives Chromium through the dashboard, asserts what the pages show, saves
screenshots, and prints one JSON line of results."""

from __future__ import annotations

import json
import re
import sys
from typing import Any

from playwright.sync_api import Page

# Nothing of engine here: importing it installs trio-asyncio's event loop policy, under which
# Playwright's sync API cannot make its own loop.
from engine_tests.browser.chromium import artifacts, chromium


def _watch(page: Page) -> list[str]:
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    return errors


def dashboard(
    base: str, failed: str, manual: list[str], instance: str, evil_model: str
) -> dict[str, Any]:
    shots = artifacts()
    with chromium() as ctx:
        page = ctx.new_page()
        errors = _watch(page)

        # Overview, its live part refreshed by htmx (the CSP allows only our own script).
        with page.expect_response(re.compile(r"/fragments/overview$"), timeout=12_000):
            page.goto(base + "/")
        page.screenshot(path=shots / "01-overview.png", full_page=True)

        # Tasks: filter by status.
        page.goto(base + "/tasks")
        page.screenshot(path=shots / "02-tasks.png", full_page=True)
        page.select_option("select[name=status]", "failed")
        page.click("#filters button")
        page.wait_for_url(re.compile(r"status=failed"))
        statuses = page.locator("tbody .status").all_inner_texts()
        assert statuses and set(statuses) == {"failed"}, statuses
        page.screenshot(path=shots / "03-tasks-filtered-failed.png", full_page=True)

        # Paging: two pages of queued tasks, no task on both.
        page.goto(base + "/tasks?status=queued&tenant=paging")
        ids = "els => els.map(e => e.value)"
        first = page.locator("input[name=ids]").evaluate_all(ids)
        page.click("#next-page")
        page.wait_for_url(re.compile(r"after="))
        second = page.locator("input[name=ids]").evaluate_all(ids)
        assert len(first) == 50 and len(second) == 10 and not set(first) & set(second)
        page.screenshot(path=shots / "04-tasks-page-2.png", full_page=True)

        # Task detail (the payload's markup shows as text), then retry the failed task.
        page.goto(f"{base}/tasks/{failed}")
        assert "<script>alert('payload')</script>" in page.inner_text("#payload")
        page.screenshot(path=shots / "05-task-detail-failed.png", full_page=True)
        page.click("form[action$='/retry'] button")
        page.wait_for_selector(".notice")
        assert "queued again" in page.inner_text(".notice")

        # Manual review, each way.
        page.goto(base + "/review")
        page.screenshot(path=shots / "06-review.png", full_page=True)
        ok, bad, again = manual

        def decide(task_id: str, decision: str, *, result: str = "", confirm: bool = False) -> str:
            form = page.locator(f"#review-{task_id} form.review")
            form.locator("input[name=actor]").fill("browser-operator")
            form.locator("input[name=reason]").fill(f"checked upstream: {decision}")
            form.locator(f"input[name=decision][value={decision}]").check()
            if result:
                form.locator("textarea[name=result]").fill(result)
            if confirm:
                form.locator("input[name=may_run_twice]").check()
            form.locator("button").click()
            page.wait_for_selector(".notice")
            return page.inner_text(".notice")

        assert "marked succeeded" in decide(ok, "succeeded", result='{"url": "s3://out"}')
        assert "marked failed" in decide(bad, "failed")
        assert "may run the task upstream twice" in decide(again, "resubmit")
        page.screenshot(path=shots / "07-review-resubmit-warning.png", full_page=True)
        assert "resubmitted" in decide(again, "resubmit", confirm=True)
        page.goto(f"{base}/tasks/{ok}")
        assert "task.resolved" in page.inner_text("#events")
        page.screenshot(path=shots / "08-task-detail-resolved.png", full_page=True)

        # Models: edit a limit in place.
        page.goto(base + "/models")
        row = page.locator("#models tr", has_text="sim-model")
        row.locator("input[name=concurrency_limit]").fill("5")
        row.locator("button").click()
        page.wait_for_selector(".notice")
        assert "saved" in page.inner_text(".notice")
        assert page.inner_text("#models").count(evil_model) == 1
        page.screenshot(path=shots / "09-models.png", full_page=True)

        page.goto(base + "/instances")
        assert instance in page.inner_text("#instances")
        page.screenshot(path=shots / "10-instances.png", full_page=True)

        # Queues: pause one.
        page.goto(base + "/queues")
        page.locator("#queues tr", has_text="gateway_tasks").locator("button").click()
        page.wait_for_selector(".notice")
        assert "paused" in page.inner_text(".notice")
        button = page.locator("#queues tr", has_text="gateway_tasks").locator("button")
        assert button.inner_text() == "Resume"
        page.screenshot(path=shots / "11-queues-paused.png", full_page=True)
        assert not errors, errors
    return {"ok": True}


def cross_origin(base: str) -> dict[str, Any]:
    with chromium() as ctx:
        page = ctx.new_page()
        statuses: list[int] = []
        page.on("response", lambda r: statuses.append(r.status) if "/pause" in r.url else None)
        # A page of another site (served by the browser itself) with a form aimed at us.
        html = (
            f'<form method="post" action="{base}/queues/gateway_tasks/pause">'
            '<input name="csrf" value="guess"><button>go</button></form>'
        )
        page.route(
            "http://attacker.test/**",
            lambda route: route.fulfill(body=html, content_type="text/html"),
        )
        page.goto("http://attacker.test/")
        with page.expect_response(re.compile(r"/pause$")):
            page.click("button")
        # The response can come before the browser has shown it: a screenshot taken while the
        # navigation commits fails ("Unable to capture screenshot"). Wait until it has loaded.
        page.wait_for_url(f"{base}/queues/gateway_tasks/pause")
        page.screenshot(path=artifacts() / "12-cross-origin-refused.png")
    return {"status": statuses[-1]}


if __name__ == "__main__":
    flows = {"dashboard": dashboard, "cross_origin": cross_origin}
    outcome = flows[sys.argv[1]](**json.loads(sys.argv[2]))
    print(json.dumps(outcome))
