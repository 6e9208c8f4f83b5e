-- Tables engine_scope_lease, engine_task_admission, engine_rate_bucket, engine_rate_reservation:
-- scope concurrency and rate limits. Every write that changes a scope's usage runs under
-- that scope's transaction-level advisory lock, taken in sorted order (no deadlocks).

-- name: scope_lock
-- Serialize admission decisions for one scope until the transaction ends. $1 scope.
SELECT pg_advisory_xact_lock(hashtext('engine.scope:' || $1));

-- name: scope_limits_for_task
-- The limited scopes of a task's model and group: scope, concurrency limit (NULL = none), rate
-- limit (NULL = none) and interval. $1 model, $2 group key.
SELECT 'model:' || name AS scope, concurrency_limit, rate_limit, rate_interval
FROM engine_model
WHERE name = $1
  AND ((concurrency_limit IS NOT NULL AND concurrency_limit > 0)
       OR (rate_limit IS NOT NULL AND rate_limit > 0))
UNION ALL
SELECT 'group:' || key, concurrency_limit, rate_limit, rate_interval
FROM engine_group
WHERE key = $2
  AND ((concurrency_limit IS NOT NULL AND concurrency_limit > 0)
       OR (rate_limit IS NOT NULL AND rate_limit > 0))
ORDER BY 1;

-- name: scope_usage
-- For each scope in $1: slots used (leases plus admitted-but-not-started, other than task $2)
-- and whether another task is waiting for it.
SELECT s.scope,
       (SELECT count(*) FROM engine_scope_lease l WHERE l.scope = s.scope AND l.task_id <> $2)
       + (SELECT count(*) FROM engine_task_admission a
          WHERE a.status = 'admitted' AND s.scope = ANY(a.scopes) AND a.task_id <> $2) AS used,
       EXISTS (SELECT 1 FROM engine_task_admission a
               WHERE a.status = 'waiting' AND s.scope = ANY(a.scopes) AND a.task_id <> $2)
           AS others_waiting
FROM unnest($1::text[]) AS s(scope);

-- name: admission_get
-- A task's admission, if any. $1 task id.
SELECT * FROM engine_task_admission WHERE task_id = $1;

-- name: admission_wait
-- Task $1, whose pending claim (queued, holding token $5) found a scope full, joins the line
-- for scopes $2 (group $3; queue timeout at $4, NULL = none): the claim's lease is released and
-- the task stays queued, never shown running and with no attempt counted. A task that already
-- waits keeps its place in line. Its job $6, the run asking, is completed here too: a waiting
-- task has no live job (the dispatcher inserts one when it admits the task), and completing
-- it in this transaction rather than when the handler returns means a dispatcher admitting the
-- task a moment later never finds this job still running and takes it for the task's live job
-- (the unique insert would return it instead of a new one, and the task would sit admitted
-- with no job until recovery). Nothing is written when the token no longer holds the lease.
-- Returns the task id when the task now waits.
WITH released AS (
    UPDATE engine_task
    SET execution_token = NULL, execution_owner = NULL, lease_expires_at = NULL,
        updated_at = now()
    WHERE id = $1 AND execution_token = $5 AND status = 'queued'
    RETURNING id
),
waiting AS (
    INSERT INTO engine_task_admission (task_id, scopes, group_key, status, expires_at)
    SELECT id, $2::text[], $3::text, 'waiting', $4::timestamptz FROM released
    ON CONFLICT (task_id) DO UPDATE SET status = 'waiting', admitted_at = NULL,
                                        scopes = EXCLUDED.scopes
),
job_done AS (
    UPDATE river_job
    SET state = 'completed', finalized_at = now()
    -- By id, never by state (see job_get_available_completing).
    WHERE id = $6::bigint AND state::text = 'running' AND EXISTS (SELECT 1 FROM released)
)
SELECT id FROM released;

-- name: scope_lease_take
-- Hold one slot in each scope of $2 for task $1 (owner $3) and drop its admission row.
WITH taken AS (
    INSERT INTO engine_scope_lease (scope, task_id, owner)
    SELECT scope, $1, $3 FROM unnest($2::text[]) AS s(scope)
    ON CONFLICT (scope, task_id) DO NOTHING
)
DELETE FROM engine_task_admission WHERE task_id = $1;

-- name: rate_bucket_ensure
-- Create scope $1's bucket, full ($2 tokens), if it does not exist yet.
INSERT INTO engine_rate_bucket (scope, tokens, updated_at) VALUES ($1, $2, now())
ON CONFLICT (scope) DO NOTHING;

-- name: rate_token_take
-- Take one token from scope $1's bucket (capacity $2 tokens, refilled at $2 per $3 seconds) for
-- task $4. Returns tokens_after when a token was taken; otherwise nothing (the bucket is
-- empty) and the caller reads rate_token_wait.
WITH refilled AS (
    SELECT least($2::float8, b.tokens + extract(epoch FROM now() - b.updated_at) * $2 / $3)
           AS tokens
    FROM engine_rate_bucket b WHERE b.scope = $1
),
taken AS (
    UPDATE engine_rate_bucket b
    SET tokens = r.tokens - 1, updated_at = now()
    FROM refilled r
    WHERE b.scope = $1 AND r.tokens >= 1
    RETURNING b.tokens
),
reserved AS (
    INSERT INTO engine_rate_reservation (scope, task_id)
    SELECT $1, $4 FROM taken
    ON CONFLICT DO NOTHING
)
SELECT tokens AS tokens_after FROM taken;

-- name: rate_token_wait
-- Seconds until scope $1's bucket (refilled at $2 per $3 seconds) has a whole token again.
SELECT greatest(0, (1 - least($2::float8,
                               tokens + extract(epoch FROM now() - updated_at) * $2 / $3))
                   * $3 / $2) AS seconds
FROM engine_rate_bucket WHERE scope = $1;

-- name: rate_reservation_commit
-- The request reached the upstream: its tokens are spent for good. $1 task id.
DELETE FROM engine_rate_reservation WHERE task_id = $1;

-- name: admission_list_waiting
-- Waiting admissions, oldest first, at most $1 (the dispatcher orders them fairly).
SELECT * FROM engine_task_admission WHERE status = 'waiting' ORDER BY enqueued_at, task_id
LIMIT $1;

-- name: scope_limits_many
-- Concurrency limits of scopes $1 (NULL or <= 0: none).
SELECT 'model:' || name AS scope, concurrency_limit FROM engine_model
WHERE 'model:' || name = ANY($1::text[])
UNION ALL
SELECT 'group:' || key, concurrency_limit FROM engine_group
WHERE 'group:' || key = ANY($1::text[]);

-- name: scope_used_many
-- Slots used per scope of $1: leases plus admitted-but-not-started.
SELECT s.scope,
       (SELECT count(*) FROM engine_scope_lease l WHERE l.scope = s.scope)
       + (SELECT count(*) FROM engine_task_admission a
          WHERE a.status = 'admitted' AND s.scope = ANY(a.scopes)) AS used
FROM unnest($1::text[]) AS s(scope);

-- name: admission_admit_many
-- Reserve slots for tasks $1: their admissions become admitted.
UPDATE engine_task_admission
SET status = 'admitted', admitted_at = now()
WHERE task_id = ANY($1::uuid[]) AND status = 'waiting';

-- name: admission_reap_expired
-- Fail tasks that waited past their queue timeout and drop their admissions. Returns ids.
WITH expired AS (
    DELETE FROM engine_task_admission
    WHERE status = 'waiting' AND expires_at < now()
    RETURNING task_id, scopes, enqueued_at
)
UPDATE engine_task t
SET status = 'failed', finished_at = now(), updated_at = now(),
    error = jsonb_build_object(
        'code', 'queue_timeout',
        'message', format('waited %s s for room in %s and timed out',
                          round(extract(epoch FROM now() - e.enqueued_at)::numeric, 1),
                          array_to_string(e.scopes, ', ')))
FROM expired e
WHERE t.id = e.task_id AND t.status = 'queued'
RETURNING t.id;

-- name: admission_yield_stale
-- Admitted tasks that never started within $1 seconds give their reserved slots back and wait
-- again, keeping their place in line. At most $2. Returns ids.
WITH stale AS (
    SELECT a.task_id
    FROM engine_task_admission a
    WHERE a.status = 'admitted' AND a.admitted_at < now() - make_interval(secs => $1)
    ORDER BY a.admitted_at
    LIMIT $2
    FOR UPDATE SKIP LOCKED
)
UPDATE engine_task_admission a
SET status = 'waiting', admitted_at = NULL
FROM stale s
WHERE a.task_id = s.task_id
RETURNING a.task_id;

-- name: admission_clean_finished
-- Drop admissions and leases of tasks that are final or gone. Returns how many.
WITH gone_admissions AS (
    DELETE FROM engine_task_admission a
    WHERE NOT EXISTS (SELECT 1 FROM engine_task t
                      WHERE t.id = a.task_id AND t.status IN ('queued', 'running'))
    RETURNING 1
),
gone_leases AS (
    DELETE FROM engine_scope_lease l
    WHERE NOT EXISTS (SELECT 1 FROM engine_task t WHERE t.id = l.task_id AND t.status = 'running')
    RETURNING 1
)
SELECT (SELECT count(*) FROM gone_admissions) AS admissions,
       (SELECT count(*) FROM gone_leases) AS leases;

-- name: admission_count_waiting_by_model
-- Admissions waiting now, per model (the engine_admissions_waiting gauge): the waiting ones by
-- their partial index, each task's model by its primary key.
SELECT t.model, count(*)::bigint AS waiting
FROM engine_task_admission a
JOIN engine_task t ON t.id = a.task_id
WHERE a.status = 'waiting'
GROUP BY t.model;

-- name: scope_usage_all
-- Slots in use and admissions waiting per scope ('model:<name>', 'group:<key>'), for the
-- dashboard: engine_scope_lease by its primary key, waiting admissions by their partial index.
SELECT scope, sum(used)::bigint AS used, sum(waiting)::bigint AS waiting
FROM (
    SELECT scope, count(*) AS used, 0 AS waiting FROM engine_scope_lease GROUP BY scope
    UNION ALL
    SELECT s.scope, 0, count(*)
    FROM engine_task_admission a, unnest(a.scopes) AS s(scope)
    WHERE a.status = 'waiting'
    GROUP BY s.scope
) x
GROUP BY scope
ORDER BY scope;
