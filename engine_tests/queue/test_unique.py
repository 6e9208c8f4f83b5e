"""Unique keys must match River's byte for byte."""

from __future__ import annotations

import hashlib
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest

from engine.domain.tasks import RunMode
from engine.errors import JobError
from engine.queue.config import QueueConfig
from engine.queue.insert import prepare
from engine.queue.states import (
    FINALIZED_STATES,
    GATEWAY_UNIQUE_STATES,
    LIVE_UNIQUE_STATES_DEFAULT,
    JobState,
)
from engine.queue.unique import (
    GATEWAY_UNIQUE_OPTS,
    UniqueOpts,
    go_json,
    unique_key,
    unique_key_string,
    unique_states_bitmask,
    unique_states_from_bitmask,
    validate_unique_states,
)
from engine.tasks.jobs import TaskRunArgs, task_insert_opts

TASK_ID = "3f2b8c1e-9d4a-4e6b-8a7c-1d2e3f4a5b6c"
GATEWAY_VECTOR = "7101187e877ea220d58b8db2430b051c95e4e0c7905847e8d1725949da5352ad"


# --- the gateway vector ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "by_args",
    [True, ("task_id",)],
    ids=["all-keys", "tagged-task_id"],
)
def test_gateway_vector(by_args: bool | tuple[str, ...]) -> None:
    opts = UniqueOpts(by_args=by_args, by_queue=True, by_state=GATEWAY_UNIQUE_STATES)
    key = unique_key("gateway_task_run", {"task_id": TASK_ID}, "gateway_tasks", opts)
    assert key.hex() == GATEWAY_VECTOR
    assert len(key) == 32


def test_gateway_string() -> None:
    text = unique_key_string(
        "gateway_task_run", {"task_id": TASK_ID}, "gateway_tasks", GATEWAY_UNIQUE_OPTS
    )
    assert text == f'&kind=gateway_task_run&args={{"task_id":"{TASK_ID}"}}&queue=gateway_tasks'
    assert hashlib.sha256(text.encode()).hexdigest() == GATEWAY_VECTOR


def test_gateway_opts_match_reference() -> None:
    assert GATEWAY_UNIQUE_OPTS.by_args == ("task_id",)
    assert GATEWAY_UNIQUE_OPTS.by_queue is True
    assert GATEWAY_UNIQUE_OPTS.by_period is None
    assert GATEWAY_UNIQUE_OPTS.by_state == GATEWAY_UNIQUE_STATES
    assert GATEWAY_UNIQUE_OPTS.states_bitmask() == "11110001"


@pytest.mark.parametrize(
    ("model", "run_mode"),
    [("echo", RunMode.LIVE), ("echo", RunMode.SIMULATION), (None, None)],
    ids=["live-with-model", "simulation-without", "plain"],
)
def test_task_job_key_is_the_gateway_vector_with_or_without_a_model(
    model: str | None, run_mode: RunMode | None
) -> None:
    # The model routes a live task's job but is not unique: the key stays River's
    # {"task_id"} one, so a Go River client inserting {"task_id"} only dedupes against ours.
    args = (
        TaskRunArgs(TASK_ID)
        if run_mode is None
        else TaskRunArgs.for_task(TASK_ID, model or "", run_mode)
    )
    assert args.model == (model if run_mode is RunMode.LIVE else None)
    params = prepare(args, task_insert_opts(QueueConfig()), kind=QueueConfig().job_kind)
    assert params.unique_key is not None and params.unique_key.hex() == GATEWAY_VECTOR
    assert params.unique_states == "11110001"
    expected = {"task_id": TASK_ID} | ({"model": model} if run_mode is RunMode.LIVE else {})
    assert params.args == expected


# --- key string layout ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("opts", "expected"),
    [
        (UniqueOpts(by_queue=True), "&kind=k&queue=q"),
        (UniqueOpts(by_args=True), '&kind=k&args={"a":1,"b":"x","c":[1,2]}'),
        (UniqueOpts(by_args=True, exclude_kind=True), '&args={"a":1,"b":"x","c":[1,2]}'),
        (UniqueOpts(by_args=("c", "a")), '&kind=k&args={"a":1,"c":[1,2]}'),
        (UniqueOpts(by_args=("missing",)), "&kind=k&args="),
        (UniqueOpts(by_args=("a", "missing")), '&kind=k&args={"a":1}'),
        (UniqueOpts(by_args=()), '&kind=k&args={"a":1,"b":"x","c":[1,2]}'),
        (UniqueOpts(by_state=GATEWAY_UNIQUE_STATES), "&kind=k"),
        (UniqueOpts(exclude_kind=True, by_queue=True), "&queue=q"),
    ],
    ids=[
        "queue",
        "all-args-sorted",
        "exclude-kind",
        "subset-sorted",
        "subset-all-missing-is-empty",
        "subset-some-missing-skipped",
        "empty-subset-means-all",
        "states-only",
        "exclude-kind-queue",
    ],
)
def test_key_string_layout(opts: UniqueOpts, expected: str) -> None:
    args = {"c": [1, 2], "b": "x", "a": 1}
    assert unique_key_string("k", args, "q", opts) == expected


def test_all_keys_with_no_args_is_empty_object() -> None:
    # River starts the all-keys object from "{}"; the tagged path starts from "".
    assert unique_key_string("k", {}, "q", UniqueOpts(by_args=True)) == "&kind=k&args={}"


def test_nested_subset_path_builds_nested_object() -> None:
    args = {"customer": {"region": "eu", "id": 7}, "note": "x"}
    opts = UniqueOpts(by_args=("customer.id", "note"))
    assert (
        unique_key_string("k", args, "q", opts) == '&kind=k&args={"customer":{"id":7},"note":"x"}'
    )


def test_nested_values_keep_their_order() -> None:
    # River hashes the raw stored encoding; nested objects are not re-sorted.
    args = {"b": {"z": 1, "a": 2}, "a": 0}
    text = unique_key_string("k", args, "q", UniqueOpts(by_args=True))
    assert text == '&kind=k&args={"a":0,"b":{"z":1,"a":2}}'


def test_the_docs_field_order_example() -> None:
    """docs/queue.md: a Go struct's field order gives River's key; sorted keys give another."""
    opts = UniqueOpts(by_args=("customer", "month"))
    in_go_order = {"customer": {"name": "Ada", "id": 7}, "month": "2026-12"}
    sorted_keys = {"customer": {"id": 7, "name": "Ada"}, "month": "2026-12"}
    assert unique_key_string("invoice", in_go_order, "q", opts) == (
        '&kind=invoice&args={"customer":{"name":"Ada","id":7},"month":"2026-12"}'
    )
    assert unique_key_string("invoice", sorted_keys, "q", opts) != unique_key_string(
        "invoice", in_go_order, "q", opts
    )


def test_overlapping_subset_paths_are_rejected() -> None:
    with pytest.raises(JobError, match="overlap"):
        unique_key_string("k", {"a": {"b": 1}}, "q", UniqueOpts(by_args=("a", "a-x", "a.b")))


def test_by_args_rejects_a_bare_string() -> None:
    with pytest.raises(JobError, match="not a str"):
        UniqueOpts(by_args="task_id")


def test_by_args_list_is_normalised_to_tuple() -> None:
    assert UniqueOpts(by_args=["b", "a"]).by_args == ("b", "a")


# --- period (RFC 3339, truncated like Go's Time.Truncate) --------------------------------------


@pytest.mark.parametrize(
    ("now", "period", "expected"),
    [
        (datetime(2026, 3, 4, 15, 47, 12, 345678, tzinfo=UTC), 3600.0, "2026-03-04T15:00:00Z"),
        (datetime(2026, 3, 4, 15, 47, 12, tzinfo=UTC), 900.0, "2026-03-04T15:45:00Z"),
        (datetime(2026, 3, 4, 15, 47, 12, tzinfo=UTC), 86400.0, "2026-03-04T00:00:00Z"),
        # Converted to UTC before formatting.
        (
            datetime(2026, 3, 4, 17, 47, 12, tzinfo=timezone(timedelta(hours=2))),
            3600.0,
            "2026-03-04T15:00:00Z",
        ),
        # 7 days: Go truncates since 0001-01-01 (a Monday), not since the Unix epoch (a Thursday).
        (datetime(2026, 3, 4, 15, 47, 12, tzinfo=UTC), 7 * 86400.0, "2026-03-02T00:00:00Z"),
        # 7 minutes does not divide a day: the Unix epoch lies 60 s past a 7-minute boundary
        # counted from Go's zero time, so 00:03 truncates to 23:59 (epoch-based: 00:00).
        (datetime(1970, 1, 1, 0, 3, 0, tzinfo=UTC), 420.0, "1969-12-31T23:59:00Z"),
        (datetime(2026, 3, 4, 15, 47, 12, 999999, tzinfo=UTC), 1.0, "2026-03-04T15:47:12Z"),
    ],
    ids=["hour", "15min", "day", "offset", "week-go-zero-time", "7min-go-zero-time", "1s"],
)
def test_period_bound(now: datetime, period: float, expected: str) -> None:
    opts = UniqueOpts(by_period=period)
    assert unique_key_string("k", {}, "q", opts, now) == f"&kind=k&period={expected}"


def test_period_order_between_args_and_queue() -> None:
    opts = UniqueOpts(by_args=True, by_period=60.0, by_queue=True)
    now = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
    text = unique_key_string("k", {"x": 1}, "q", opts, now)
    assert text == '&kind=k&args={"x":1}&period=2026-01-02T03:04:00Z&queue=q'


def test_period_needs_aware_now() -> None:
    opts = UniqueOpts(by_period=60.0)
    with pytest.raises(JobError, match="needs `now`"):
        unique_key_string("k", {}, "q", opts)
    with pytest.raises(JobError, match="timezone-aware"):
        unique_key_string("k", {}, "q", opts, datetime(2026, 1, 1))


@pytest.mark.parametrize("period", [0.5, 0.0, -1.0, float("nan"), float("inf")])
def test_period_below_one_second_is_rejected(period: float) -> None:
    with pytest.raises(JobError) as info:
        UniqueOpts(by_period=period)
    assert str(info.value) == "UniqueOpts.ByPeriod should not be less than 1 second"


# --- Go json.Marshal compatibility -----------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("<a>&</a>", r'"\u003ca\u003e\u0026\u003c/a\u003e"'),
        ("line\u2028para\u2029", r'"line\u2028para\u2029"'),
        ("\b\f\n\r\t\x01\x1f", r'"\b\f\n\r\t\u0001\u001f"'),
        ('quote " and \\ backslash', r'"quote \" and \\ backslash"'),
        ("é ü 中文 \x7f", '"é ü 中文 \x7f"'),
        ("bad \udc80 byte", r'"bad \ufffd byte"'),
        (None, "null"),
        (True, "true"),
        (False, "false"),
        (-12, "-12"),
        (10**20, "100000000000000000000"),
        (1.0, "1"),
        (-0.0, "-0"),
        (0.1, "0.1"),
        (1e20, "100000000000000000000"),
        (1e21, "1e+21"),
        (1.5e-7, "1.5e-7"),
        (1e-6, "0.000001"),
        (1e-10, "1e-10"),
        (2.5e300, "2.5e+300"),
        ({"k": [1, {"n": None}]}, '{"k":[1,{"n":null}]}'),
        ((1, "a"), '[1,"a"]'),
    ],
)
def test_go_json(value: Any, expected: str) -> None:
    assert go_json(value) == expected


@pytest.mark.parametrize(
    "value",
    [float("nan"), float("inf"), {1: "x"}, {"a": object()}, b"bytes"],
    ids=["nan", "inf", "int-key", "object", "bytes"],
)
def test_go_json_rejects_what_go_cannot_encode(value: Any) -> None:
    with pytest.raises(JobError):
        go_json(value)


def test_html_characters_in_args_change_the_key_like_go() -> None:
    text = unique_key_string("k", {"q": "a<b"}, "q", UniqueOpts(by_args=True))
    assert text == '&kind=k&args={"q":"a\\u003cb"}'


# --- states and bitmask ----------------------------------------------------------------------


def test_state_sets() -> None:
    assert {s.value for s in JobState} == {
        "available",
        "cancelled",
        "completed",
        "discarded",
        "pending",
        "retryable",
        "running",
        "scheduled",
    }
    assert GATEWAY_UNIQUE_STATES | {JobState.COMPLETED} == LIVE_UNIQUE_STATES_DEFAULT
    assert JobState.COMPLETED not in GATEWAY_UNIQUE_STATES
    assert {JobState.CANCELLED, JobState.COMPLETED, JobState.DISCARDED} == FINALIZED_STATES


@pytest.mark.parametrize(
    ("states", "expected"),
    [
        (GATEWAY_UNIQUE_STATES, "11110001"),
        (LIVE_UNIQUE_STATES_DEFAULT, "11110101"),
        ({JobState.AVAILABLE}, "00000001"),
        ({JobState.CANCELLED}, "00000010"),
        ({JobState.COMPLETED}, "00000100"),
        ({JobState.DISCARDED}, "00001000"),
        ({JobState.PENDING}, "00010000"),
        ({JobState.RETRYABLE}, "00100000"),
        ({JobState.RUNNING}, "01000000"),
        ({JobState.SCHEDULED}, "10000000"),
        (set(JobState), "11111111"),
        (set(), "00000000"),
        (["available", "scheduled"], "10000001"),
    ],
)
def test_bitmask(states: Any, expected: str) -> None:
    assert unique_states_bitmask(states) == expected
    assert unique_states_from_bitmask(expected) == {JobState(s) for s in states}


def test_gateway_bitmask_is_241() -> None:
    assert int(unique_states_bitmask(GATEWAY_UNIQUE_STATES), 2) == 241


def test_default_states_apply_when_by_state_unset_or_empty() -> None:
    assert UniqueOpts(by_args=True).states_bitmask() == "11110101"
    assert UniqueOpts(by_state=()).effective_states == LIVE_UNIQUE_STATES_DEFAULT


@pytest.mark.parametrize("mask", ["1111000", "111100011", "1111000x"])
def test_bitmask_parse_rejects_garbage(mask: str) -> None:
    with pytest.raises(ValueError, match="bit"):
        unique_states_from_bitmask(mask)


@pytest.mark.parametrize(
    ("states", "message"),
    [
        (
            [JobState.AVAILABLE],
            "UniqueOpts.ByState must contain all required states, missing: "
            "pending, running, scheduled",
        ),
        (
            [JobState.AVAILABLE, JobState.SCHEDULED],
            "UniqueOpts.ByState must contain all required states, missing: pending, running",
        ),
        (
            GATEWAY_UNIQUE_STATES - {JobState.RUNNING},
            "UniqueOpts.ByState must contain all required states, missing: running",
        ),
        (
            [JobState.COMPLETED],
            "UniqueOpts.ByState must contain all required states, missing: "
            "available, pending, running, scheduled",
        ),
        (["available", "bogus"], 'UniqueOpts.ByState contains invalid state "bogus"'),
    ],
)
def test_validate_unique_states_messages(states: Any, message: str) -> None:
    with pytest.raises(JobError) as info:
        validate_unique_states(states)
    assert str(info.value) == message
    with pytest.raises(JobError) as info:
        UniqueOpts(by_state=states)
    assert str(info.value) == message


@pytest.mark.parametrize(
    "states",
    [
        None,
        [],
        GATEWAY_UNIQUE_STATES,
        LIVE_UNIQUE_STATES_DEFAULT,
        set(JobState),
        GATEWAY_UNIQUE_STATES - {JobState.RETRYABLE},
    ],
    ids=["none", "empty", "gateway", "default", "all", "without-retryable"],
)
def test_validate_unique_states_accepts(states: Any) -> None:
    validate_unique_states(states)


def test_bitmask_rejects_unknown_state() -> None:
    with pytest.raises(JobError, match="invalid state"):
        unique_states_bitmask(["available", "nope"])


def test_is_empty() -> None:
    assert UniqueOpts().is_empty
    assert not UniqueOpts(by_queue=True).is_empty
    assert not UniqueOpts(by_args=()).is_empty
    assert not UniqueOpts(by_state=()).is_empty
    assert not UniqueOpts(exclude_kind=True).is_empty


def test_opts_are_frozen() -> None:
    opts = UniqueOpts()
    with pytest.raises(AttributeError):
        opts.by_queue = True  # type: ignore[misc]
