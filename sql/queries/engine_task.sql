-- Table engine_task: tasks and their execution leases. Every write to a running task is fenced
-- by its execution token, so a stale executor can never overwrite a newer one.
--
-- A claim holds the lease in one of two ways. A task with nothing to wait for becomes `running`
-- at once, with its attempt counted. A task whose model or group has a concurrency or rate limit
-- stays `queued` while its claim holds the token (a *pending* claim): it only becomes `running`,
-- and only counts an attempt, when the admission gate lets it start (task_start_admitted, in
-- the admission's transaction). So nobody reads `running` for a task that waits for a scope
-- slot or a scope lock. Only a claim leaves a token on a queued task, so the writes that may
-- meet a pending claim (finish, requeue, hand back) accept `queued` with the token too.
--
-- Batched writes lock their rows in id order first (the `locked` CTE): concurrent batches over
-- the same tasks (a lease renewal and a finish) would otherwise lock them in plan order and
-- could deadlock. The update then refers to `locked` only through a condition without columns,
-- `(SELECT count(*) FROM locked) > 0`, which PostgreSQL evaluates once, before the update reads
-- a row, and finds its rows by `t.id = ANY($1)` and `t.id = i.id` (the claim by `t.id = i.id`
-- alone: one primary-key probe per input row). A generic plan guesses 10 rows for any array, so
-- a join with `locked` itself, or a strict fence `t.execution_token = i.token` beside the join
-- with the input, became a nested loop that read the CTE or the input again for every row:
-- quadratic in the batch, 57-92 ms instead of 12-19 ms for 600 rows. The conditions on the row
-- itself are written so that no partial index can serve them either: the fence as
-- `i.token IS NOT NULL AND t.execution_token IS NOT DISTINCT FROM i.token` (the same test, but
-- not strict, so it does not imply the lease index's `execution_token IS NOT NULL`), and the
-- status checks inside `coalesce(..., false)`. On statistics taken while nothing ran, the
-- planner otherwise walks a partial index it believes almost empty (every live task) and reads
-- the input again for each task it finds. The coalesce also hides the checks from the row
-- estimate (an expression the planner cannot look into counts as half the rows): on a table
-- never analyzed it guesses 0.5 % for each `IS NULL`, believes the checks leave one task of
-- ten thousand, and scans the table once, reading the whole input again for each of its rows
-- (0.2-0.75 s for a claim of 500 on a fresh install under a burst, against ~3 ms).

-- fragment: task_submit_after_input
-- What task_submit_many and task_submit_one do with their CTE ``input`` (one row per request):
-- check the models, insert the jobs as job_insert_many does, the tasks and their first events,
-- and NOTIFY; the statements differ only in how they read their input.
problems AS MATERIALIZED (
    SELECT c.ord, c.enabled
    FROM (
        -- A correlated scalar lookup: one primary-key probe per request, whatever the size of
        -- the catalogue (see task_lease_claim_many).
        SELECT i.ord, (SELECT m.enabled FROM engine_model m WHERE m.name = i.model) AS enabled
        FROM input i
    ) c
    WHERE c.enabled IS NOT true
),
jobs AS (
    {{river_job_insert_from_input}}
    WHERE NOT EXISTS (SELECT 1 FROM problems)
    ORDER BY ord
    {{river_job_keep_live_duplicate}}
    RETURNING river_job.id, river_job.unique_key
),
tasks AS (
    INSERT INTO engine_task (
        id, model, group_key, tenant_id, gateway_tenant_id, tenant_key, user_id,
        gateway_user_id, user_source, user_group_id, api_key_id, api_key_name, api_key_prefix,
        run_mode, payload, next_run_at, river_job_id
    )
    SELECT i.id, i.model, i.group_key,
           i.identity ->> 'tenant_id', i.identity ->> 'gateway_tenant_id',
           i.identity ->> 'tenant_key', i.identity ->> 'user_id',
           i.identity ->> 'gateway_user_id', i.identity ->> 'user_source',
           i.identity ->> 'user_group_id', i.identity ->> 'api_key_id',
           i.identity ->> 'api_key_name', i.identity ->> 'api_key_prefix',
           i.run_mode, i.payload::jsonb, coalesce(i.next_run_at, now()), j.id
    FROM input i
    JOIN jobs j ON j.unique_key = i.unique_key
    ORDER BY i.ord
    RETURNING id, run_mode
),
events AS (
    INSERT INTO engine_task_event (task_id, type, status, progress, message, simulated,
                                   instance_id)
    SELECT id, 'task.queued', 'queued', 0, 'task submitted', run_mode = 'simulation', $21::text
    FROM tasks
),
notified AS (
    SELECT count(pg_notify($12::text, payload)) AS n
    FROM unnest($13::text[]) AS payload
    WHERE NOT EXISTS (SELECT 1 FROM problems)
)
-- notified is one row, always: FROM it, so its NOTIFY runs (a data-modifying CTE runs anyway).
SELECT (SELECT count(*) FROM tasks) AS stored,
       ARRAY(SELECT p.ord FROM problems p WHERE p.enabled IS NULL ORDER BY p.ord) AS unknown,
       ARRAY(SELECT p.ord FROM problems p WHERE NOT p.enabled ORDER BY p.ord) AS disabled
FROM notified;

-- name: task_submit_many
-- Submit tasks in one statement, its own transaction when sent alone: check their models, insert
-- their jobs, then the tasks pointing at them with their first event (task.queued). When any
-- model is unknown or disabled nothing is written and nothing notified, and the row names those
-- requests. The jobs go in exactly as job_insert_many puts them (a River client shares
-- river_job): a live job with the same unique key is kept and returned (the task points at it),
-- and the NOTIFY rides in the same statement. Every task job has a unique key (unique by task
-- id), which is how each task finds its job among the rows the insert returns.
-- The job columns as job_insert_many: $1 kind[], $2 args jsonb-as-text[], $3 queue[],
-- $4 priority[], $5 max_attempts[], $6 scheduled_at[] (NULL = now), $7 state[], $8 tags text[]
-- as JSON text[], $9 metadata text[], $10 unique_key bytea[], $11 unique_states text[],
-- $12 notify channel, $13 notify payloads text[]; the task columns: $14 id[], $15 model[],
-- $16 group_key[], $17 identity jsonb[] (an object with the identity columns), $18 run_mode[],
-- $19 payload JSON text[], $20 next_run_at[] (NULL = now), $21 instance id. Returns one row: stored (the tasks
-- written), unknown and disabled (the 1-based positions of the requests whose model is unknown,
-- or disabled).
WITH input AS MATERIALIZED (
    SELECT *
    FROM unnest(
        $1::text[], $2::text[], $3::text[], $4::smallint[], $5::smallint[],
        $6::timestamptz[], $7::river_job_state[], $8::text[], $9::text[], $10::bytea[], $11::text[],
        $14::uuid[], $15::text[], $16::text[], $17::jsonb[], $18::text[], $19::text[],
        $20::timestamptz[]
    ) WITH ORDINALITY AS i(kind, args, queue, priority, max_attempts, scheduled_at, state, tags,
                           metadata, unique_key, unique_states, id, model, group_key, identity,
                           run_mode, payload, next_run_at, ord)
),
{{task_submit_after_input}}

-- name: task_submit_one
-- task_submit_many for one request, with the same parameters as scalars ($12 and $13 as there):
-- the statement a single submit sends. Below its input it is task_submit_many word for word (the
-- same fragment). Why a second statement: PostgreSQL plans a prepared statement over
-- unnest($n) anew on every run (a generic plan counts ten rows per array and always looks dearer
-- than a custom one), which costs a single submit as much as its execution does; with scalars
-- the generic plan is as cheap, so it is planned once per connection (docs/benchmarks.md).
WITH input AS MATERIALIZED (
    SELECT $1::text AS kind, $2::text AS args, $3::text AS queue, $4::smallint AS priority,
           $5::smallint AS max_attempts, $6::timestamptz AS scheduled_at,
           $7::river_job_state AS state, $8::text AS tags, $9::text AS metadata,
           $10::bytea AS unique_key, $11::text AS unique_states, $14::uuid AS id,
           $15::text AS model, $16::text AS group_key, $17::jsonb AS identity,
           $18::text AS run_mode, $19::text AS payload, $20::timestamptz AS next_run_at,
           1::bigint AS ord
),
{{task_submit_after_input}}

-- name: task_get
-- One task by id. $1 id.
SELECT * FROM engine_task WHERE id = $1;

-- name: task_get_many
-- Tasks by id (any order). $1 id[].
SELECT * FROM engine_task WHERE id = ANY($1::uuid[]);

-- name: task_list
-- Tasks newest first, filtered by optional $1 status, $2 model, $3 tenant_id; at most $4,
-- created before $5 (NULL = no bound; a cursor for paging).
SELECT *
FROM engine_task
WHERE ($1::text IS NULL OR status = $1)
  AND ($2::text IS NULL OR model = $2)
  AND ($3::text IS NULL OR tenant_id = $3)
  AND ($5::timestamptz IS NULL OR created_at < $5)
ORDER BY created_at DESC
LIMIT $4;

-- name: task_count_by_status
-- Task counts per status.
SELECT status, count(*) AS n FROM engine_task GROUP BY status;

-- name: task_lease_claim_many
-- Claim execution leases with fresh tokens: only a queued or running task that is due, not
-- being cancelled, and whose lease is free or expired. $1 id[], $2 token[], $3 owner instance,
-- $4 lease TTL seconds. Returns the claimed rows: running in phase preparing with the attempt
-- counted, or, for a task of a limited model or group, still queued with the token (a pending
-- claim, started by task_start_admitted once admitted; see the top of this file). A task whose
-- submission is ambiguous runs at once whatever its limits: it goes to manual review without
-- taking a slot. The limits are read live from the catalogue (two primary-key probes; it lives
-- in the tasks database, which the start checks), so a limit set a moment ago already applies.
-- Locks its rows in id order first (see the top of this file).
WITH locked AS MATERIALIZED (
    SELECT id FROM engine_task WHERE id = ANY($1::uuid[]) ORDER BY id FOR NO KEY UPDATE
)
UPDATE engine_task t
SET (status, phase, progress, attempts, started_at) = (
        SELECT CASE WHEN c.pending THEN 'queued' ELSE 'running' END,
               CASE WHEN c.pending THEN NULL ELSE 'preparing' END,
               CASE WHEN c.pending THEN t.progress ELSE 0.1 END,
               CASE WHEN c.pending THEN t.attempts ELSE t.attempts + 1 END,
               CASE WHEN c.pending THEN t.started_at ELSE coalesce(t.started_at, now()) END
        FROM (
            -- Correlated scalar lookups, one primary-key probe per task (an EXISTS could be
            -- planned as a hashed subplan that reads the whole catalogue on every claim).
            SELECT (coalesce((SELECT m.concurrency_limit > 0 OR m.rate_limit > 0
                              FROM engine_model m WHERE m.name = t.model), false)
                    OR coalesce((SELECT g.concurrency_limit > 0 OR g.rate_limit > 0
                                 FROM engine_group g WHERE g.key = t.group_key), false))
                   AND (t.submitted_at IS NULL OR t.upstream_ref IS NOT NULL) AS pending
            OFFSET 0  -- evaluated once per row, not once per use of c.pending
        ) AS c
    ),
    execution_token = i.token,
    execution_owner = $3,
    lease_expires_at = now() + make_interval(secs => $4),
    updated_at = now()
FROM unnest($1::uuid[], $2::uuid[]) AS i(id, token)
WHERE t.id = i.id AND (SELECT count(*) FROM locked) > 0
  AND coalesce(t.status IN ('queued', 'running')
               AND t.next_run_at <= now()
               AND t.cancel_requested_at IS NULL
               AND (t.execution_token IS NULL OR t.lease_expires_at < now()), false)
RETURNING t.*;

-- name: task_start_admitted
-- Start a pending claim the admission gate let through, in the gate's transaction: the task
-- becomes running in phase preparing and counts its attempt now (started_at set on its first
-- start), and its lease is renewed, since waiting for the scope locks took part of it.
-- $1 id, $2 token, $3 lease TTL seconds. Returns the row; nothing when the token no longer
-- holds the lease (the task was cancelled meanwhile, or the lease expired and was taken over).
UPDATE engine_task
SET status = 'running',
    phase = 'preparing',
    progress = 0.1,
    attempts = attempts + 1,
    started_at = coalesce(started_at, now()),
    lease_expires_at = now() + make_interval(secs => $3),
    updated_at = now()
WHERE id = $1 AND execution_token = $2 AND status = 'queued'
RETURNING *;

-- name: task_hand_back
-- Give a claimed task back before anything ran: this process has no provider for its model.
-- It is queued again and due now, its lease released and, if the claim had made it running,
-- the attempt given back, with started_at cleared when that was its first start ($3, which the
-- caller reads off the claimed row: the claim stamps started_at and updated_at with the same
-- time only then). A task whose cancel was requested in between is cancelled instead, since a
-- queued task with a cancel request would never be claimed again. No slot or rate token is held
-- yet (the check comes before admission), and next_run_at is left as it is: the claim found the
-- task due. Fenced by the token, pending claims included.
-- $1 id, $2 token, $3 first start. Returns the row when handed back or cancelled.
UPDATE engine_task t
SET status = CASE WHEN t.cancel_requested_at IS NOT NULL THEN 'cancelled' ELSE 'queued' END,
    finished_at = CASE WHEN t.cancel_requested_at IS NOT NULL THEN now() END,
    error = CASE
        WHEN t.cancel_requested_at IS NOT NULL
            THEN '{"code": "cancelled", "message": "cancelled before it ran"}'::jsonb
        ELSE t.error
    END,
    phase = NULL,
    progress = CASE WHEN t.status = 'running' AND $3 THEN 0 ELSE t.progress END,
    attempts = CASE WHEN t.status = 'running' THEN greatest(t.attempts - 1, 0)
                    ELSE t.attempts END,
    started_at = CASE WHEN t.status = 'running' AND $3 THEN NULL ELSE t.started_at END,
    execution_token = NULL,
    execution_owner = NULL,
    lease_expires_at = NULL,
    updated_at = now()
WHERE t.id = $1 AND t.execution_token = $2 AND t.status IN ('running', 'queued')
RETURNING t.*;

-- name: task_lease_renew_many
-- Extend leases still held. $1 id[], $2 token[], $3 TTL seconds. Returns the ids renewed and
-- whether a cancel was requested; a missing id means the lease was lost.
-- Locks its rows in id order first (see the top of this file).
WITH locked AS MATERIALIZED (
    SELECT id FROM engine_task WHERE id = ANY($1::uuid[]) ORDER BY id FOR NO KEY UPDATE
)
UPDATE engine_task t
SET lease_expires_at = now() + make_interval(secs => $3)
FROM unnest($1::uuid[], $2::uuid[]) AS i(id, token)
WHERE t.id = ANY($1::uuid[]) AND t.id = i.id AND (SELECT count(*) FROM locked) > 0
  AND i.token IS NOT NULL AND t.execution_token IS NOT DISTINCT FROM i.token
  AND coalesce(t.status = 'running', false)
RETURNING t.id, t.cancel_requested_at IS NOT NULL AS cancel_requested;

-- name: task_mark_submitting_many
-- Record that the upstream call is about to be made (before it is made), and whether it is
-- made with an idempotency key. $1 id[], $2 token[], $3 idempotently[].
-- Returns the ids still held.
-- Locks its rows in id order first (see the top of this file).
WITH locked AS MATERIALIZED (
    SELECT id FROM engine_task WHERE id = ANY($1::uuid[]) ORDER BY id FOR NO KEY UPDATE
)
UPDATE engine_task t
SET submitted_at = now(), submitted_idempotently = i.idempotently, phase = 'waiting_upstream',
    progress = 0.3, updated_at = now()
FROM unnest($1::uuid[], $2::uuid[], $3::boolean[]) AS i(id, token, idempotently)
WHERE t.id = ANY($1::uuid[]) AND t.id = i.id AND (SELECT count(*) FROM locked) > 0
  AND i.token IS NOT NULL AND t.execution_token IS NOT DISTINCT FROM i.token
  AND coalesce(t.status = 'running', false)
RETURNING t.id;

-- name: task_unmark_submitting_many
-- Clear submitted_at after an upstream call that certainly did not reach the upstream (the
-- provider said NotSubmitted): a requeue or a recovery before the next call then puts the task
-- back in the queue instead of manual review. $1 id[], $2 token[]. Returns the ids still held.
-- Locks its rows in id order first (see the top of this file).
WITH locked AS MATERIALIZED (
    SELECT id FROM engine_task WHERE id = ANY($1::uuid[]) ORDER BY id FOR NO KEY UPDATE
)
UPDATE engine_task t
SET submitted_at = NULL, submitted_idempotently = false, updated_at = now()
FROM unnest($1::uuid[], $2::uuid[]) AS i(id, token)
WHERE t.id = ANY($1::uuid[]) AND t.id = i.id AND (SELECT count(*) FROM locked) > 0
  AND i.token IS NOT NULL AND t.execution_token IS NOT DISTINCT FROM i.token
  AND coalesce(t.status = 'running' AND t.upstream_ref IS NULL, false)
RETURNING t.id;

-- name: task_record_upstream_many
-- Record the upstream reference the provider returned; the task's rate tokens are spent for
-- good now. $1 id[], $2 token[], $3 ref[]. Returns the ids still held.
-- Locks its rows in id order first (see the top of this file).
WITH locked AS MATERIALIZED (
    SELECT id FROM engine_task WHERE id = ANY($1::uuid[]) ORDER BY id FOR NO KEY UPDATE
),
recorded AS (
    UPDATE engine_task t
    SET upstream_ref = i.ref, progress = 0.4, updated_at = now()
    FROM unnest($1::uuid[], $2::uuid[], $3::text[]) AS i(id, token, ref)
    WHERE t.id = ANY($1::uuid[]) AND t.id = i.id AND (SELECT count(*) FROM locked) > 0
      AND i.token IS NOT NULL AND t.execution_token IS NOT DISTINCT FROM i.token
      AND coalesce(t.status = 'running', false)
    RETURNING t.id
),
spent AS (
    DELETE FROM engine_rate_reservation r USING recorded x WHERE r.task_id = x.id
)
SELECT id FROM recorded;

-- name: task_set_phase_many
-- Record phase and progress of running tasks (informational). $1 id[], $2 token[], $3 phase[],
-- $4 progress[].
-- Locks its rows in id order first (see the top of this file).
WITH locked AS MATERIALIZED (
    SELECT id FROM engine_task WHERE id = ANY($1::uuid[]) ORDER BY id FOR NO KEY UPDATE
)
UPDATE engine_task t
SET phase = i.phase, progress = i.progress, updated_at = now()
FROM unnest($1::uuid[], $2::uuid[], $3::text[], $4::real[]) AS i(id, token, phase, progress)
WHERE t.id = ANY($1::uuid[]) AND t.id = i.id AND (SELECT count(*) FROM locked) > 0
  AND i.token IS NOT NULL AND t.execution_token IS NOT DISTINCT FROM i.token
  AND coalesce(t.status = 'running', false)
RETURNING t.id;

-- name: task_finish_many
-- Record outcomes and release leases, scope slots (waking dispatchers) and unspent rate tokens.
-- $1 id[], $2 token[], $3 status[] (succeeded, failed, cancelled, manual_review), $4 result
-- JSON text[], $5 error JSON text[]. Returns the ids changed; a missing id means another
-- execution owns the task now. A pending claim (queued with the token: an error while it
-- waited for admission) is finished the same way.
-- Locks its rows in id order first (see the top of this file).
WITH locked AS MATERIALIZED (
    SELECT id FROM engine_task WHERE id = ANY($1::uuid[]) ORDER BY id FOR NO KEY UPDATE
),
finished AS (
    UPDATE engine_task t
    SET status = i.status,
        phase = NULL,
        progress = CASE WHEN i.status = 'succeeded' THEN 1 ELSE t.progress END,
        result = i.result::jsonb,
        error = i.error::jsonb,
        execution_token = NULL,
        lease_expires_at = NULL,
        finished_at = now(),
        updated_at = now()
    FROM unnest($1::uuid[], $2::uuid[], $3::text[], $4::text[], $5::text[])
         AS i(id, token, status, result, error)
    WHERE t.id = ANY($1::uuid[]) AND t.id = i.id AND (SELECT count(*) FROM locked) > 0
      AND i.token IS NOT NULL AND t.execution_token IS NOT DISTINCT FROM i.token
      AND coalesce(t.status IN ('running', 'queued'), false)
    RETURNING t.id
),
released AS (
    SELECT engine_task_release_holds(array_agg(id)) FROM finished
)
SELECT f.id
FROM finished f, released;

-- name: task_requeue_many
-- Put running tasks back to queued and release their leases, keeping an upstream reference so
-- the next run resumes polling instead of submitting again. A task whose upstream
-- call started but left no reference is ambiguous: it goes to manual_review instead, unless
-- that call carried an idempotency key (the next run submits again with the same key). Scope
-- slots and unspent rate tokens are given back. A pending claim (queued with the token: a
-- rate limit, a stop or a database error while it waited for admission) is released the same
-- way; its attempt was never counted.
-- $1 id[], $2 token[], $3 delay seconds[], $4 only_before_submission[] (the lock-timeout path:
-- requeue only if nothing was sent upstream). Returns id and the status now.
-- Locks its rows in id order first (see the top of this file).
WITH locked AS MATERIALIZED (
    SELECT id FROM engine_task WHERE id = ANY($1::uuid[]) ORDER BY id FOR NO KEY UPDATE
),
requeued AS (
    UPDATE engine_task t
    SET status = CASE
            WHEN engine_task_submission_ambiguous(
                t.submitted_at, t.upstream_ref, t.submitted_idempotently
            ) THEN 'manual_review'
            ELSE 'queued'
        END,
        finished_at = CASE
            WHEN engine_task_submission_ambiguous(
                t.submitted_at, t.upstream_ref, t.submitted_idempotently
            ) THEN now()
        END,
        phase = NULL,
        execution_token = NULL,
        execution_owner = NULL,
        lease_expires_at = NULL,
        next_run_at = now() + make_interval(secs => i.delay),
        updated_at = now()
    FROM unnest($1::uuid[], $2::uuid[], $3::float8[], $4::boolean[])
         AS i(id, token, delay, only_before)
    WHERE t.id = ANY($1::uuid[]) AND t.id = i.id AND (SELECT count(*) FROM locked) > 0
      AND i.token IS NOT NULL AND t.execution_token IS NOT DISTINCT FROM i.token
      AND coalesce(t.status IN ('running', 'queued'), false)
      AND (NOT i.only_before OR t.submitted_at IS NULL)
    RETURNING t.id, t.status
),
released AS (
    SELECT engine_task_release_holds(array_agg(id)) FROM requeued
)
SELECT q.id, q.status
FROM requeued q, released;

-- name: task_cancel_queued
-- Cancel a task that is not running yet, at once (leaving any admission line). A pending claim
-- (waiting for admission) loses its lease with it, so its run stops at its next fenced write.
-- $1 id. Returns the row when cancelled.
WITH cancelled AS (
    UPDATE engine_task
    SET status = 'cancelled', finished_at = now(), updated_at = now(),
        cancel_requested_at = now(),
        execution_token = NULL, execution_owner = NULL, lease_expires_at = NULL,
        error = '{"code": "cancelled", "message": "cancelled before it ran"}'
    WHERE id = $1 AND status = 'queued'
    RETURNING *
),
left_line AS (
    DELETE FROM engine_task_admission a USING cancelled c WHERE a.task_id = c.id
)
SELECT * FROM cancelled;

-- name: task_request_cancel
-- Ask the execution of a running task to stop; its owner is told through NOTIFY $2.
-- $1 id. Returns the row when the request was recorded.
WITH requested AS (
    UPDATE engine_task
    SET cancel_requested_at = coalesce(cancel_requested_at, now()), updated_at = now()
    WHERE id = $1 AND status = 'running'
    RETURNING *
)
SELECT requested.*, pg_notify($2, requested.id::text) IS NOT NULL AS notified FROM requested;

-- name: task_set_job_many
-- Point tasks at their live job (after an enqueue found or made one). $1 id[], $2 job id[].
-- Locks its rows in id order first (see the top of this file).
WITH locked AS MATERIALIZED (
    SELECT id FROM engine_task WHERE id = ANY($1::uuid[]) ORDER BY id FOR NO KEY UPDATE
)
UPDATE engine_task t
SET river_job_id = i.job_id, updated_at = now()
FROM unnest($1::uuid[], $2::bigint[]) AS i(id, job_id)
WHERE t.id = ANY($1::uuid[]) AND t.id = i.id AND (SELECT count(*) FROM locked) > 0
  AND t.river_job_id IS DISTINCT FROM i.job_id;

-- name: task_recover_interrupted_many
-- Tasks whose execution is gone: they hold a token whose lease expired, or whose owner is one
-- of $1 (owners the registry shows stale or draining too long; the caller reads them from the
-- coordination database). A running one goes back to queued (keeping an upstream reference, so
-- the next run resumes polling); one whose submission is ambiguous goes to manual_review (unless
-- it was made with an idempotency key: queued, the next run submits again with that key); one
-- whose cancel was requested is cancelled. A pending claim (queued with a token: its owner died
-- while it waited for admission) only loses the token, so the next claim can take it. At most
-- $2, never this process's own ($3, also the recovering instance named in the events). Every
-- move of a running task is written to its history in the same statement: task.requeued,
-- task.manual_review or task.cancelled, with the reason (lease_expired or owner_gone), the
-- owner that lost it and the recovering instance. Scope slots and unspent rate tokens are
-- released by the admission cleanup that follows.
WITH victims AS (
    SELECT t.id, t.status AS was, t.execution_owner AS owner,
           CASE WHEN t.execution_owner = ANY($1::text[]) THEN 'owner_gone'
                ELSE 'lease_expired' END AS reason
    FROM engine_task t
    WHERE t.execution_token IS NOT NULL
      AND t.status IN ('queued', 'running')
      AND t.execution_owner IS DISTINCT FROM $3
      AND (t.lease_expires_at < now() OR t.execution_owner = ANY($1::text[]))
    ORDER BY t.id
    LIMIT $2
    FOR UPDATE SKIP LOCKED
),
recovered AS (
    UPDATE engine_task t
    SET status = CASE
            WHEN t.status = 'queued' THEN 'queued'
            WHEN engine_task_submission_ambiguous(
                t.submitted_at, t.upstream_ref, t.submitted_idempotently
            ) THEN 'manual_review'
            WHEN t.cancel_requested_at IS NOT NULL THEN 'cancelled'
            ELSE 'queued'
        END,
        finished_at = CASE
            WHEN t.status = 'queued' THEN NULL
            WHEN engine_task_submission_ambiguous(
                t.submitted_at, t.upstream_ref, t.submitted_idempotently
            ) THEN now()
            WHEN t.cancel_requested_at IS NOT NULL THEN now()
        END,
        error = CASE
            WHEN t.status = 'queued' THEN t.error
            WHEN engine_task_submission_ambiguous(
                t.submitted_at, t.upstream_ref, t.submitted_idempotently
            ) THEN
                '{"code": "ambiguous_submission", "message": "owner died after submitting upstream"}'
            WHEN t.cancel_requested_at IS NOT NULL THEN
                '{"code": "cancelled", "message": "cancelled; its owner stopped first"}'
            ELSE t.error
        END,
        phase = NULL,
        execution_token = NULL,
        execution_owner = NULL,
        lease_expires_at = NULL,
        next_run_at = now(),
        updated_at = now()
    FROM victims
    WHERE t.id = victims.id
    RETURNING t.id, t.status, t.run_mode, t.upstream_ref, t.submitted_at, victims.was,
              victims.owner, victims.reason
),
history AS (
    INSERT INTO engine_task_event (task_id, type, status, message, payload, simulated, instance_id)
    SELECT id,
           CASE status WHEN 'manual_review' THEN 'task.manual_review'
                       WHEN 'cancelled' THEN 'task.cancelled'
                       ELSE 'task.requeued' END,
           status,
           CASE status
               WHEN 'manual_review' THEN
                   'its owner stopped after submitting upstream, before recording the answer'
               WHEN 'cancelled' THEN 'cancelled: its owner stopped first'
               ELSE 'requeued: its owner stopped'
                    || CASE WHEN upstream_ref IS NOT NULL THEN '; the next run resumes polling'
                            WHEN submitted_at IS NOT NULL THEN
                                '; its submission, made with an idempotency key, is made again'
                                || ' with the same key'
                            ELSE '' END
           END,
           jsonb_build_object('reason', reason, 'owner', owner, 'recovered_by', $3::text),
           run_mode = 'simulation',
           $3::text
    FROM recovered
    WHERE was = 'running'  -- a pending claim losing its token is not a move
)
SELECT id, status, run_mode FROM recovered;

-- name: task_list_recoverable
-- Queued tasks with no live job, due first, with the model and run mode their job's
-- args carry. $1 limit.
SELECT t.id, t.next_run_at, t.model, t.run_mode
FROM engine_task t
WHERE t.status = 'queued'
  -- A waiting task is the dispatcher's: it gets its job when it is admitted.
  AND NOT EXISTS (
      SELECT 1 FROM engine_task_admission a WHERE a.task_id = t.id AND a.status = 'waiting'
  )
  AND NOT EXISTS (
      SELECT 1 FROM river_job j
      WHERE j.id = t.river_job_id
        AND j.state IN ('available', 'pending', 'retryable', 'running', 'scheduled')
  )
ORDER BY t.next_run_at, t.created_at
LIMIT $1
-- Rows another transaction holds (an operator's lock, a claim) are left for a later round.
FOR UPDATE OF t SKIP LOCKED;

-- name: task_existing_ids
-- Which of these task ids exist (a schedule skips a period whose task is already there).
-- $1: ids.
SELECT id FROM engine_task WHERE id = ANY($1::uuid[]);

-- name: task_page
-- A page of tasks for the dashboard, newest first, walking engine_task_created_index: optional
-- filters $1 status, $2 model, $3 tenant_id, $4 group_key, $5 created at or after, $6 created
-- before; the cursor is the last row of the previous page, $7 created_at and $8 id (NULL: the
-- first page); at most $9 rows.
SELECT *
FROM engine_task
WHERE created_at <= coalesce($7::timestamptz, $6::timestamptz, 'infinity'::timestamptz)
  AND ($6::timestamptz IS NULL OR created_at < $6)
  AND ($7::timestamptz IS NULL OR created_at < $7 OR (created_at = $7 AND id < $8::uuid))
  AND ($5::timestamptz IS NULL OR created_at >= $5)
  AND ($1::text IS NULL OR status = $1)
  AND ($2::text IS NULL OR model = $2)
  AND ($3::text IS NULL OR tenant_id = $3)
  AND ($4::text IS NULL OR group_key = $4)
ORDER BY created_at DESC, id DESC
LIMIT $9;

-- name: task_page_manual_review
-- The dashboard's manual-review list, newest first, from the partial index
-- engine_task_review_index; cursor $1 created_at and $2 id of the previous page's last
-- row (NULL: the first page); at most $3 rows.
SELECT *
FROM engine_task
WHERE status = 'manual_review'
  AND created_at <= coalesce($1::timestamptz, 'infinity'::timestamptz)
  AND ($1::timestamptz IS NULL OR created_at < $1 OR (created_at = $1 AND id < $2::uuid))
ORDER BY created_at DESC, id DESC
LIMIT $3;

-- name: task_find_by_upstream_ref
-- Tasks with upstream reference $1 created at or after $2, newest first, at most $3. There is
-- no index on upstream_ref on purpose (recording it stays a HOT update): the created_at range
-- bounds the scan.
SELECT *
FROM engine_task
WHERE created_at >= $2 AND upstream_ref = $1
ORDER BY created_at DESC
LIMIT $3;

-- name: task_count_live_by_model
-- Queued and running tasks per model and status, from engine_task_live_index.
SELECT model, status, count(*) AS n
FROM engine_task
WHERE status IN ('queued', 'running')
GROUP BY model, status
ORDER BY model, status;

-- name: task_finished_per_minute
-- Tasks finished per minute and status over the last $2 seconds, among the tasks created in
-- the last $1 seconds (the created_at range keeps it on engine_task_created_index).
SELECT date_trunc('minute', finished_at) AS minute, status, count(*) AS n
FROM engine_task
WHERE created_at >= now() - make_interval(secs => $1::double precision)
  AND finished_at >= now() - make_interval(secs => $2::double precision)
GROUP BY 1, 2
ORDER BY 1, 2;
