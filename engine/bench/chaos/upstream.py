"""The chaos scenarios of real upstreams: workers SIGKILLed while an HTTP upstream holds their
submissions.

The bench process serves a :class:`~engine.providers.http.fake.FakeUpstream` on loopback (it
outlives every worker, as a real upstream would) and describes it to the workers as an
``[[http_models]]`` table in a configuration file. The fake accepts each job at once and answers
only ``SUBMIT_LATENCY`` seconds later, so a worker killed at the fault leaves submissions whose
outcome nobody recorded: the upstream has the job, the engine has ``submitted_at`` and no
reference. What happens to them is the test:

* ``upstream_idempotent``: the model sends an ``Idempotency-Key`` (derived from the task id, so
  every attempt of a task sends the same one) and the fake honours it. Recovery requeues the
  unknown submissions, the next execution submits again with the same key and gets the job the
  first one started. Targets: no task in manual review, no job accepted twice.
* ``upstream_once``: the model sends no key. Submitting again could run the job twice, so the
  unknown submissions go to manual review, and nothing else does. Targets: no job accepted
  twice, no manual review beyond the submissions in flight at the kill.

Figures of their own: ``in_flight_at_kill`` (the victim's tasks with a submission started and
no reference recorded, read just after the kill: at least 1, or the fault missed),
``accepted_twice`` (tasks with more than one job in the fake's ledger), ``upstream_replays``
(submissions the fake answered with an earlier job by its key: the idempotent resubmissions),
``manual_review_beyond_in_flight``.
"""

from __future__ import annotations

import collections
import json
import tempfile
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path

from engine.bench.chaos.faults import kill_busiest
from engine.bench.chaos.run import ChaosRun, FaultReport
from engine.domain.tasks import Identity, RunMode, TaskRequest
from engine.providers.http.fake import Dials, FakeUpstream, serve_upstream

__all__ = [
    "IDEMPOTENT_MODEL",
    "ONCE_MODEL",
    "SUBMIT_LATENCY",
    "evaluate_upstream",
    "kill_mid_submission",
    "prepare_upstream",
    "upstream_requests",
    "upstream_surroundings",
]

#: Seconds the fake holds each submission's answer (after accepting the job).
SUBMIT_LATENCY = 2.0
#: The model whose upstream honours an idempotency key, and the one whose upstream does not.
IDEMPOTENT_MODEL = "chaos-http-idempotent"
ONCE_MODEL = "chaos-http-once"
_IDENTITY = Identity(tenant_id="chaos", user_id="chaos")


def _model_table(base_url: str, model: str, *, idempotent: bool) -> str:
    # json.dumps writes strings TOML reads as basic strings (ASCII, JSON escapes).
    lines = [
        "[[http_models]]",
        f"model = {json.dumps(model)}",
        "poll_interval = 0.2",
        f"read_timeout = {SUBMIT_LATENCY * 5:g}",
        'error_path = "error.message"',
    ]
    if idempotent:
        lines.append('idempotency_header = "Idempotency-Key"')
    lines += [
        "[http_models.submit]",
        f"url = {json.dumps(base_url + '/jobs')}",
        'body = "{{ payload }}"',
        "[http_models.poll]",
        'method = "GET"',
        f"url = {json.dumps(base_url + '/jobs/{{ upstream_id }}')}",
        "",
    ]
    return "\n".join(lines)


def _model_of(run: ChaosRun) -> str:
    return IDEMPOTENT_MODEL if run.scenario.name == "upstream_idempotent" else ONCE_MODEL


@asynccontextmanager
async def upstream_surroundings(run: ChaosRun) -> AsyncIterator[None]:
    """Serve the fake upstream for the run and write the workers' configuration file."""
    fake = FakeUpstream(Dials(submit_latency=SUBMIT_LATENCY, job_seconds=0.5))
    run.notes["upstream"] = fake
    async with serve_upstream(fake) as base_url:
        with tempfile.TemporaryDirectory(prefix="engine-chaos-upstream-") as tmp:
            path = Path(tmp) / "upstream.toml"
            model = _model_of(run)
            path.write_text(_model_table(base_url, model, idempotent=model == IDEMPOTENT_MODEL))
            run.config_file = path
            yield


async def prepare_upstream(run: ChaosRun) -> None:
    """Put the scenario's model in the catalogue (unlimited: the hard limit bounds it)."""
    await run.client.set_model(_model_of(run))


def upstream_requests(model: str) -> Callable[[int], list[TaskRequest]]:
    """The scenario's tasks: live runs of ``model``, each payload naming its task."""

    def make(count: int) -> list[TaskRequest]:
        return [
            TaskRequest(model=model, payload={"n": n}, identity=_IDENTITY, run_mode=RunMode.LIVE)
            for n in range(count)
        ]

    return make


async def kill_mid_submission(run: ChaosRun) -> FaultReport:
    """SIGKILL the live worker with the most submissions in flight (waiting up to 10 s for
    one), then count what it left: submissions started with no reference recorded."""
    victim, _, at = await kill_busiest(
        run, counting="submitted_at IS NOT NULL AND upstream_ref IS NULL", poll=0.02
    )
    # The victim's rows are as it left them until recovery (seconds away) moves them.
    in_flight = await run.monitor.fetchval(
        "SELECT count(*) FROM engine_task WHERE status = 'running' AND execution_owner = $1"
        " AND submitted_at IS NOT NULL AND upstream_ref IS NULL",
        victim.instance_id,
    )
    run.notes["in_flight_at_kill"] = int(in_flight)
    return FaultReport(at, {"in_flight_at_kill": float(in_flight)})


async def evaluate_upstream(run: ChaosRun) -> dict[str, float]:
    """The fake's ledger against the engine's outcomes (see the module docstring)."""
    fake: FakeUpstream = run.notes["upstream"]
    jobs_per_task = collections.Counter(
        job.body.get("n") if isinstance(job.body, dict) else None for job in fake.accepted
    )
    review = await run.monitor.fetchval(
        "SELECT count(*) FROM engine_task WHERE id = ANY($1::uuid[]) AND status = 'manual_review'",
        run.submitted,
    )
    in_flight = run.notes.get("in_flight_at_kill", 0)
    return {
        "accepted_twice": float(sum(1 for n in jobs_per_task.values() if n > 1)),
        "upstream_jobs": float(len(fake.accepted)),
        "upstream_replays": float(sum(1 for r in fake.received if r.replayed)),
        "manual_review_beyond_in_flight": float(max(0, int(review) - in_flight)),
    }
