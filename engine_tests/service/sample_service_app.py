"""An app of providers for the service tests: ``python -m engine run --app
engine_tests.service.sample_service_app:PROVIDERS`` (or ``:open_app``, ``:OTHER``)."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import trio

import engine


class SleepyEcho:
    """Answers ``{"echo": payload["text"], "by": name}``; its first poll sleeps
    ``payload["sleep"]`` seconds (a long upstream)."""

    poll_interval = 0.05

    def __init__(self, name: str) -> None:
        self.name = name

    async def prepare(self, task: engine.Task) -> dict[str, Any]:
        return dict(task.payload)

    async def submit(self, task: engine.Task, prepared: dict[str, Any]) -> str:
        return f"{self.name}-{task.id}"

    async def poll(self, task: engine.Task, upstream_ref: str) -> engine.PollResult:
        await trio.sleep(float(task.payload.get("sleep", 0)))
        result = {"echo": task.payload.get("text"), "by": self.name}
        return engine.PollResult(done=True, result=result)

    async def finalize(self, task: engine.Task, result: Any) -> Any:
        return result

    async def cancel(self, task: engine.Task, upstream_ref: str) -> None:
        return None


PROVIDERS = {"echo": SleepyEcho("echo")}
OTHER = {"other": SleepyEcho("other")}


def _log(line: str) -> None:
    path = os.environ.get("ENGINE_TEST_APP_LOG")
    if path:
        with open(path, "a") as log:
            log.write(line + "\n")


@asynccontextmanager
async def open_app() -> AsyncIterator[dict[str, SleepyEcho]]:
    """Providers with a resource opened for the service's life (logged to
    ``$ENGINE_TEST_APP_LOG``)."""
    _log("opened")
    try:
        yield {"echo": SleepyEcho("echo-from-context")}
    finally:
        _log("closed")


class NoPoll:
    """A provider that forgot ``poll``."""

    poll_interval = 0.1

    async def prepare(self, task: engine.Task) -> Any:
        return None

    async def submit(self, task: engine.Task, prepared: Any) -> str:
        return "ref"

    async def finalize(self, task: engine.Task, result: Any) -> Any:
        return result

    async def cancel(self, task: engine.Task, upstream_ref: str) -> None:
        return None


BROKEN = {"broken": NoPoll()}
