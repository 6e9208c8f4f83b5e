-- The task layer: the model and group catalogue, tasks, and their append-only events.
-- A task is what a user submits; its river_job is only the execution ticket (docs/tasks.md).

CREATE TABLE engine_model (
    name text PRIMARY KEY CHECK (char_length(name) BETWEEN 1 AND 200),
    enabled boolean NOT NULL DEFAULT true,
    -- NULL or <= 0: unlimited (docs/operations.md, "Several instances").
    concurrency_limit integer,
    provider text NOT NULL DEFAULT 'simulated',
    settings jsonb NOT NULL DEFAULT '{}',
    created_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE engine_group (
    key text PRIMARY KEY CHECK (char_length(key) BETWEEN 1 AND 200),
    enabled boolean NOT NULL DEFAULT true,
    concurrency_limit integer,
    created_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE engine_task (
    id uuid PRIMARY KEY,
    model text NOT NULL,
    group_key text,
    -- Identity copied from the submitter (what a provider acts as: Identity.auth_user).
    tenant_id text NOT NULL,
    gateway_tenant_id text,
    tenant_key text,
    user_id text,
    gateway_user_id text,
    user_source text,
    user_group_id text,
    api_key_id text,
    api_key_name text,
    api_key_prefix text,
    run_mode text NOT NULL DEFAULT 'live' CHECK (run_mode IN ('live', 'simulation')),
    payload jsonb NOT NULL,
    status text NOT NULL DEFAULT 'queued' CHECK (
        status IN ('queued', 'running', 'succeeded', 'failed', 'cancelled', 'manual_review')
    ),
    phase text CHECK (phase IN ('preparing', 'waiting_upstream', 'finalizing')),
    progress real NOT NULL DEFAULT 0,
    -- The execution lease (docs/tasks.md): every write of a running task is fenced by this token.
    execution_token uuid,
    execution_owner text,
    lease_expires_at timestamptz,
    -- Set before the upstream call, so a crash after it is always detectable; the upstream
    -- reference comes right after the call returns. submitted_at without upstream_ref = the
    -- call's outcome is unknown (ambiguous unless it carried an idempotency key, 0015).
    submitted_at timestamptz,
    upstream_ref text,
    attempts integer NOT NULL DEFAULT 0,
    next_run_at timestamptz NOT NULL DEFAULT now(),
    river_job_id bigint,
    result jsonb,
    error jsonb,
    cancel_requested_at timestamptz,
    created_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now(),
    started_at timestamptz,
    finished_at timestamptz,
    CONSTRAINT engine_task_user CHECK (user_id IS NOT NULL OR gateway_user_id IS NOT NULL),
    CONSTRAINT engine_task_finished CHECK (
        (finished_at IS NOT NULL) = (status IN ('succeeded', 'failed', 'cancelled', 'manual_review'))
    )
);

-- Recovery scans live tasks; keep that index small by leaving finished tasks out.
CREATE INDEX engine_task_live_index ON engine_task (status, next_run_at, created_at)
    WHERE status IN ('queued', 'running');
CREATE INDEX engine_task_owner_index ON engine_task (execution_owner)
    WHERE status = 'running';
CREATE INDEX engine_task_created_index ON engine_task (created_at DESC);
CREATE INDEX engine_task_model_index ON engine_task (model, created_at DESC);

CREATE TABLE engine_task_event (
    id bigserial PRIMARY KEY,
    task_id uuid NOT NULL,
    type text NOT NULL,
    status text,
    phase text,
    progress real,
    message text,
    payload jsonb NOT NULL DEFAULT '{}',
    simulated boolean NOT NULL DEFAULT false,
    instance_id text,
    at timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE INDEX engine_task_event_task_index ON engine_task_event (task_id, id);

-- Waiters (engine.wait) and the task cancel path learn of outcomes through NOTIFY, whichever
-- path wrote them: executor, cancel, recovery or an operator's SQL.
CREATE FUNCTION engine_task_notify_finished() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('engine_task_finished', NEW.id::text);
    RETURN NULL;
END;
$$;

CREATE TRIGGER engine_task_finished_notify
    AFTER UPDATE OF status ON engine_task
    FOR EACH ROW
    WHEN (OLD.status IS DISTINCT FROM NEW.status
          AND NEW.status IN ('succeeded', 'failed', 'cancelled', 'manual_review'))
    EXECUTE FUNCTION engine_task_notify_finished();
