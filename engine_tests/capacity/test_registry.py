"""The worker-instance registry on a real database."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import attrs
import pytest
import trio

from engine.capacity.allocation import InstanceRow, allocate
from engine.capacity.registry import (
    Allocation,
    InstanceInfo,
    Registration,
    delete_stale_instances,
    list_instances,
    load_capacity,
    mark_draining,
    register_instance,
    unserved_models,
)
from engine.capacity.snapshot import (
    UNBOUNDED_FALLBACK,
    GroupLimit,
    ModelLimit,
    compute_capacity,
)
from engine.db.bridge import Connection, Pool
from engine.db.database import Database
from engine.load.controller import LoadSnapshot
from engine.load.pressure import PressureState

STALE = 30.0
"""Heartbeat stale-after used by these tests, in seconds (6 × a 5 s refresh)."""


def reg(
    instance_id: str,
    g: int = 10,
    *,
    limit: int = 0,
    safe: int | None = None,
    pressure: str = "normal",
) -> Registration:
    return Registration(
        instance_id=instance_id,
        desired_capacity=g,
        capacity_limit=limit,
        heartbeat_stale_after=STALE,
        safe_capacity=safe,
        pressure_state=pressure,
    )


async def stored(pool: Pool) -> dict[str, int]:
    """``{instance_id: allocated}`` as stored, oldest first."""
    return {info.instance_id: info.allocated for info in await list_instances(pool)}


async def expected_split(pool: Pool, g: int, stale: float = STALE) -> dict[str, int]:
    """What allocate() gives over the rows that are active now, read independently."""
    rows = await pool.fetch(
        "SELECT instance_id, started_at, capacity_limit, safe_capacity, pressure_state"
        " FROM engine_worker_instance"
        " WHERE status = 'active' AND heartbeat_at >= now() - make_interval(secs => $1)",
        stale,
    )
    return allocate(g, [InstanceRow(**dict(r.items())) for r in rows])


async def set_stale(pool: Pool, instance_id: str, seconds: float = STALE + 1) -> None:
    await pool.execute(
        "UPDATE engine_worker_instance"
        " SET heartbeat_at = now() - make_interval(secs => $2) WHERE instance_id = $1",
        instance_id,
        seconds,
    )


# ---------------------------------------------------------------------------------------------
# Capacity query

Row = tuple[str, bool, int | None]


async def insert_limits(conn: Connection, models: list[Row], groups: list[Row]) -> None:
    for name, enabled, limit in models:
        await conn.execute(
            "INSERT INTO engine_model (name, enabled, concurrency_limit) VALUES ($1, $2, $3)",
            name,
            enabled,
            limit,
        )
    for key, enabled, limit in groups:
        await conn.execute(
            "INSERT INTO engine_group (key, enabled, concurrency_limit) VALUES ($1, $2, $3)",
            key,
            enabled,
            limit,
        )


@pytest.mark.parametrize(
    ("models", "groups", "hard_limit", "capacity"),
    [
        pytest.param([], [], 50, 0, id="no-models"),
        pytest.param([("a", False, 5)], [], 50, 0, id="only-disabled-model"),
        pytest.param(
            [("a", True, 3), ("b", True, 4), ("off", False, 100)], [], 0, 7, id="limited-models"
        ),
        pytest.param([("a", True, 3), ("b", True, None)], [], 40, 40, id="null-is-unlimited"),
        pytest.param([("a", True, 0)], [], 0, UNBOUNDED_FALLBACK, id="zero-is-unlimited"),
        pytest.param(
            [("a", True, 20), ("b", True, 30)],
            [("g1", True, 4), ("g2", True, 2), ("off", False, 1)],
            0,
            6,
            id="groups-bind",
        ),
        pytest.param(
            [("a", True, 5)], [("g1", True, 4), ("g2", True, None)], 0, 5, id="unlimited-group"
        ),
        pytest.param([("a", True, None)], [("g", False, 2)], 12, 12, id="hard-limit"),
        pytest.param([("a", True, 80)], [], 50, 50, id="capped"),
    ],
)
async def test_capacity_query_feeds_compute_capacity(
    database: Database,
    conn: Connection,
    models: list[Row],
    groups: list[Row],
    hard_limit: int,
    capacity: int,
) -> None:
    await insert_limits(conn, models, groups)

    snapshot = await load_capacity(database.coordination, hard_limit)

    assert snapshot.capacity == capacity
    # The query loses nothing compute_capacity needs: same result as from every row in Python.
    assert snapshot == compute_capacity(
        [ModelLimit(*m) for m in models], [GroupLimit(*g) for g in groups], hard_limit
    )
    # Works on a connection as well as on a pool.
    assert await load_capacity(conn, hard_limit) == snapshot


async def test_capacity_counts_limited_unlimited_and_disabled(
    database: Database, conn: Connection
) -> None:
    await insert_limits(
        conn,
        [("a", True, 3), ("b", True, None), ("c", True, -1), ("d", False, 9)],
        [("g1", True, 2), ("g2", True, 5), ("g3", False, None)],
    )

    snapshot = await load_capacity(database.coordination, 0)

    assert (snapshot.enabled_models, snapshot.unlimited_models, snapshot.model_desired) == (3, 2, 3)
    assert (snapshot.enabled_groups, snapshot.unlimited_groups, snapshot.group_desired) == (2, 0, 7)
    assert (snapshot.desired, snapshot.capacity, snapshot.capped) == (7, 7, False)


# ---------------------------------------------------------------------------------------------
# Registration and allocation


async def test_first_registration_inserts_the_row(database: Database) -> None:
    pool = database.coordination
    registration = Registration(
        instance_id="host:1:1",
        pod_uid="uid-1",
        pod_name="worker-0",
        site="eu",
        revision="r42",
        desired_capacity=10,
        capacity_limit=8,
        heartbeat_stale_after=STALE,
        load_mode="adaptive",
        safe_capacity=6,
        heavy_capacity=3,
        active_tasks=4,
        preparing_tasks=1,
        waiting_upstream_tasks=2,
        finalizing_tasks=1,
        pressure_state="elevated",
        pressure_reason="memory",
        load_sampled_at=datetime(2026, 1, 1, tzinfo=UTC),
    )

    allocation = await register_instance(pool, registration)

    assert allocation == Allocation(
        allocated=8,
        global_allocated=8,
        desired_capacity=10,
        active_instances=1,
        instance_id="host:1:1",
    )
    [info] = await list_instances(pool)
    assert isinstance(info, InstanceInfo)
    assert (info.pod_uid, info.pod_name, info.site, info.revision) == (
        "uid-1",
        "worker-0",
        "eu",
        "r42",
    )
    assert (info.desired_capacity, info.capacity_limit, info.allocated) == (10, 8, 8)
    assert (info.load_mode, info.safe_capacity, info.heavy_capacity) == ("adaptive", 6, 3)
    assert (
        info.active_tasks,
        info.preparing_tasks,
        info.waiting_upstream_tasks,
        info.finalizing_tasks,
    ) == (4, 1, 2, 1)
    assert (info.pressure_state, info.pressure_reason) == ("elevated", "memory")
    assert info.load_sampled_at == datetime(2026, 1, 1, tzinfo=UTC)
    assert (info.status, info.draining_at) == ("active", None)
    assert info.heartbeat_at == info.started_at
    assert 0 <= info.heartbeat_age < 5


async def test_reregistration_updates_load_and_heartbeat_and_keeps_started_at(
    database: Database,
) -> None:
    pool = database.coordination
    await register_instance(pool, reg("a"))
    await set_stale(pool, "a", seconds=10)  # pretend the last heartbeat was 10 s ago
    [before] = await list_instances(pool)

    await register_instance(
        pool,
        Registration(
            instance_id="a",
            desired_capacity=12,
            heartbeat_stale_after=STALE,
            active_tasks=3,
            pressure_state="critical",
        ),
    )

    [after] = await list_instances(pool)
    assert after.started_at == before.started_at
    assert after.heartbeat_at > before.heartbeat_at
    assert after.heartbeat_age < 5
    assert (after.desired_capacity, after.allocated, after.active_tasks) == (12, 12, 3)
    assert after.pressure_state == "critical"


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5])
async def test_each_registration_returns_the_callers_share(database: Database, n: int) -> None:
    pool = database.coordination
    g = 11
    ids = [f"i{k}" for k in range(n)]
    for k, instance_id in enumerate(ids):
        allocation = await register_instance(pool, reg(instance_id, g))
        # The caller's share of the split over the k + 1 instances registered so far.
        assert (
            allocation.allocated
            == allocate(
                g,
                [
                    InstanceRow(
                        i,
                        datetime(2026, 1, 1, tzinfo=UTC) + timedelta(seconds=j),
                        0,
                        None,
                        "normal",
                    )
                    for j, i in enumerate(ids[: k + 1])
                ],
            )[instance_id]
        )
        assert allocation.active_instances == k + 1
        assert allocation.global_allocated == g
        assert allocation.desired_capacity == g

    # Everyone heartbeats once more: each now sees the full split.
    final = {i: (await register_instance(pool, reg(i, g))).allocated for i in ids}
    shares = await stored(pool)
    assert final == shares
    assert sum(shares.values()) == g
    assert shares == await expected_split(pool, g)
    assert max(shares.values()) - min(shares.values()) <= 1


async def test_stored_split_is_computed_at_every_registration(database: Database) -> None:
    pool = database.coordination
    for instance_id in ("a", "b", "c"):
        await register_instance(pool, reg(instance_id, 10))

    # The last registration stored the whole split, not only its own share.
    assert await stored(pool) == {"a": 4, "b": 3, "c": 3}


async def test_per_instance_caps_bind_and_the_rest_is_spread(database: Database) -> None:
    pool = database.coordination
    await register_instance(pool, reg("a", 10, limit=2))
    await register_instance(pool, reg("b", 10))
    last = await register_instance(pool, reg("c", 10, limit=3))

    assert await stored(pool) == {"a": 2, "b": 5, "c": 3}
    assert (last.allocated, last.global_allocated, last.desired_capacity) == (3, 10, 10)


async def test_when_every_instance_is_capped_the_sum_is_the_sum_of_caps(
    database: Database,
) -> None:
    pool = database.coordination
    await register_instance(pool, reg("a", 10, limit=2))
    last = await register_instance(pool, reg("b", 10, limit=3))

    assert await stored(pool) == {"a": 2, "b": 3}
    # min(G, Σ caps): what an instance reports as its global capacity.
    assert (last.allocated, last.global_allocated, last.desired_capacity) == (3, 5, 10)


async def test_joining_instance_takes_its_share_and_others_shrink_at_their_next_turn(
    database: Database,
) -> None:
    pool = database.coordination
    assert (await register_instance(pool, reg("a", 10))).allocated == 10

    joined = await register_instance(pool, reg("b", 10))
    assert (joined.allocated, joined.active_instances) == (5, 2)
    # a still runs 10 until its own next registration (each applies only its own share).
    assert (await register_instance(pool, reg("a", 10))).allocated == 5
    assert await stored(pool) == {"a": 5, "b": 5}


async def test_global_capacity_change_takes_effect_at_the_callers_registration(
    database: Database,
) -> None:
    pool = database.coordination
    await register_instance(pool, reg("a", 10))
    await register_instance(pool, reg("b", 10))

    allocation = await register_instance(pool, reg("a", 4))

    assert (allocation.allocated, allocation.global_allocated) == (2, 4)
    assert await stored(pool) == {"a": 2, "b": 2}


async def test_stale_instance_drops_out_and_its_share_goes_to_zero(database: Database) -> None:
    pool = database.coordination
    for instance_id in ("a", "b", "c"):
        await register_instance(pool, reg(instance_id, 9))
    assert await stored(pool) == {"a": 3, "b": 3, "c": 3}

    await set_stale(pool, "c")
    allocation = await register_instance(pool, reg("a", 9))

    assert (allocation.allocated, allocation.active_instances) == (5, 2)
    assert await stored(pool) == {"a": 5, "b": 4, "c": 0}


async def test_instance_just_inside_the_heartbeat_window_stays_active(
    database: Database,
) -> None:
    pool = database.coordination
    await register_instance(pool, reg("a", 8))
    await register_instance(pool, reg("b", 8))

    await set_stale(pool, "b", seconds=STALE - 5)
    allocation = await register_instance(pool, reg("a", 8))

    assert allocation.active_instances == 2
    assert await stored(pool) == {"a": 4, "b": 4}


async def test_stale_instance_rejoins_when_it_registers_again(database: Database) -> None:
    pool = database.coordination
    await register_instance(pool, reg("a", 8))
    await register_instance(pool, reg("b", 8))
    await set_stale(pool, "b")
    await register_instance(pool, reg("a", 8))
    assert await stored(pool) == {"a": 8, "b": 0}

    allocation = await register_instance(pool, reg("b", 8))

    assert (allocation.allocated, allocation.active_instances) == (4, 2)
    assert await stored(pool) == {"a": 4, "b": 4}


async def test_draining_instance_gets_zero_and_the_others_absorb_its_share(
    database: Database,
) -> None:
    pool = database.coordination
    for instance_id in ("a", "b", "c"):
        await register_instance(pool, reg(instance_id, 9))

    assert await mark_draining(pool, "b") is True
    infos = {info.instance_id: info for info in await list_instances(pool)}
    assert (infos["b"].status, infos["b"].allocated) == ("draining", 0)
    assert infos["b"].draining_at is not None

    allocation = await register_instance(pool, reg("a", 9))
    assert (allocation.allocated, allocation.active_instances) == (5, 2)
    assert await stored(pool) == {"a": 5, "b": 0, "c": 4}


async def test_draining_instance_stays_draining_when_it_registers_again(
    database: Database,
) -> None:
    pool = database.coordination
    await register_instance(pool, reg("a", 6))
    await register_instance(pool, reg("b", 6))
    await mark_draining(pool, "b")

    # A late refresh tick of a stopping instance must not bring it back.
    allocation = await register_instance(pool, reg("b", 6))

    assert (allocation.allocated, allocation.global_allocated) == (0, 6)
    assert allocation.active_instances == 1
    infos = {info.instance_id: info for info in await list_instances(pool)}
    assert (infos["b"].status, infos["b"].allocated) == ("draining", 0)
    assert infos["a"].allocated == 6


async def test_last_instance_draining_leaves_an_empty_active_set(database: Database) -> None:
    pool = database.coordination
    await register_instance(pool, reg("a", 6))
    await mark_draining(pool, "a")

    allocation = await register_instance(pool, reg("a", 6))

    assert allocation == Allocation(
        allocated=0, global_allocated=0, desired_capacity=6, active_instances=0, instance_id="a"
    )
    assert await stored(pool) == {"a": 0}


async def test_mark_draining_is_idempotent_and_keeps_the_first_draining_at(
    database: Database,
) -> None:
    pool = database.coordination
    await register_instance(pool, reg("a"))
    assert await mark_draining(pool, "a") is True
    [first] = await list_instances(pool)

    assert await mark_draining(pool, "a") is True

    [second] = await list_instances(pool)
    assert second.draining_at == first.draining_at
    assert second.status == "draining"


async def test_mark_draining_unknown_instance_returns_false(database: Database) -> None:
    assert await mark_draining(database.coordination, "never-registered") is False
    assert await list_instances(database.coordination) == []


async def test_concurrent_registrations_end_with_a_consistent_split(database: Database) -> None:
    pool = database.coordination
    g = 17
    ids = [f"w{k}" for k in range(5)]
    results: dict[str, Allocation] = {}

    async def one(instance_id: str) -> None:
        results[instance_id] = await register_instance(pool, reg(instance_id, g))

    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            for instance_id in ids:
                nursery.start_soon(one, instance_id)

    # Serialized by the advisory lock: each registration saw every earlier one and no later
    # one, so the active-set sizes are exactly 1..5 in some order.
    assert sorted(a.active_instances for a in results.values()) == [1, 2, 3, 4, 5]
    shares = await stored(pool)
    assert sum(shares.values()) == g
    assert shares == await expected_split(pool, g)
    # The last one to commit saw all five and returned its share of the final split.
    [last] = [a for a in results.values() if a.active_instances == 5]
    assert last.allocated == shares[last.instance_id]


async def test_extra_units_go_to_the_oldest_instances(database: Database) -> None:
    pool = database.coordination
    for instance_id in ("z", "y", "x"):
        await register_instance(pool, reg(instance_id, 8))

    # Registration order, not id order: z is the oldest.
    assert list((await stored(pool)).items()) == [("z", 3), ("y", 3), ("x", 2)]


async def test_equal_start_times_are_ordered_by_instance_id(database: Database) -> None:
    pool = database.coordination
    for instance_id in ("c", "a", "b"):
        await register_instance(pool, reg(instance_id, 7))
    await pool.execute("UPDATE engine_worker_instance SET started_at = '2026-01-01T00:00:00Z'")

    for instance_id in ("c", "a", "b"):
        await register_instance(pool, reg(instance_id, 7))

    assert await stored(pool) == {"a": 3, "b": 2, "c": 2}


async def test_pressure_caps_only_when_asked(database: Database) -> None:
    pool = database.coordination
    await register_instance(pool, reg("a", 10, safe=2, pressure="critical"))
    await register_instance(pool, reg("b", 10))
    assert await stored(pool) == {"a": 5, "b": 5}

    allocation = await register_instance(pool, reg("b", 10), use_pressure=True)

    assert allocation.allocated == 8
    assert await stored(pool) == {"a": 2, "b": 8}


async def test_zero_capacity_allocates_nothing(database: Database) -> None:
    pool = database.coordination
    await register_instance(pool, reg("a", 5))

    allocation = await register_instance(pool, reg("a", 0))

    assert (allocation.allocated, allocation.global_allocated, allocation.active_instances) == (
        0,
        0,
        1,
    )
    assert await stored(pool) == {"a": 0}


# ---------------------------------------------------------------------------------------------
# Listing and hygiene


async def test_list_instances_orders_oldest_first(database: Database) -> None:
    pool = database.coordination
    for instance_id in ("m", "k", "l"):
        await register_instance(pool, reg(instance_id))
    await mark_draining(pool, "k")

    infos = await list_instances(pool)

    assert [(i.instance_id, i.status) for i in infos] == [
        ("m", "active"),
        ("k", "draining"),
        ("l", "active"),
    ]


async def test_delete_stale_instances_removes_only_long_silent_rows(database: Database) -> None:
    pool = database.coordination
    for instance_id in ("old", "drained", "live"):
        await register_instance(pool, reg(instance_id))
    await mark_draining(pool, "drained")
    await set_stale(pool, "old", seconds=25 * 3600)
    await set_stale(pool, "drained", seconds=25 * 3600)
    await set_stale(pool, "live", seconds=23 * 3600)

    deleted = await delete_stale_instances(pool)

    assert sorted(deleted) == ["drained", "old"]
    assert [i.instance_id for i in await list_instances(pool)] == ["live"]
    assert await delete_stale_instances(pool) == []


# ---------------------------------------------------------------------------------------------
# Served models


async def test_registration_stores_the_served_models_and_list_returns_them(
    database: Database,
) -> None:
    pool = database.coordination
    await register_instance(pool, attrs.evolve(reg("every"), models=None))
    await register_instance(pool, attrs.evolve(reg("some"), models=["flux", "echo", "echo"]))
    await register_instance(pool, attrs.evolve(reg("none"), models=()))

    served = {i.instance_id: i.models for i in await list_instances(pool)}
    assert served == {"every": None, "some": ("echo", "flux"), "none": ()}
    stored_models = {
        r["instance_id"]: r["models"]
        for r in await pool.fetch("SELECT instance_id, models FROM engine_worker_instance")
    }
    assert stored_models == {"every": None, "some": ["echo", "flux"], "none": []}

    # A heartbeat writes what the instance serves now.
    await register_instance(pool, attrs.evolve(reg("some"), models=["echo"]))
    await register_instance(pool, attrs.evolve(reg("every"), models=["flux"]))
    served = {i.instance_id: i.models for i in await list_instances(pool)}
    assert served == {"every": ("flux",), "some": ("echo",), "none": ()}


async def test_unserved_models_counts_only_live_active_instances(database: Database) -> None:
    pool = database.coordination
    asked = ["echo", "flux", "sd", "echo"]
    assert await unserved_models(pool, asked, STALE) == ["echo", "flux", "sd"]
    assert await unserved_models(pool, [], STALE) == []

    await register_instance(pool, attrs.evolve(reg("echo-1"), models=["echo"]))
    await register_instance(pool, attrs.evolve(reg("sim-only"), models=()))
    assert await unserved_models(pool, asked, STALE) == ["flux", "sd"]

    # A stale or draining instance serves nothing.
    await register_instance(pool, attrs.evolve(reg("flux-stale"), models=["flux"]))
    await set_stale(pool, "flux-stale")
    await register_instance(pool, attrs.evolve(reg("sd-draining"), models=["sd"]))
    await mark_draining(pool, "sd-draining")
    assert await unserved_models(pool, asked, STALE) == ["flux", "sd"]

    # An instance registered with models NULL serves every model.
    await register_instance(pool, attrs.evolve(reg("all"), models=None))
    assert await unserved_models(pool, asked, STALE) == []
    await set_stale(pool, "all")
    assert await unserved_models(pool, asked, STALE) == ["flux", "sd"]


def test_unserved_models_rejects_a_non_positive_window() -> None:
    with pytest.raises(ValueError, match=r"^stale_after must be > 0, got 0$"):
        trio.run(unserved_models, None, ["echo"], 0)  # type: ignore[arg-type]


def test_from_environment_passes_the_served_models() -> None:
    def build(models: list[str] | None) -> Registration:
        return Registration.from_environment(
            "i",
            desired_capacity=1,
            capacity_limit=0,
            heartbeat_stale_after=1.0,
            environ={},
            models=models,
        )

    assert build(None).models is None
    assert build(["b", "a"]).models == ("a", "b")
    assert build([]).models == ()


@pytest.mark.parametrize(
    ("models", "message"),
    [("echo", "not a str"), (["echo", ""], "non-empty str"), ([1], "non-empty str")],
)
def test_registration_rejects_bad_models(models: object, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Registration(
            instance_id="i",
            desired_capacity=1,
            heartbeat_stale_after=1.0,
            models=models,  # type: ignore[arg-type]
        )


def test_delete_stale_instances_rejects_a_non_positive_age() -> None:
    with pytest.raises(ValueError, match=r"^older_than must be > 0, got 0$"):
        trio.run(delete_stale_instances, None, 0)  # type: ignore[arg-type]


# ---------------------------------------------------------------------------------------------
# Registration input

ENV = {
    "POD_UID": "  uid-7\n",
    "POD_NAME": " worker-3 ",
    "EASYAI_SITE": "\teu-west ",
    "AI_GATEWAY_REVISION": " abc123 ",
}


def test_from_environment_trims_and_reports_legacy_load_without_a_controller() -> None:
    registration = Registration.from_environment(
        "host:1:2",
        desired_capacity=20,
        capacity_limit=6,
        heartbeat_stale_after=30.0,
        environ=ENV,
    )

    assert registration == Registration(
        instance_id="host:1:2",
        pod_uid="uid-7",
        pod_name="worker-3",
        site="eu-west",
        revision="abc123",
        desired_capacity=20,
        capacity_limit=6,
        heartbeat_stale_after=30.0,
        load_mode="legacy",
        safe_capacity=6,
        heavy_capacity=6,
        pressure_state="normal",
        pressure_reason="",
        load_sampled_at=None,
    )


def test_from_environment_missing_variables_are_empty() -> None:
    registration = Registration.from_environment(
        "i", desired_capacity=1, capacity_limit=0, heartbeat_stale_after=1.0, environ={}
    )
    assert (registration.pod_uid, registration.pod_name) == ("", "")
    assert (registration.site, registration.revision) == ("", "")


def test_from_environment_copies_the_load_snapshot() -> None:
    load = LoadSnapshot(
        mode="adaptive",
        claim_limit=10,
        safe_capacity=7,
        heavy_limit=3,
        active=6,
        preparing=2,
        waiting_upstream=3,
        finalizing=1,
        pressure_state=PressureState.ELEVATED,
        pressure_reason="cpu",
        sampled_at=100.0,
    )
    before = datetime.now(UTC)

    registration = Registration.from_environment(
        "i",
        desired_capacity=10,
        capacity_limit=0,
        heartbeat_stale_after=30.0,
        load=load,
        load_clock_now=104.0,
        environ=ENV,
    )

    assert registration.load_mode == "adaptive"
    assert (registration.safe_capacity, registration.heavy_capacity) == (7, 3)
    assert (
        registration.active_tasks,
        registration.preparing_tasks,
        registration.waiting_upstream_tasks,
        registration.finalizing_tasks,
    ) == (6, 2, 3, 1)
    assert (registration.pressure_state, registration.pressure_reason) == ("elevated", "cpu")
    assert type(registration.pressure_state) is str
    # Sampled 4 s before "now" on the controller's clock.
    assert registration.load_sampled_at is not None
    age = before - registration.load_sampled_at
    assert timedelta(seconds=3.5) < age < timedelta(seconds=4.5)


def test_from_environment_without_a_sample_has_no_sample_time() -> None:
    load = LoadSnapshot(
        mode="legacy",
        claim_limit=0,
        safe_capacity=0,
        heavy_limit=0,
        active=0,
        preparing=0,
        waiting_upstream=0,
        finalizing=0,
        pressure_state=PressureState.NORMAL,
        pressure_reason="",
        sampled_at=None,
    )
    registration = Registration.from_environment(
        "i", desired_capacity=1, capacity_limit=0, heartbeat_stale_after=1.0, load=load, environ={}
    )
    assert registration.load_sampled_at is None


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("desired_capacity", -1, r"^desired_capacity must be >= 0, got -1$"),
        ("capacity_limit", -2, r"^capacity_limit must be >= 0, got -2$"),
        ("heartbeat_stale_after", 0.0, r"^heartbeat_stale_after must be > 0, got 0.0$"),
        ("active_tasks", -1, r"^active_tasks must be >= 0, got -1$"),
    ],
)
def test_registration_rejects_bad_values(field: str, value: float, message: str) -> None:
    fields: dict[str, object] = {
        "instance_id": "i",
        "desired_capacity": 1,
        "heartbeat_stale_after": 1.0,
        field: value,
    }
    with pytest.raises(ValueError, match=message):
        Registration(**fields)  # type: ignore[arg-type]


def test_registration_rejects_an_empty_instance_id() -> None:
    with pytest.raises(ValueError, match="instance_id"):
        Registration(instance_id="", desired_capacity=1, heartbeat_stale_after=1.0)
