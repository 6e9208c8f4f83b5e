-- Table engine_worker_instance: the worker-instance registry (see docs/operations.md,
-- "Several instances"). Every writer runs under worker_instance_lock, so registrations and
-- draining never interleave; reads for status output need no lock.

-- name: worker_instance_lock
-- Serialize registry writers until the transaction ends. $1: the registry lock key.
SELECT pg_advisory_xact_lock($1);

-- name: worker_instance_upsert
-- Register or heartbeat one instance (a registration's first step). $1 instance_id, $2 pod_uid,
-- $3 pod_name, $4 site, $5 revision, $6 desired_capacity, $7 capacity_limit, $8 load_mode,
-- $9 safe_capacity, $10 heavy_capacity, $11 active_tasks, $12 preparing_tasks,
-- $13 waiting_upstream_tasks, $14 finalizing_tasks, $15 pressure_state, $16 pressure_reason,
-- $17 load_sampled_at, $18 models (text[]; NULL = every model). Returns the row's status and
-- started_at after the write.
INSERT INTO engine_worker_instance AS w (
    instance_id, pod_uid, pod_name, site, revision, desired_capacity, capacity_limit,
    load_mode, safe_capacity, heavy_capacity, active_tasks, preparing_tasks,
    waiting_upstream_tasks, finalizing_tasks, pressure_state, pressure_reason, load_sampled_at,
    models, status, heartbeat_at, started_at
)
VALUES (
    $1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18::text[],
    'active', now(), now()
)
ON CONFLICT (instance_id) DO UPDATE
    SET pod_uid = EXCLUDED.pod_uid,
        pod_name = EXCLUDED.pod_name,
        site = EXCLUDED.site,
        revision = EXCLUDED.revision,
        desired_capacity = EXCLUDED.desired_capacity,
        capacity_limit = EXCLUDED.capacity_limit,
        load_mode = EXCLUDED.load_mode,
        safe_capacity = EXCLUDED.safe_capacity,
        heavy_capacity = EXCLUDED.heavy_capacity,
        active_tasks = EXCLUDED.active_tasks,
        preparing_tasks = EXCLUDED.preparing_tasks,
        waiting_upstream_tasks = EXCLUDED.waiting_upstream_tasks,
        finalizing_tasks = EXCLUDED.finalizing_tasks,
        pressure_state = EXCLUDED.pressure_state,
        pressure_reason = EXCLUDED.pressure_reason,
        load_sampled_at = EXCLUDED.load_sampled_at,
        models = EXCLUDED.models,
        heartbeat_at = now()
    -- status, draining_at, started_at and allocated are kept: a draining instance stays
    -- draining, and started_at orders the split, so it must not move.
RETURNING w.status, w.started_at;

-- name: worker_instance_list_active
-- The active set A: live rows, oldest first, ties broken by id so every instance
-- computes the same order. $1: heartbeat stale-after, in seconds.
SELECT instance_id, started_at, capacity_limit, safe_capacity, pressure_state
FROM engine_worker_instance
WHERE status = 'active'
  AND heartbeat_at >= now() - make_interval(secs => $1)
ORDER BY started_at, instance_id;

-- name: worker_instance_set_allocated_many
-- Store a whole split in one statement: each listed instance gets its share and
-- every other row (stale or draining, so outside A) gets 0. Rows already holding their value are
-- not rewritten. $1 instance_id[], $2 allocated[] (same length). Returns the rows changed.
WITH share AS (
    SELECT instance_id, allocated
    FROM unnest($1::text[], $2::integer[]) AS s(instance_id, allocated)
)
UPDATE engine_worker_instance AS w
SET allocated = coalesce(share.allocated, 0)
FROM engine_worker_instance AS cur
LEFT JOIN share ON share.instance_id = cur.instance_id
WHERE w.instance_id = cur.instance_id
  AND w.allocated IS DISTINCT FROM coalesce(share.allocated, 0)
RETURNING w.instance_id, w.allocated;

-- name: worker_instance_mark_draining
-- Take one instance out of the split at shutdown: status draining, no allocation.
-- Repeating it keeps the first draining_at. $1 instance_id. Returns nothing if it is absent.
UPDATE engine_worker_instance
SET status = 'draining',
    draining_at = coalesce(draining_at, now()),
    allocated = 0
WHERE instance_id = $1
RETURNING instance_id, status, draining_at, allocated;

-- name: worker_instance_list
-- Every registry row, for status output, oldest first; heartbeat_age is seconds since the last
-- heartbeat by the database's clock, so readers need not trust their own. No parameters.
SELECT instance_id, pod_uid, pod_name, site, revision, desired_capacity, capacity_limit,
       allocated, load_mode, safe_capacity, heavy_capacity, active_tasks, preparing_tasks,
       waiting_upstream_tasks, finalizing_tasks, pressure_state, pressure_reason,
       load_sampled_at, status, heartbeat_at, started_at, draining_at, models,
       extract(epoch FROM now() - heartbeat_at)::float8 AS heartbeat_age
FROM engine_worker_instance
ORDER BY started_at, instance_id;

-- name: worker_instance_delete_stale
-- Hygiene: delete rows whose last heartbeat is older than $1 seconds, whatever their status
-- (such an instance is long gone; its allocation is already 0). Returns the deleted ids.
DELETE FROM engine_worker_instance
WHERE heartbeat_at < now() - make_interval(secs => $1)
RETURNING instance_id;

-- name: worker_instance_list_liveness
-- Instances with a heartbeat in the last $1 seconds that are active ("live"), and instances
-- stale for longer than that or draining for more than $2 seconds ("dead"), for recovery.
SELECT instance_id,
       status = 'active' AND heartbeat_at >= now() - make_interval(secs => $1) AS live,
       heartbeat_at < now() - make_interval(secs => $1)
           OR (status = 'draining' AND draining_at < now() - make_interval(secs => $2)) AS dead
FROM engine_worker_instance;

-- name: worker_instance_unserved_models
-- Which of the models $1 (text[]) no live instance serves: live is active with a heartbeat in
-- the last $2 seconds, as in worker_instance_list_active; an instance with models NULL serves
-- every model. Sorted by name.
SELECT m.model
FROM unnest($1::text[]) AS m(model)
WHERE NOT EXISTS (
    SELECT 1
    FROM engine_worker_instance w
    WHERE w.status = 'active'
      AND w.heartbeat_at >= now() - make_interval(secs => $2)
      AND (w.models IS NULL OR m.model = ANY(w.models))
)
ORDER BY m.model;

-- name: worker_instance_reactivate
-- A capacity refresher that (re)starts in a live process takes the instance back into the split:
-- an earlier refresher of the same process marked it draining on its way out (a crash). $1
-- instance id. A no-op before the first registration.
UPDATE engine_worker_instance
SET status = 'active', draining_at = NULL
WHERE instance_id = $1 AND status = 'draining';
