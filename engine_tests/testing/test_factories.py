"""make_task and make_request: valid by default, one field changed per override."""

from __future__ import annotations

import uuid

import attrs
import pytest

import engine
from engine.domain.tasks import TaskPhase
from engine.testing import DEFAULT_IDENTITY, DEFAULT_MODEL, make_request, make_task, run_until_final


def test_a_request_has_a_default_for_every_field() -> None:
    request = make_request()
    assert request.model == DEFAULT_MODEL == "test-model"
    assert request.payload == {}
    assert request.identity == DEFAULT_IDENTITY == engine.Identity("test-tenant", "test-user")
    assert request.run_mode is engine.RunMode.LIVE
    assert isinstance(request.id, uuid.UUID)
    assert make_request().id != request.id


def test_request_overrides_replace_fields_and_identity_fields() -> None:
    identity = engine.Identity(tenant_id="acme", user_id="ann", api_key_id="k1")
    request = make_request(
        model="m", payload={"a": 1}, identity=identity, user_id="bob", run_mode="simulation"
    )
    assert request.model == "m"
    assert request.payload == {"a": 1}
    # identity fields apply on top of the identity given
    assert request.identity == attrs.evolve(identity, user_id="bob")
    assert request.run_mode is engine.RunMode.SIMULATION
    assert make_request(tenant_id="t2").identity == engine.Identity("t2", "test-user")


def test_a_task_is_queued_and_never_run_by_default() -> None:
    task = make_task()
    assert (task.model, task.payload, task.identity) == (DEFAULT_MODEL, {}, DEFAULT_IDENTITY)
    assert task.status is engine.TaskStatus.QUEUED
    assert (task.attempts, task.progress, task.phase) == (0, 0.0, None)
    assert task.execution_token is task.upstream_ref is task.submitted_at is None
    assert task.result is task.error is task.started_at is task.finished_at is None
    assert task.created_at == task.updated_at == task.next_run_at
    assert task.created_at.tzinfo is not None
    assert not task.is_final and not task.simulated


def test_task_overrides() -> None:
    task = make_task(status="failed", phase="finalizing", tenant_id="acme", attempts=2)
    assert task.status is engine.TaskStatus.FAILED and task.is_final
    assert task.phase is TaskPhase.FINALIZING
    assert task.identity.tenant_id == "acme"
    assert task.attempts == 2
    assert make_task(run_mode=engine.RunMode.SIMULATION).simulated


@pytest.mark.parametrize(
    ("factory", "name"), [(make_request, "make_request"), (make_task, "make_task")]
)
def test_an_unknown_field_is_refused_by_name(factory: object, name: str) -> None:
    with pytest.raises(TypeError) as caught:
        factory(modle="x", zz=1)  # type: ignore[operator]
    message = str(caught.value)
    assert message.startswith(f"{name}() got unknown field(s) 'modle', 'zz'; it takes ")
    assert "model" in message and "tenant_id" in message


def test_identity_must_be_an_identity() -> None:
    with pytest.raises(TypeError, match=r"identity must be an engine\.Identity, not dict"):
        make_request(identity={"tenant_id": "t"})


async def test_a_default_request_is_accepted_and_runs(engine_running: engine.Engine) -> None:
    # Run as a simulation task: any engine runs those, with its simulated provider.
    await engine_running.set_model(DEFAULT_MODEL)
    ids = await engine_running.submit([make_request(run_mode="simulation"), make_request()])
    [simulated] = await run_until_final(engine_running, ids[:1], timeout=10)
    assert simulated.status is engine.TaskStatus.SUCCEEDED
    stored = await engine_running.get(ids[1])
    assert stored is not None
    assert (stored.model, stored.identity, stored.payload) == (
        DEFAULT_MODEL,
        DEFAULT_IDENTITY,
        {},
    )
