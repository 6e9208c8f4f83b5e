"""A provider for the kit's tests: each step answers as told, and every call is recorded."""

from __future__ import annotations

from typing import Any

import trio

import engine


class Scripted:
    """Answers every step unless told otherwise: ``raises`` maps a step (``prepare``, ``submit``,
    ``poll``, ``finalize``) to the exception it raises; ``polls`` polls until done (None:
    never); ``poll_error`` makes the last poll report that upstream error; ``result`` replaces
    finalize's answer; ``hang`` makes a step wait forever."""

    def __init__(
        self,
        *,
        raises: dict[str, BaseException] | None = None,
        polls: int | None = 1,
        poll_error: str | None = None,
        result: Any = None,
        hang: str | None = None,
        poll_interval: float = 0.0,
    ) -> None:
        self.raises = raises or {}
        self.polls = polls
        self.poll_error = poll_error
        self.result = result
        self.hang = hang
        self.poll_interval = poll_interval
        self.calls: list[str] = []
        self.seen: list[engine.Task] = []

    async def _step(self, step: str, task: engine.Task) -> None:
        self.calls.append(step)
        self.seen.append(task)
        await trio.lowlevel.checkpoint()
        if self.hang == step:
            await trio.sleep_forever()
        if step in self.raises:
            raise self.raises[step]

    async def prepare(self, task: engine.Task) -> Any:
        await self._step("prepare", task)
        return {"prepared": task.payload}

    async def submit(self, task: engine.Task, prepared: Any) -> str:
        await self._step("submit", task)
        return f"ref-{task.payload.get('n', 0)}" if isinstance(task.payload, dict) else "ref"

    async def poll(self, task: engine.Task, upstream_ref: str) -> engine.PollResult:
        await self._step("poll", task)
        done = self.polls is not None and self.calls.count("poll") >= self.polls
        if done and self.poll_error is not None:
            return engine.PollResult(done=True, error=self.poll_error)
        return engine.PollResult(done=done, result={"ref": upstream_ref})

    async def finalize(self, task: engine.Task, result: Any) -> Any:
        await self._step("finalize", task)
        return {"final": result, "payload": task.payload} if self.result is None else self.result

    async def cancel(self, task: engine.Task, upstream_ref: str) -> None:
        self.calls.append("cancel")
