"""run_provider: one task through prepare, submit, poll and finalize, mapped as the engine maps
it; each case is checked against a real engine running the same provider."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import pytest
import trio

import engine
from engine.testing import make_request, make_task, run_provider, run_until_final

from .scripted import Scripted

T = engine.TaskStatus

# (name, provider, status, error, result) for a task of payload {"n": 1}
CASES: list[tuple[str, Callable[[], Scripted], T, dict[str, Any] | None, Any]] = [
    ("success", Scripted, T.SUCCEEDED, None, {"final": {"ref": "ref-1"}, "payload": {"n": 1}}),
    (
        "refused",
        lambda: Scripted(raises={"submit": engine.ProviderError("no quota", code="quota")}),
        T.FAILED,
        {"code": "quota", "message": "no quota"},
        None,
    ),
    (
        "refused-in-prepare",
        lambda: Scripted(raises={"prepare": engine.ProviderError("bad input")}),
        T.FAILED,
        {"code": "provider_error", "message": "bad input"},
        None,
    ),
    (
        "refused-in-finalize",
        lambda: Scripted(raises={"finalize": engine.ProviderError("too big", code="size")}),
        T.FAILED,
        {"code": "size", "message": "too big"},
        None,
    ),
    (
        "failed-upstream",
        lambda: Scripted(polls=2, poll_error="out of memory"),
        T.FAILED,
        {"code": "upstream_failed", "message": "out of memory"},
        None,
    ),
    (
        "ambiguous",
        lambda: Scripted(raises={"submit": engine.AmbiguousSubmission("answer lost")}),
        T.MANUAL_REVIEW,
        {"code": "ambiguous_submission", "message": "answer lost"},
        None,
    ),
    (
        "crash-in-submit",
        lambda: Scripted(raises={"submit": ConnectionResetError("reset")}),
        T.MANUAL_REVIEW,
        {
            "code": "ambiguous_submission",
            "message": "ConnectionResetError in submit: reset (the upstream may have received it)",
            "type": "ConnectionResetError",
            "phase": "submit",
        },
        None,
    ),
    (
        "crash-in-prepare",
        lambda: Scripted(raises={"prepare": KeyError("text")}),
        T.FAILED,
        {
            "code": "provider_exception",
            "message": "KeyError in prepare: 'text'",
            "type": "KeyError",
            "phase": "prepare",
        },
        None,
    ),
    (
        "crash-in-poll",
        lambda: Scripted(raises={"poll": ValueError()}),
        T.FAILED,
        {
            "code": "provider_exception",
            "message": "ValueError in poll",
            "type": "ValueError",
            "phase": "poll",
        },
        None,
    ),
    (
        "crash-in-finalize",
        lambda: Scripted(raises={"finalize": RuntimeError("disk full")}),
        T.FAILED,
        {
            "code": "provider_exception",
            "message": "RuntimeError in finalize: disk full",
            "type": "RuntimeError",
            "phase": "finalize",
        },
        None,
    ),
    (
        "result-not-json",
        lambda: Scripted(result={"at": datetime(2024, 1, 1, tzinfo=UTC)}),
        T.FAILED,
        {
            "code": "result_not_storable",
            "message": "the provider's result is not JSON "
            "(Object of type datetime is not JSON serializable)",
        },
        None,
    ),
]
IDS = [case[0] for case in CASES]


@pytest.mark.parametrize(("name", "make", "status", "error", "result"), CASES, ids=IDS)
async def test_each_answer_maps_to_its_outcome(
    name: str, make: Callable[[], Scripted], status: T, error: Any, result: Any
) -> None:
    task = await run_provider(make(), make_task(payload={"n": 1}))
    assert (task.status, task.error, task.result) == (status, error, result)
    assert task.attempts == 1
    assert task.execution_token is None and task.lease_expires_at is None  # released
    assert task.finished_at is not None


async def test_the_engine_maps_each_answer_the_same_way(engine_database_url: str) -> None:
    """The same providers on a real engine end the same way, field for field."""
    providers = {name: make() for name, make, *_ in CASES}
    async with engine.testing.open_test_engine(
        providers=providers, url=engine_database_url, register_models=True
    ) as eng:
        # All together: a result the database cannot store fails its own task only, not the
        # batched finish that carries the others.
        ids = await eng.submit([make_request(model=name, payload={"n": 1}) for name in providers])
        ran = await run_until_final(eng, ids, timeout=20)
    for task, (name, make, *_) in zip(ran, CASES, strict=True):
        alone = await run_provider(make(), make_task(model=name, payload={"n": 1}))
        fields = ("status", "error", "result", "upstream_ref", "attempts")
        assert {f: getattr(task, f) for f in fields} == {f: getattr(alone, f) for f in fields}, name
        assert (task.submitted_at is None) == (alone.submitted_at is None), name


async def test_the_steps_run_in_order_on_the_running_task() -> None:
    provider = Scripted(polls=3)
    task = await run_provider(provider, make_task(payload={"n": 7}, attempts=2))
    assert provider.calls == ["prepare", "submit", "poll", "poll", "poll", "finalize"]
    seen = provider.seen[0]
    assert (seen.status, seen.attempts, seen.started_at is not None) == (T.RUNNING, 3, True)
    assert (task.status, task.upstream_ref, task.attempts) == (T.SUCCEEDED, "ref-7", 3)
    assert task.submitted_at is not None and task.progress == 1.0


async def test_a_task_with_a_reference_resumes_polling() -> None:
    provider = Scripted()
    task = make_task(payload={"n": 1}, upstream_ref="ref-9", submitted_at=datetime.now(UTC))
    done = await run_provider(provider, task)
    assert provider.calls == ["poll", "finalize"]
    assert done.status is T.SUCCEEDED and done.result["final"] == {"ref": "ref-9"}


async def test_a_submission_with_no_recorded_outcome_is_not_sent_again() -> None:
    provider = Scripted()
    done = await run_provider(provider, make_task(submitted_at=datetime.now(UTC)))
    assert provider.calls == []
    assert done.status is T.MANUAL_REVIEW
    assert done.error == {
        "code": "ambiguous_submission",
        "message": "submitted upstream with no recorded outcome",
    }


async def test_the_default_task_and_a_simulation_task() -> None:
    assert (await run_provider(Scripted())).status is T.SUCCEEDED
    assert (await run_provider(Scripted(), make_task(run_mode="simulation"))).status is T.SUCCEEDED


async def test_poll_interval_replaces_the_providers() -> None:
    provider = Scripted(polls=3, poll_interval=60.0)
    with trio.fail_after(5):
        task = await run_provider(provider, poll_interval=0.0)
    assert task.status is T.SUCCEEDED and provider.calls.count("poll") == 3


async def test_a_timeout_stops_the_run_and_says_how_it_left_the_task() -> None:
    with pytest.raises(trio.TooSlowError) as caught:
        await run_provider(Scripted(polls=None), make_task(payload={"n": 4}), timeout=0.1)
    assert str(caught.value) == (
        "run_provider: the run took longer than 0.1 s; it was stopped and the task left "
        "queued (upstream_ref 'ref-4')"
    )


async def test_a_timeout_inside_submit_leaves_the_task_in_manual_review() -> None:
    provider = Scripted(hang="submit")
    with trio.fail_after(5), pytest.raises(trio.TooSlowError) as caught:
        await run_provider(provider, timeout=0.1)
    assert str(caught.value) == (
        "run_provider: the run took longer than 0.1 s; it was stopped and the task left "
        "manual_review"
    )


async def test_a_final_task_is_refused() -> None:
    with pytest.raises(ValueError, match=r"is already succeeded: nothing to run"):
        await run_provider(Scripted(), make_task(status="succeeded"))
