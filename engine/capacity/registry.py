"""The worker-instance registry: capacity load, registration (the heartbeat) and draining.

The database side of capacity, registration and draining. Each refresh tick a worker

1. reads the global capacity with :func:`load_capacity` (one query over the model and
   group limits, fed to :func:`~engine.capacity.snapshot.compute_capacity`), then
2. calls :func:`register_instance` with that figure and its load. Registration *is* the
   heartbeat: it upserts the instance's row, splits the global capacity over the live instances
   (:func:`~engine.capacity.allocation.allocate`), stores every share, and returns this
   instance's share, which becomes its queue generation's ``max_workers`` and its load claim
   limit.

At shutdown :func:`mark_draining` takes the instance out of the split; the others
absorb its share at their next registration.

Invariants:

- Every writer (registration, draining) runs under one transaction-level advisory lock
  (:data:`REGISTRY_LOCK_KEY`), so the split stored after a registration is always computed from
  the rows as they are after every earlier write. The lock is held for four short statements.
- The stored ``allocated`` values are the last registration's split: they sum to
  ``min(G, Σ caps)`` over the active set, and rows outside it (stale or draining) hold 0.
- Each instance applies only its own share, at its own tick, so while instances join or leave
  the cluster may be over- or under-allocated for up to one refresh period.
"""

from __future__ import annotations

import os
import time
import zlib
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime, timedelta
from typing import Any, Final, Protocol

import attrs

from engine.capacity.allocation import InstanceRow, allocate
from engine.capacity.snapshot import CapacitySnapshot, GroupLimit, ModelLimit, compute_capacity
from engine.db.bridge import Pool, Record
from engine.db.sqlfiles import QUERIES
from engine.load.controller import LoadSnapshot

__all__ = [
    "DEFAULT_STALE_ROW_RETENTION",
    "REGISTRY_LOCK_KEY",
    "Allocation",
    "InstanceInfo",
    "Registration",
    "delete_stale_instances",
    "list_instances",
    "load_capacity",
    "mark_draining",
    "register_instance",
    "unserved_models",
]

REGISTRY_LOCK_KEY: Final = zlib.crc32(b"engine.capacity.registry")
"""Advisory lock key serializing registry writers (a stable hash of a fixed name, as
:data:`engine.db.migrate.MIGRATION_LOCK_KEY`)."""

DEFAULT_STALE_ROW_RETENTION: Final = 24 * 3600.0
"""Seconds after its last heartbeat a registry row is deleted by :func:`delete_stale_instances`.

A day: long past the heartbeat window (``worker.heartbeat_stale_factor`` refresh intervals,
30 s by default), and long enough to inspect a crashed pod's last report."""

_NORMAL_PRESSURE: Final = "normal"
_LEGACY_MODE: Final = "legacy"
_ACTIVE: Final = "active"

_CAPACITY_LIMITS_GET = QUERIES["capacity_limits_get"]
_LOCK = QUERIES["worker_instance_lock"]
_UPSERT = QUERIES["worker_instance_upsert"]
_LIST_ACTIVE = QUERIES["worker_instance_list_active"]
_SET_ALLOCATED_MANY = QUERIES["worker_instance_set_allocated_many"]
_MARK_DRAINING = QUERIES["worker_instance_mark_draining"]
_LIST = QUERIES["worker_instance_list"]
_DELETE_STALE = QUERIES["worker_instance_delete_stale"]
_UNSERVED = QUERIES["worker_instance_unserved_models"]

# Environment variables the registration reports, trimmed: the pod's identity, its site and
# the deployed revision, as the deployment sets them.
_ENV_POD_UID: Final = "POD_UID"
_ENV_POD_NAME: Final = "POD_NAME"
_ENV_SITE: Final = "EASYAI_SITE"
_ENV_REVISION: Final = "AI_GATEWAY_REVISION"


class _Fetcher(Protocol):
    """Anything that runs a query and returns its rows: a :class:`Pool` or a ``Connection``."""

    async def fetch(self, query: str, *args: Any) -> list[Record]:
        """Run ``query`` and return every row."""
        ...


async def load_capacity(conn: _Fetcher, hard_limit: int) -> CapacitySnapshot:
    """Read the model and group limits in one query and compute the global capacity.

    Args:
        conn: a pool or connection on the coordination database.
        hard_limit: the cluster-wide cap (``WorkerConfig.hard_limit``); <= 0 means none.

    Returns:
        The snapshot; its ``capacity`` is the global figure to pass to registration as
        ``desired_capacity``.

    Raises:
        DatabaseError: the query failed.
    """
    models: list[ModelLimit] = []
    groups: list[GroupLimit] = []
    for row in await conn.fetch(_CAPACITY_LIMITS_GET):
        if row["kind"] == "model":
            models.append(ModelLimit(row["key"], row["enabled"], row["concurrency_limit"]))
        else:
            groups.append(GroupLimit(row["key"], row["enabled"], row["concurrency_limit"]))
    return compute_capacity(models, groups, hard_limit)


def _non_negative(_instance: object, attribute: attrs.Attribute[int], value: int) -> None:
    """attrs validator: an int >= 0."""
    if value < 0:
        raise ValueError(f"{attribute.name} must be >= 0, got {value}")


def _positive_seconds(_instance: object, attribute: attrs.Attribute[float], value: float) -> None:
    """attrs validator: a number of seconds > 0."""
    if not value > 0:
        raise ValueError(f"{attribute.name} must be > 0, got {value}")


def _env(environ: Mapping[str, str], name: str) -> str:
    return environ.get(name, "").strip()


def _to_models(value: Iterable[str] | None) -> tuple[str, ...] | None:
    """attrs converter: served models as a sorted tuple without repeats; None stays None."""
    if value is None:
        return None
    if isinstance(value, str):
        # A bare string is iterable too; serving its letters would be a silent bug.
        raise ValueError("models must be a collection of model names, not a str")
    listed = list(value)
    for model in listed:
        if not isinstance(model, str) or not model:
            raise ValueError(f"model names must be non-empty str, got {model!r}")
    return tuple(sorted(set(listed)))


@attrs.frozen(kw_only=True)
class Registration:
    """What one instance reports at each registration.

    Attributes:
        instance_id: the registry key, unique per process start.
        pod_uid: ``$POD_UID``, trimmed; ``""`` when unset.
        pod_name: ``$POD_NAME``, trimmed.
        site: ``$EASYAI_SITE``, trimmed.
        revision: ``$AI_GATEWAY_REVISION``, trimmed.
        desired_capacity: the global capacity this instance computed
            (:attr:`CapacitySnapshot.capacity`); the figure that gets split.
        capacity_limit: the per-instance hard limit; 0 means none.
        heartbeat_stale_after: seconds after which an instance that has not registered drops
            out of the split (``worker.refresh_interval × worker.heartbeat_stale_factor``).
        load_mode: the load controller's mode.
        safe_capacity: the controller's safe capacity (the "active limit"); ``None`` if unknown.
        heavy_capacity: the controller's heavy-phase limit; ``None`` if unknown.
        active_tasks: leases held.
        preparing_tasks: leases in ``preparing``.
        waiting_upstream_tasks: leases in ``waiting_upstream``.
        finalizing_tasks: leases in ``finalizing``.
        pressure_state: ``"normal"``, ``"elevated"`` or ``"critical"``.
        pressure_reason: the dominant resource under pressure, ``""`` when normal.
        load_sampled_at: wall-clock time of the load sample, ``None`` before the first.
        models: the models whose live tasks this instance claims (those it has a provider
            for); ``None`` means every model (it claims every job), ``()`` no live model (it
            claims only jobs that name no model: simulation tasks). Sorted, without repeats.
    """

    instance_id: str = attrs.field(validator=attrs.validators.min_len(1))
    pod_uid: str = ""
    pod_name: str = ""
    site: str = ""
    revision: str = ""
    desired_capacity: int = attrs.field(validator=_non_negative)
    capacity_limit: int = attrs.field(default=0, validator=_non_negative)
    heartbeat_stale_after: float = attrs.field(validator=_positive_seconds)
    load_mode: str = _LEGACY_MODE
    safe_capacity: int | None = None
    heavy_capacity: int | None = None
    active_tasks: int = attrs.field(default=0, validator=_non_negative)
    preparing_tasks: int = attrs.field(default=0, validator=_non_negative)
    waiting_upstream_tasks: int = attrs.field(default=0, validator=_non_negative)
    finalizing_tasks: int = attrs.field(default=0, validator=_non_negative)
    pressure_state: str = _NORMAL_PRESSURE
    pressure_reason: str = ""
    load_sampled_at: datetime | None = None
    models: tuple[str, ...] | None = attrs.field(default=None, converter=_to_models)

    @classmethod
    def from_environment(
        cls,
        instance_id: str,
        *,
        desired_capacity: int,
        capacity_limit: int,
        heartbeat_stale_after: float,
        load: LoadSnapshot | None = None,
        load_clock_now: float | None = None,
        environ: Mapping[str, str] | None = None,
        models: Iterable[str] | None = None,
    ) -> Registration:
        """Build the registration from the environment and the load controller's snapshot.

        Pod identity comes from ``POD_UID``, ``POD_NAME``, ``EASYAI_SITE`` and
        ``AI_GATEWAY_REVISION``, trimmed. Without a load controller (``load=None``) the instance
        reports no load: mode ``legacy``, safe and heavy capacity equal to
        ``capacity_limit``, no tasks, pressure ``normal``.

        Args:
            instance_id: the registry key.
            desired_capacity: the global capacity from :func:`load_capacity`.
            capacity_limit: the per-instance hard limit (``WorkerConfig.instance_hard_limit``).
            heartbeat_stale_after: seconds; ``refresh_interval * heartbeat_stale_factor``.
            load: the load controller's snapshot, if there is a controller.
            load_clock_now: the controller clock's reading now. ``load.sampled_at`` is on that
                monotonic timebase, so it becomes wall time as
                ``utcnow - (load_clock_now - sampled_at)``. Defaults to ``time.monotonic()``,
                the timebase of the production ``MonotonicClock``.
            environ: the environment to read; defaults to ``os.environ``.
            models: the models this instance serves (:attr:`models`); None for every model.

        Raises:
            ValueError: a negative capacity or count, an empty id, a stale-after <= 0, or a
                bad model name.
        """
        env = os.environ if environ is None else environ
        legacy = cls(
            instance_id=instance_id,
            pod_uid=_env(env, _ENV_POD_UID),
            pod_name=_env(env, _ENV_POD_NAME),
            site=_env(env, _ENV_SITE),
            revision=_env(env, _ENV_REVISION),
            desired_capacity=desired_capacity,
            capacity_limit=capacity_limit,
            heartbeat_stale_after=heartbeat_stale_after,
            load_mode=_LEGACY_MODE,
            safe_capacity=capacity_limit,
            heavy_capacity=capacity_limit,
            models=models,
        )
        if load is None:
            return legacy
        sampled_at: datetime | None = None
        if load.sampled_at is not None:
            clock_now = time.monotonic() if load_clock_now is None else load_clock_now
            age = max(0.0, clock_now - load.sampled_at)
            sampled_at = datetime.now(UTC) - timedelta(seconds=age)
        return attrs.evolve(
            legacy,
            load_mode=str(load.mode),
            safe_capacity=load.safe_capacity,
            heavy_capacity=load.heavy_limit,
            active_tasks=load.active,
            preparing_tasks=load.preparing,
            waiting_upstream_tasks=load.waiting_upstream,
            finalizing_tasks=load.finalizing,
            pressure_state=str(load.pressure_state),
            pressure_reason=load.pressure_reason,
            load_sampled_at=sampled_at,
        )


@attrs.frozen
class Allocation:
    """The answer to one registration: this instance's share and the totals of the split.

    Attributes:
        allocated: this instance's share: its generation's ``max_workers`` and load claim
            limit. 0 when the instance is not in the active set (draining).
        global_allocated: the sum of all shares; below ``desired_capacity`` when per-instance
            caps bind, so it is the capacity the cluster actually has (the metrics report it).
        desired_capacity: the global capacity that was split.
        active_instances: the size of the active set, this instance included when active.
        instance_id: the registered instance.
    """

    allocated: int
    global_allocated: int
    desired_capacity: int
    active_instances: int
    instance_id: str


@attrs.frozen
class InstanceInfo:
    """One registry row, for status output and inspection.

    Attributes mirror the ``engine_worker_instance`` columns; ``heartbeat_age`` is seconds since
    the last heartbeat, measured by the database's clock; ``models`` is what the instance serves
    (:attr:`Registration.models`: ``None`` for every model).
    """

    instance_id: str
    pod_uid: str
    pod_name: str
    site: str
    revision: str
    desired_capacity: int
    capacity_limit: int
    allocated: int
    load_mode: str
    safe_capacity: int | None
    heavy_capacity: int | None
    active_tasks: int
    preparing_tasks: int
    waiting_upstream_tasks: int
    finalizing_tasks: int
    pressure_state: str
    pressure_reason: str
    load_sampled_at: datetime | None
    status: str
    heartbeat_at: datetime
    started_at: datetime
    draining_at: datetime | None
    heartbeat_age: float
    models: tuple[str, ...] | None = attrs.field(default=None, converter=_to_models)


async def register_instance(
    pool: Pool,
    registration: Registration,
    *,
    use_pressure: bool = False,
) -> Allocation:
    """Register (or heartbeat) one instance and split the global capacity.

    One transaction, serialized against every other registry writer by
    ``pg_advisory_xact_lock(REGISTRY_LOCK_KEY)``:

    1. upsert the row: ``heartbeat_at = now()``; ``started_at`` kept; a draining row stays
       draining;
    2. read the active set A (``status = 'active'`` and a heartbeat within
       ``heartbeat_stale_after``), ordered by ``(started_at, instance_id)``;
    3. G = ``registration.desired_capacity``. It could also be the max over A; we take the
       caller's figure because every instance computes it from the same model and group tables,
       so the figures agree in steady state, and a change of limits takes effect at the very
       next registration instead of waiting for every row to be rewritten;
    4. split G over A with :func:`~engine.capacity.allocation.allocate`;
    5. store every share in one statement, and 0 for every row outside A.

    Args:
        pool: the coordination pool.
        registration: what this instance reports.
        use_pressure: also cap an instance at its ``safe_capacity`` while its pressure state is
            not ``normal``. Off by default: the load controller
            already enforces the safe capacity locally, and capping the allocation too would
            keep it from growing back until pressure clears.

    Returns:
        This instance's share and the split's totals.

    Raises:
        DatabaseError: a query failed; the transaction is rolled back and nothing is stored.
    """
    reg = registration
    async with pool.transaction() as conn:
        # Taken before the upsert, so the split below sees every earlier writer's commit
        # (READ COMMITTED takes a fresh snapshot per statement).
        await conn.execute(_LOCK, REGISTRY_LOCK_KEY)
        await conn.execute(
            _UPSERT,
            reg.instance_id,
            reg.pod_uid,
            reg.pod_name,
            reg.site,
            reg.revision,
            reg.desired_capacity,
            reg.capacity_limit,
            reg.load_mode,
            reg.safe_capacity,
            reg.heavy_capacity,
            reg.active_tasks,
            reg.preparing_tasks,
            reg.waiting_upstream_tasks,
            reg.finalizing_tasks,
            reg.pressure_state,
            reg.pressure_reason,
            reg.load_sampled_at,
            None if reg.models is None else list(reg.models),
        )
        active = [
            InstanceRow(
                instance_id=row["instance_id"],
                started_at=row["started_at"],
                capacity_limit=row["capacity_limit"],
                safe_capacity=row["safe_capacity"],
                pressure_state=row["pressure_state"],
            )
            for row in await conn.fetch(_LIST_ACTIVE, float(reg.heartbeat_stale_after))
        ]
        shares = allocate(reg.desired_capacity, active, use_pressure=use_pressure)
        await conn.execute(_SET_ALLOCATED_MANY, list(shares), list(shares.values()))
    return Allocation(
        allocated=shares.get(reg.instance_id, 0),
        global_allocated=sum(shares.values()),
        desired_capacity=reg.desired_capacity,
        active_instances=len(shares),
        instance_id=reg.instance_id,
    )


async def mark_draining(pool: Pool, instance_id: str) -> bool:
    """Take an instance out of the split at shutdown.

    Sets ``status = 'draining'``, ``draining_at`` (the first time only) and ``allocated = 0``,
    under the registry lock so a registration in flight cannot write a share back over it. The
    remaining instances absorb the share at their next registration. The caller bounds this
    with ``WorkerConfig.mark_draining_timeout`` (5 s by default).

    Returns:
        ``True`` if the row exists; ``False`` if the instance never registered (e.g. in client
        mode): there was nothing to take out.

    Raises:
        DatabaseError: the update failed.
    """
    async with pool.transaction() as conn:
        await conn.execute(_LOCK, REGISTRY_LOCK_KEY)
        row = await conn.fetchrow(_MARK_DRAINING, instance_id)
    return row is not None


async def list_instances(pool: _Fetcher) -> list[InstanceInfo]:
    """Every registry row, oldest first, for status output.

    Raises:
        DatabaseError: the query failed.
    """
    return [InstanceInfo(**dict(row.items())) for row in await pool.fetch(_LIST)]


async def delete_stale_instances(
    pool: _Fetcher, older_than: float = DEFAULT_STALE_ROW_RETENTION
) -> list[str]:
    """Delete registry rows whose last heartbeat is more than ``older_than`` seconds old.

    Hygiene only: such rows are already outside every split and hold 0. Safe to run from any
    instance at any time, concurrently.

    Returns:
        The ids of the deleted rows.

    Raises:
        ValueError: ``older_than`` is not positive.
        DatabaseError: the delete failed.
    """
    if not older_than > 0:
        raise ValueError(f"older_than must be > 0, got {older_than}")
    return [row["instance_id"] for row in await pool.fetch(_DELETE_STALE, float(older_than))]


async def unserved_models(pool: _Fetcher, models: Iterable[str], stale_after: float) -> list[str]:
    """Which of ``models`` no live instance serves, sorted.

    Live means as in the split: ``status = 'active'`` and a heartbeat within ``stale_after``
    seconds. An instance registered with ``models = None`` serves every model. Only registered
    instances count: an engine embedded in an application without registering is not seen.

    Raises:
        ValueError: ``stale_after`` is not positive.
        DatabaseError: the query failed.
    """
    if not stale_after > 0:
        raise ValueError(f"stale_after must be > 0, got {stale_after}")
    names = sorted(set(models))
    if not names:
        return []
    return [row["model"] for row in await pool.fetch(_UNSERVED, names, float(stale_after))]
