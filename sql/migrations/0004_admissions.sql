-- Scope admissions and rate limits (docs/tasks.md): per-scope concurrency held as leases in the database,
-- waiting admissions served first in, first out, and token buckets per scope.

ALTER TABLE engine_model
    ADD COLUMN rate_limit integer,
    ADD COLUMN rate_interval double precision NOT NULL DEFAULT 1.0 CHECK (rate_interval > 0);
ALTER TABLE engine_group
    ADD COLUMN rate_limit integer,
    ADD COLUMN rate_interval double precision NOT NULL DEFAULT 1.0 CHECK (rate_interval > 0);

-- One row per running task per limited scope ("model:<name>", "group:<key>"): a held slot.
CREATE TABLE engine_scope_lease (
    scope text NOT NULL,
    task_id uuid NOT NULL,
    owner text,
    acquired_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (scope, task_id)
);
CREATE INDEX engine_scope_lease_task_index ON engine_scope_lease (task_id);

-- A task waiting for room in its scopes, or admitted (a slot reserved) and not started yet.
CREATE TABLE engine_task_admission (
    task_id uuid PRIMARY KEY,
    scopes text[] NOT NULL,
    group_key text NOT NULL DEFAULT '',
    status text NOT NULL CHECK (status IN ('waiting', 'admitted')),
    enqueued_at timestamptz NOT NULL DEFAULT now(),
    admitted_at timestamptz,
    -- The queue timeout: a task still waiting then fails (NULL: waits as long as it takes).
    expires_at timestamptz
);
CREATE INDEX engine_task_admission_waiting_index ON engine_task_admission (enqueued_at)
    WHERE status = 'waiting';
CREATE INDEX engine_task_admission_scopes_index ON engine_task_admission USING gin (scopes);

-- Token buckets: `tokens` as of `updated_at`; refilled lazily at rate_limit / rate_interval.
CREATE TABLE engine_rate_bucket (
    scope text PRIMARY KEY,
    tokens double precision NOT NULL,
    updated_at timestamptz NOT NULL DEFAULT now()
);

-- A token taken by a task that has not reached the upstream yet; given back if it fails first.
CREATE TABLE engine_rate_reservation (
    scope text NOT NULL,
    task_id uuid NOT NULL,
    reserved_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (scope, task_id)
);
