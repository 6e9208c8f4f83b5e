-- The worker-instance registry (docs/operations.md, "Several instances": the capacity and its split).
--
-- One row per worker process. Registration is the heartbeat: every refresh upserts the row with
-- the instance's latest load figures and heartbeat_at = now(), then splits the global capacity
-- over the live rows and stores each row's share in `allocated` (engine/capacity/registry.py).
-- Shutdown marks the row draining; rows not seen for a day are deleted by hygiene
-- (worker_instance_delete_stale). Writers serialize on one transaction-level advisory lock, so
-- the table needs no trigger and no row-level locking scheme.

CREATE TABLE engine_worker_instance (
    -- "<host>:<pid>:<unix nanos>"; unique per process start.
    instance_id text PRIMARY KEY,
    -- Kubernetes identity and deployment, from POD_UID, POD_NAME, EASYAI_SITE and
    -- AI_GATEWAY_REVISION; '' when unset (empty variables are trimmed).
    pod_uid text NOT NULL DEFAULT '',
    pod_name text NOT NULL DEFAULT '',
    site text NOT NULL DEFAULT '',
    revision text NOT NULL DEFAULT '',
    -- The global capacity this instance computed at its last registration (the capacity snapshot).
    desired_capacity integer NOT NULL DEFAULT 0,
    -- The per-instance hard limit; 0 means none (worker.instance_hard_limit).
    capacity_limit integer NOT NULL DEFAULT 0,
    -- This instance's share of the global capacity, written by whoever registered last.
    allocated integer NOT NULL DEFAULT 0,
    -- The workerload figures at the last registration (the load controller's).
    load_mode text NOT NULL DEFAULT 'legacy',
    safe_capacity integer,
    heavy_capacity integer,
    active_tasks integer NOT NULL DEFAULT 0,
    preparing_tasks integer NOT NULL DEFAULT 0,
    waiting_upstream_tasks integer NOT NULL DEFAULT 0,
    finalizing_tasks integer NOT NULL DEFAULT 0,
    pressure_state text NOT NULL DEFAULT 'normal',
    pressure_reason text NOT NULL DEFAULT '',
    load_sampled_at timestamptz,
    status text NOT NULL DEFAULT 'active',
    heartbeat_at timestamptz NOT NULL DEFAULT now(),
    started_at timestamptz NOT NULL DEFAULT now(),
    draining_at timestamptz,
    CONSTRAINT engine_worker_instance_status CHECK (status IN ('active', 'draining')),
    -- draining_at records when the instance started draining, so it is set exactly then.
    CONSTRAINT engine_worker_instance_draining_at CHECK (
        (status = 'draining') = (draining_at IS NOT NULL)
    ),
    CONSTRAINT engine_worker_instance_counts CHECK (
        desired_capacity >= 0 AND capacity_limit >= 0 AND allocated >= 0
        AND active_tasks >= 0 AND preparing_tasks >= 0
        AND waiting_upstream_tasks >= 0 AND finalizing_tasks >= 0
    )
);

-- The active-set query of every registration: status = 'active' AND heartbeat_at >= now() - stale.
CREATE INDEX engine_worker_instance_active_idx
    ON engine_worker_instance (heartbeat_at) WHERE status = 'active';
