"""assert_submitted, refute_submitted, all_submitted: matching, and the exact failure messages."""

from __future__ import annotations

import pytest

import engine
from engine.testing import (
    all_submitted,
    assert_submitted,
    make_request,
    payload_contains,
    refute_submitted,
)

SUBMITTED = (
    "2 tasks were submitted (oldest first):\n"
    "  - model='summarize' tenant='acme' status=queued payload={'doc': 1, 'opts': {'lang': 'en'}}\n"
    "  - model='translate' tenant='zeta' status=queued payload={'doc': 2}"
)


@pytest.fixture
async def eng(engine_manual: engine.Engine) -> engine.Engine:
    """A manual engine holding two queued tasks (one submit: one created_at, job order)."""
    for model in ("summarize", "translate"):
        await engine_manual.set_model(model)
    await engine_manual.submit(
        [
            make_request(
                model="summarize", tenant_id="acme", payload={"doc": 1, "opts": {"lang": "en"}}
            ),
            make_request(model="translate", tenant_id="zeta", payload={"doc": 2}),
        ]
    )
    return engine_manual


@pytest.mark.parametrize(
    ("payload", "expected", "contained"),
    [
        ({"a": 1, "b": 2}, {"a": 1}, True),
        ({"a": {"x": 1, "y": 2}, "b": 2}, {"a": {"y": 2}}, True),  # nested: a subset too
        ({"a": {"x": 1}}, {"a": {"x": 2}}, False),
        ({"a": 1}, {"a": 1, "c": 3}, False),
        ({"a": [1, 2]}, {"a": [1]}, False),  # lists must be equal
        ({"a": [1, {"k": 1, "j": 2}]}, {"a": [1, {"k": 1, "j": 2}]}, True),
        ([1, 2], {"a": 1}, False),  # a mapping never matches a non-mapping
        ("text", "text", True),
        ({}, {}, True),
        ({"a": None}, {"a": None}, True),
        ({}, {"a": None}, False),  # the key must be there
    ],
)
def test_payload_contains(payload: object, expected: object, contained: bool) -> None:
    assert payload_contains(payload, expected) is contained


async def test_matches_by_each_criterion(eng: engine.Engine) -> None:
    [summary] = await assert_submitted(eng, model="summarize")
    assert summary.payload["doc"] == 1
    assert await assert_submitted(eng, tenant="zeta") == await all_submitted(eng, model="translate")
    assert len(await assert_submitted(eng, status="queued", count=2)) == 2
    assert len(await assert_submitted(eng, status=engine.TaskStatus.QUEUED, count=2)) == 2
    await assert_submitted(eng, payload={"opts": {"lang": "en"}}, count=1)
    await assert_submitted(eng, model="summarize", tenant="acme", payload={"doc": 1}, count=1)
    await refute_submitted(eng, model="summarize", tenant="zeta")
    await refute_submitted(eng, status="running")
    await refute_submitted(eng, payload={"doc": 3})
    assert await all_submitted(eng, payload={"opts": {"lang": "fr"}}) == []


async def test_all_submitted_is_oldest_first(eng: engine.Engine) -> None:
    later = await eng.submit(make_request(model="summarize", payload={"doc": 3}))
    tasks = await all_submitted(eng)
    assert [t.payload["doc"] for t in tasks] == [1, 2, 3]
    assert tasks[-1].id == later


async def test_assert_submitted_failure_lists_what_was_submitted(eng: engine.Engine) -> None:
    with pytest.raises(AssertionError) as caught:
        await assert_submitted(eng, model="summarize", payload={"doc": 2})
    assert str(caught.value) == (
        "expected a task submitted with model='summarize', payload containing {'doc': 2}; "
        "none was.\n" + SUBMITTED
    )


async def test_assert_submitted_count_failure(eng: engine.Engine) -> None:
    with pytest.raises(AssertionError) as caught:
        await assert_submitted(eng, status="queued", count=3)
    assert str(caught.value) == (
        "expected 3 tasks submitted with status=queued; 2 were.\n" + SUBMITTED
    )
    with pytest.raises(AssertionError) as caught:
        await assert_submitted(eng, tenant="acme", count=2)
    assert (
        str(caught.value) == "expected 2 tasks submitted with tenant='acme'; 1 was.\n" + SUBMITTED
    )
    with pytest.raises(AssertionError) as caught:
        await assert_submitted(eng, status="running", count=1)
    assert str(caught.value) == (
        "expected 1 task submitted with status=running; none was.\n" + SUBMITTED
    )


async def test_assert_submitted_when_nothing_was(engine_manual: engine.Engine) -> None:
    with pytest.raises(AssertionError) as caught:
        await assert_submitted(engine_manual)
    assert str(caught.value) == "expected a task submitted; none was.\nno task was submitted."
    assert await assert_submitted(engine_manual, count=0) == []


async def test_refute_submitted_failure_lists_what_was_submitted(eng: engine.Engine) -> None:
    with pytest.raises(AssertionError) as caught:
        await refute_submitted(eng, tenant="acme")
    assert (
        str(caught.value) == "expected no task submitted with tenant='acme'; 1 was.\n" + SUBMITTED
    )
    with pytest.raises(AssertionError) as caught:
        await refute_submitted(eng)
    assert str(caught.value) == "expected no task submitted; 2 were.\n" + SUBMITTED


async def test_a_long_listing_is_cut(engine_manual: engine.Engine) -> None:
    await engine_manual.set_model("m")
    await engine_manual.submit(
        [make_request(model="m", payload={"n": n, "pad": "x" * 300 * (n == 0)}) for n in range(22)]
    )
    with pytest.raises(AssertionError) as caught:
        await refute_submitted(engine_manual, payload={"n": 5})
    lines = str(caught.value).splitlines()
    assert lines[:2] == [
        "expected no task submitted with payload containing {'n': 5}; 1 was.",
        "22 tasks were submitted (oldest first):",
    ]
    first = "  - model='m' tenant='test-tenant' status=queued payload="
    assert lines[2] == first + ("{'n': 0, 'pad': '" + "x" * 300)[:197] + "..."
    assert lines[3] == first + "{'n': 1, 'pad': ''}"
    assert len(lines) == 2 + 20 + 1
    assert lines[-1] == "  ... and 2 more"
