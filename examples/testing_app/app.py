"""Document summaries: an app that embeds engine to run them on an upstream summarizer.

- :class:`SummaryProvider` runs the tasks of the model ``summarize`` on an :class:`Upstream`
  (an HTTP API in production; :class:`InMemoryUpstream` here, for demos and tests). A refusal
  fails the task; a lost answer sends it to manual review (it may run upstream: never twice);
  an upstream that takes longer than ``max_wait`` fails it with ``upstream_timeout``.
- :func:`request_summary` is the app's submit path: in one transaction it records the request
  in the app's own table and stores the task (``Engine.submit_tx``), so one never exists
  without the other. :func:`summarize` runs it in a transaction of its own.
- :func:`install_schema` creates the app's table.
"""

from __future__ import annotations

import itertools
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any, Literal, Protocol

import attrs

import engine

MODEL = "summarize"
#: The longest document the app accepts, in characters.
MAX_CHARS = 20_000

SCHEMA = """
CREATE TABLE IF NOT EXISTS summary_request (
    document_id text PRIMARY KEY,
    tenant_id text NOT NULL,
    task_id uuid NOT NULL UNIQUE,
    requested_at timestamptz NOT NULL DEFAULT now()
)
"""


async def install_schema(conn: engine.Connection) -> None:
    """Create the app's table (the app's own migration)."""
    await conn.execute(SCHEMA)


# ---- the upstream ---------------------------------------------------------------------------


class UpstreamRefused(Exception):
    """The upstream refused the request (nothing runs there)."""


class UpstreamNoAnswer(Exception):
    """The call was sent but its answer never came: the upstream may have accepted it."""


@attrs.frozen
class UpstreamJob:
    """What the upstream says about one of its jobs."""

    state: Literal["running", "done", "failed"]
    summary: str | None = None
    reason: str | None = None


class Upstream(Protocol):
    """The summarizer's API."""

    async def create(self, request: dict[str, Any]) -> str:
        """Start a summary; return the upstream's job id.

        Raises:
            UpstreamRefused: the request was refused.
            UpstreamNoAnswer: the answer was lost.
        """

    async def status(self, job_id: str) -> UpstreamJob:
        """How the job is doing."""

    async def cancel(self, job_id: str) -> None:
        """Stop the job (best effort)."""


class InMemoryUpstream:
    """A summarizer in memory: a summary is the document's first ``max_words`` words, ready on
    the first poll. :meth:`refuse`, :meth:`lose_answer`, :meth:`fail` and :meth:`stall` script
    what happens to one document."""

    def __init__(self) -> None:
        self.requests: list[dict[str, Any]] = []
        self.cancelled: list[str] = []
        self._jobs: dict[str, dict[str, Any]] = {}
        self._script: dict[str, tuple[str, str]] = {}
        self._ids = itertools.count(1)

    def refuse(self, document_id: str, reason: str) -> None:
        """``create`` refuses this document."""
        self._script[document_id] = ("refuse", reason)

    def lose_answer(self, document_id: str) -> None:
        """``create`` accepts this document, but its answer is lost."""
        self._script[document_id] = ("lose", "")

    def fail(self, document_id: str, reason: str) -> None:
        """The job of this document fails upstream."""
        self._script[document_id] = ("fail", reason)

    def stall(self, document_id: str) -> None:
        """The job of this document never finishes."""
        self._script[document_id] = ("stall", "")

    async def create(self, request: dict[str, Any]) -> str:
        """See :meth:`Upstream.create`."""
        self.requests.append(request)
        action, reason = self._script.get(request["document_id"], ("", ""))
        if action == "refuse":
            raise UpstreamRefused(reason)
        job_id = f"job-{next(self._ids)}"
        self._jobs[job_id] = request
        if action == "lose":
            raise UpstreamNoAnswer(f"no answer to the request for {request['document_id']}")
        return job_id

    async def status(self, job_id: str) -> UpstreamJob:
        """See :meth:`Upstream.status`."""
        request = self._jobs[job_id]
        action, reason = self._script.get(request["document_id"], ("", ""))
        if action == "fail":
            return UpstreamJob("failed", reason=reason)
        if action == "stall":
            return UpstreamJob("running")
        words = request["text"].split()[: request["max_words"]]
        return UpstreamJob("done", summary=" ".join(words))

    async def cancel(self, job_id: str) -> None:
        """See :meth:`Upstream.cancel`."""
        self.cancelled.append(job_id)


# ---- the provider ---------------------------------------------------------------------------


class SummaryProvider:
    """The provider of the model ``summarize``, on ``upstream``.

    Args:
        upstream: the summarizer.
        poll_interval: seconds between two polls.
        max_wait: seconds a run may wait for the upstream before the task fails with
            ``upstream_timeout``.
    """

    def __init__(
        self, upstream: Upstream, *, poll_interval: float = 1.0, max_wait: float = 300.0
    ) -> None:
        self.upstream = upstream
        self.poll_interval = poll_interval
        self.max_wait = max_wait

    async def prepare(self, task: engine.Task) -> dict[str, Any]:
        """The upstream request: the document and how long a summary to make."""
        payload = task.payload
        return {
            "document_id": payload["document_id"],
            "text": payload["text"],
            "max_words": payload.get("max_words", 50),
        }

    async def submit(self, task: engine.Task, prepared: dict[str, Any]) -> str:
        """Start the upstream job; a refusal fails the task, a lost answer is ambiguous."""
        try:
            return await self.upstream.create(prepared)
        except UpstreamRefused as exc:
            raise engine.ProviderError(str(exc), code="upstream_refused") from exc
        except UpstreamNoAnswer as exc:
            raise engine.AmbiguousSubmission(str(exc)) from exc

    async def poll(self, task: engine.Task, upstream_ref: str) -> engine.PollResult:
        """Done with the summary, done with the upstream's error, or not yet."""
        job = await self.upstream.status(upstream_ref)
        if job.state == "done":
            return engine.PollResult(done=True, result={"summary": job.summary})
        if job.state == "failed":
            return engine.PollResult(done=True, error=job.reason or "the upstream job failed")
        started = task.started_at or datetime.now(UTC)
        if datetime.now(UTC) - started > timedelta(seconds=self.max_wait):
            raise engine.ProviderError(
                f"no summary after {self.max_wait} s", code="upstream_timeout"
            )
        return engine.PollResult(done=False)

    async def finalize(self, task: engine.Task, result: dict[str, Any]) -> dict[str, Any]:
        """The task's result: the summary and its length."""
        summary = str(result["summary"])
        return {"summary": summary, "words": len(summary.split())}

    async def cancel(self, task: engine.Task, upstream_ref: str) -> None:
        """Stop the upstream job."""
        await self.upstream.cancel(upstream_ref)


# ---- the submit path ------------------------------------------------------------------------


class InvalidDocument(ValueError):
    """The document cannot be summarized (empty, or too long)."""


async def request_summary(
    eng: engine.Engine,
    conn: engine.Connection,
    *,
    tenant: str,
    user: str,
    document_id: str,
    text: str,
    max_words: int = 50,
) -> uuid.UUID:
    """Record a summary request and store its task, on ``conn`` inside the caller's
    transaction: both exist once it commits, neither if it rolls back. Returns the task id.

    Raises:
        InvalidDocument: the text is empty or longer than :data:`MAX_CHARS`; nothing is stored.
        engine.InvalidTask: the engine refused the task (a missing tenant or user, say).
    """
    if not text.strip():
        raise InvalidDocument(f"document {document_id!r} is empty")
    if len(text) > MAX_CHARS:
        raise InvalidDocument(f"document {document_id!r} is over {MAX_CHARS} characters")
    request = engine.TaskRequest(
        model=MODEL,
        payload={"document_id": document_id, "text": text, "max_words": max_words},
        identity=engine.Identity(tenant_id=tenant, user_id=user),
    )
    await conn.execute(
        "INSERT INTO summary_request (document_id, tenant_id, task_id) VALUES ($1, $2, $3)",
        document_id,
        tenant,
        request.id,
    )
    await eng.submit_tx(conn, [request])
    return request.id


async def summarize(
    eng: engine.Engine, *, tenant: str, user: str, document_id: str, text: str
) -> uuid.UUID:
    """:func:`request_summary` in a transaction of its own, on a connection of the engine's
    tasks database."""
    async with eng.db.tasks.transaction() as conn:
        return await request_summary(
            eng, conn, tenant=tenant, user=user, document_id=document_id, text=text
        )


async def requested(conn: engine.Connection, document_id: str) -> uuid.UUID | None:
    """The task of the summary of ``document_id``, if one was requested."""
    task_id = await conn.fetchval(
        "SELECT task_id FROM summary_request WHERE document_id = $1", document_id
    )
    return None if task_id is None else uuid.UUID(str(task_id))
