-- Table river_job: River's job rows. Hot queries (claim, complete) are guarded by EXPLAIN tests.

-- fragment: river_job_insert_from_input
-- The rows of a CTE ``input`` (River's insert columns, as job_insert_many's parameters give
-- them) made into river_job rows: every statement that inserts jobs writes them so.
INSERT INTO river_job (
    kind, args, queue, priority, max_attempts, scheduled_at, state, tags, metadata,
    unique_key, unique_states
)
SELECT kind, args::jsonb, queue, priority, max_attempts, coalesce(scheduled_at, now()), state,
       ARRAY(SELECT jsonb_array_elements_text(tags::jsonb))::varchar(255)[],
       metadata::jsonb, unique_key, unique_states::bit(8)
FROM input

-- fragment: river_job_keep_live_duplicate
-- River's unique insert: a job whose unique key a live job (one in its unique states) already
-- holds is not inserted; the partial unique index decides.
ON CONFLICT (unique_key)
    WHERE unique_key IS NOT NULL
      AND unique_states IS NOT NULL
      AND river_job_state_in_bitmask(unique_states, state)
    -- A no-op update so RETURNING yields the existing row; xmax != 0 marks it a duplicate.
    DO UPDATE SET kind = EXCLUDED.kind

-- fragment: river_job_insert_after_input
-- What job_insert_many and job_insert_one do with their CTE ``input`` (one row per job, with its
-- ord): insert the jobs, keeping a live duplicate instead, and NOTIFY ($12 the channel, $13 the
-- payloads); the statements differ only in how they read their input.
inserted AS (
    {{river_job_insert_from_input}}
    ORDER BY ord
    {{river_job_keep_live_duplicate}}
    RETURNING river_job.*, (xmax != 0) AS skipped
),
notified AS (
    SELECT count(pg_notify($12, payload)) AS n FROM unnest($13::text[]) AS payload
)
SELECT inserted.* FROM inserted, notified;

-- name: job_insert_many
-- Insert jobs in one statement, skipping live duplicates by unique key, and NOTIFY in the same
-- statement when any inserted job is available. Returns the inserted row or, on a unique
-- conflict, the existing live row with skipped = true (River's unique_skipped_as_duplicate).
-- $1 kind[], $2 args jsonb-as-text[], $3 queue[], $4 priority[], $5 max_attempts[],
-- $6 scheduled_at[] (NULL = now), $7 state[], $8 tags text[] as JSON text[], $9 metadata text[],
-- $10 unique_key bytea[], $11 unique_states text[] (bit(8) literal or NULL),
-- $12 notify channel, $13 notify payloads text[] (one per queue, may be empty).
WITH input AS (
    SELECT *
    FROM unnest(
        $1::text[], $2::text[], $3::text[], $4::smallint[], $5::smallint[],
        $6::timestamptz[], $7::river_job_state[], $8::text[], $9::text[], $10::bytea[], $11::text[]
    ) WITH ORDINALITY AS i(kind, args, queue, priority, max_attempts, scheduled_at, state, tags,
                           metadata, unique_key, unique_states, ord)
),
{{river_job_insert_after_input}}

-- name: job_insert_one
-- job_insert_many for one job, with the same parameters as scalars ($12 and $13 as there): the
-- statement a single insert sends; below its input the two are the same fragment. Both get
-- generic plans after five runs; what one job saves over scalars is the eleven one-element
-- arrays (encoded here, decoded and unnested there): 1.14 against 1.19 times a plain one-row
-- INSERT with its commit, measured on 18 (docs/benchmarks.md).
WITH input AS (
    SELECT $1::text AS kind, $2::text AS args, $3::text AS queue, $4::smallint AS priority,
           $5::smallint AS max_attempts, $6::timestamptz AS scheduled_at,
           $7::river_job_state AS state, $8::text AS tags, $9::text AS metadata,
           $10::bytea AS unique_key, $11::text AS unique_states, 1::bigint AS ord
),
{{river_job_insert_after_input}}

-- name: job_get_available_completing
-- Claim up to $2 available jobs of queue $1 for client $3 in one statement; the rows come back
-- running with attempt + 1. SKIP LOCKED lets many producers claim at once without waiting on
-- each other; a paused queue yields nothing. The same statement marks running jobs $5
-- completed: under load the producer carries the completer's plain completions, saving a round
-- trip per batch. $4 now (NULL = now()). $6 an args key and $7 its allowed values: with a key,
-- only jobs whose args lack it (or hold null) or hold one of $7 are claimed; $6 NULL claims
-- every job. The filter is checked on the rows the fetching index yields: each job it passes
-- over still costs a heap visit.
WITH completed AS (
    -- state::text, not state: the state check must not be an index condition. Otherwise a plan
    -- (a generic one, or a custom one on stale statistics) may walk the fetching index's
    -- 'running' entries, dead ones included, instead of looking the ids up (docs/benchmarks.md).
    UPDATE river_job
    SET state = 'completed', finalized_at = now()
    WHERE id = ANY($5::bigint[]) AND state::text = 'running'
),
locked_jobs AS (
    SELECT id
    FROM river_job
    WHERE state = 'available'
      AND queue = $1
      AND scheduled_at <= coalesce($4::timestamptz, now())
      AND NOT EXISTS (
          SELECT 1 FROM river_queue WHERE name = $1 AND paused_at IS NOT NULL
      )
      AND ($6::text IS NULL OR args ->> $6::text IS NULL OR args ->> $6::text = ANY($7::text[]))
    ORDER BY priority, scheduled_at, id
    LIMIT $2
    FOR UPDATE SKIP LOCKED
)
UPDATE river_job
SET state = 'running',
    attempt = river_job.attempt + 1,
    attempted_at = coalesce($4::timestamptz, now()),
    -- Keep the last 100 clients, as River does, so the array cannot grow without bound.
    attempted_by = array_append(
        coalesce(river_job.attempted_by[greatest(cardinality(river_job.attempted_by) - 98, 1):],
                 '{}'::text[]),
        $3::text
    )
FROM locked_jobs
WHERE river_job.id = locked_jobs.id
-- Every column Job reads, and no more: unique_states (a bit string) costs decoding and no one
-- reads it on the claim path.
RETURNING river_job.id, river_job.state, river_job.kind, river_job.args, river_job.queue,
          river_job.priority, river_job.attempt, river_job.max_attempts, river_job.scheduled_at,
          river_job.created_at, river_job.attempted_at, river_job.attempted_by,
          river_job.finalized_at, river_job.errors, river_job.metadata, river_job.tags,
          river_job.unique_key;

-- name: job_set_state_if_running_many
-- Record many outcomes in one statement. Only rows still running change (a job recovered or
-- cancelled meanwhile is left alone). A running job whose cancel was requested goes to cancelled
-- instead of being retried or snoozed. Returns the rows that changed.
-- $1 id[], $2 state[], $3 delay seconds[] (NULL = keep scheduled_at), $4 error JSON text[]
-- (NULL = none), $5 snooze[] (attempt - 1, metadata.snoozes + 1), $6 restore[] (attempt - 1
-- without counting a snooze: an interrupted run), $7 metadata patch JSON text[] (NULL = none).
WITH params AS (
    SELECT *
    FROM unnest(
        $1::bigint[], $2::river_job_state[], $3::float8[], $4::text[], $5::boolean[],
        $6::boolean[], $7::text[]
    ) AS p(id, state, delay, error, snooze, restore, metadata)
),
targets AS (
    SELECT p.*,
           CASE
               WHEN j.metadata ? 'cancel_attempted_at'
                    AND p.state IN ('available', 'retryable', 'scheduled')
                   THEN 'cancelled'::river_job_state
               ELSE p.state
           END AS final_state
    FROM params p
    JOIN river_job j ON j.id = p.id
    WHERE j.state::text = 'running'  -- looked up by id, never by state (the claim's note)
    FOR UPDATE OF j
)
UPDATE river_job j
SET state = t.final_state,
    attempt = CASE WHEN t.snooze OR t.restore THEN greatest(j.attempt - 1, 0) ELSE j.attempt END,
    scheduled_at = CASE
        WHEN t.delay IS NULL THEN j.scheduled_at
        ELSE now() + make_interval(secs => t.delay)
    END,
    finalized_at = CASE
        WHEN t.final_state IN ('cancelled', 'completed', 'discarded') THEN now()
    END,
    errors = CASE
        WHEN t.error IS NULL THEN j.errors
        ELSE array_append(coalesce(j.errors, '{}'::jsonb[]), t.error::jsonb)
    END,
    metadata = j.metadata
        || coalesce(t.metadata::jsonb, '{}'::jsonb)
        || CASE
               WHEN t.snooze THEN jsonb_build_object(
                   'snoozes', coalesce((j.metadata ->> 'snoozes')::int, 0) + 1)
               ELSE '{}'::jsonb
           END
FROM targets t
WHERE j.id = t.id AND j.state::text = 'running'
RETURNING j.id, j.state::text AS state, j.queue, j.scheduled_at;

-- name: job_get_by_id
-- One job by id. $1 id.
SELECT * FROM river_job WHERE id = $1;

-- name: job_get_by_id_many
-- Jobs by id, in id order. $1 id[].
SELECT * FROM river_job WHERE id = ANY($1::bigint[]) ORDER BY id;

-- name: job_list
-- Jobs filtered by optional state $1 and queue $2, newest first, at most $3.
SELECT *
FROM river_job
WHERE ($1::river_job_state IS NULL OR state = $1)
  AND ($2::text IS NULL OR queue = $2)
ORDER BY id DESC
LIMIT $3;

-- name: job_count_by_state
-- Job counts per queue and state, for status and metrics.
SELECT queue, state::text AS state, count(*) AS n FROM river_job GROUP BY queue, state;

-- name: job_queue_has_work
-- Whether queue $1 has work now: a job available or running, or scheduled or retryable and
-- due (the leader's scheduler makes it available). Pending jobs and jobs due later do not count.
SELECT EXISTS (
    SELECT 1 FROM river_job
    WHERE queue = $1
      AND (
          state IN ('available', 'running')
          OR (state IN ('scheduled', 'retryable') AND scheduled_at <= now())
      )
);

-- name: job_cancel
-- Cancel a job: a job not yet running is cancelled at once; a running job is marked with
-- cancel_attempted_at so its outcome becomes cancelled, and the caller notifies its process.
-- $1 id, $2 now. Returns the row after the change (NULL if no such job).
WITH locked AS (
    SELECT id, state FROM river_job WHERE id = $1 FOR UPDATE
)
UPDATE river_job j
SET state = CASE
        WHEN l.state IN ('available', 'pending', 'retryable', 'scheduled') THEN 'cancelled'
        ELSE j.state
    END,
    finalized_at = CASE
        WHEN l.state IN ('available', 'pending', 'retryable', 'scheduled') THEN $2::timestamptz
        ELSE j.finalized_at
    END,
    metadata = CASE
        WHEN l.state = 'running'
            THEN j.metadata || jsonb_build_object('cancel_attempted_at', $2::timestamptz)
        ELSE j.metadata
    END
FROM locked l
WHERE j.id = l.id
RETURNING j.*;

-- name: job_schedule
-- Leader's scheduler: make scheduled and retryable jobs due by $1 + 5 s (River's look-ahead)
-- available, at most $2 at once. A job whose unique key is already held by a live job (or by an
-- earlier job in this batch) is discarded with metadata unique_key_conflict, as River does.
-- Returns the queue and new state of each changed job.
WITH due AS (
    SELECT id, unique_key, unique_states
    FROM river_job
    WHERE state IN ('retryable', 'scheduled')
      AND scheduled_at <= coalesce($1::timestamptz, now()) + interval '5 seconds'
    ORDER BY priority, scheduled_at, id
    LIMIT $2
    FOR UPDATE SKIP LOCKED
),
decided AS (
    SELECT d.id,
           d.unique_key IS NOT NULL
           AND d.unique_states IS NOT NULL
           AND river_job_state_in_bitmask(d.unique_states, 'available')
           AND (
               row_number() OVER (PARTITION BY d.unique_key ORDER BY d.id) > 1
               OR EXISTS (
                   SELECT 1 FROM river_job o
                   WHERE o.unique_key = d.unique_key
                     AND o.id <> d.id
                     AND o.unique_states IS NOT NULL
                     AND river_job_state_in_bitmask(o.unique_states, o.state)
                     AND o.state NOT IN ('retryable', 'scheduled')
               )
           ) AS conflict
    FROM due d
)
UPDATE river_job j
SET state = CASE WHEN d.conflict THEN 'discarded'::river_job_state ELSE 'available' END,
    finalized_at = CASE WHEN d.conflict THEN now() END,
    metadata = CASE
        WHEN d.conflict THEN j.metadata || '{"unique_key_conflict": "scheduler_discarded"}'
        ELSE j.metadata
    END
FROM decided d
WHERE j.id = d.id
RETURNING j.queue, j.state::text AS state, j.scheduled_at;

-- name: job_delete_before
-- Cleaner: delete finalized jobs past their retention, oldest ids first, at most $4.
-- $1 completed cutoff, $2 cancelled cutoff, $3 discarded cutoff (NULL = keep forever).
DELETE FROM river_job
WHERE id IN (
    SELECT id
    FROM river_job
    WHERE (state = 'completed' AND finalized_at < $1::timestamptz)
       OR (state = 'cancelled' AND finalized_at < $2::timestamptz)
       OR (state = 'discarded' AND finalized_at < $3::timestamptz)
    ORDER BY id
    LIMIT $4
);

-- name: job_retry
-- Make a finished or waiting job available again now, as a fresh run (operator's retry).
-- $1 id. Running jobs are left alone.
UPDATE river_job
SET state = 'available',
    scheduled_at = now(),
    finalized_at = NULL,
    max_attempts = CASE WHEN attempt >= max_attempts THEN attempt + 1 ELSE max_attempts END
WHERE id = $1 AND state <> 'running'
RETURNING *;

-- name: job_set_completed_if_running_many
-- The common outcome on its own, cheaper to send and to plan than the general statement:
-- mark running jobs $1 completed. Returns the ids that changed.
UPDATE river_job
SET state = 'completed', finalized_at = now()
WHERE id = ANY($1::bigint[]) AND state::text = 'running'  -- by id, never by state (the claim)
RETURNING id;

-- name: job_rescue_orphaned_many
-- Running jobs of queue $1 whose execution is gone: started by an instance (the prefix of the
-- last attempted_by entry, "<instance>-exec-<capacity>-<nanos>") that is not in $5 (instances
-- with a live heartbeat, read from the registry by the caller), and not running a task under a
-- live execution lease either (an engine embedded in another app runs without registering; its
-- leases show it is alive). A job of an instance in $6 (the registry shows it dead: it had a
-- heartbeat, and it went stale) is taken at once; any other only once it started more than $2
-- seconds ago, since its instance may be one that has not registered yet. They go back to
-- available now without using an attempt, in their old place in the queue (their scheduled_at
-- kept: an interrupted job resumes before the jobs that came after it). At most $3; never this
-- process's own ($4). Returns the ids.
WITH orphans AS (
    SELECT j.id
    FROM river_job j
    CROSS JOIN LATERAL (
        SELECT regexp_replace(j.attempted_by[cardinality(j.attempted_by)],
                              '-exec-[0-9]+-[0-9]+$', '') AS instance
    ) AS a
    WHERE j.state = 'running'
      AND j.queue = $1
      AND NOT (a.instance = ANY($5::text[] || $4::text))
      AND (a.instance = ANY($6::text[]) OR j.attempted_at < now() - make_interval(secs => $2))
      AND NOT EXISTS (
          SELECT 1 FROM engine_task t
          WHERE t.id::text = j.args ->> 'task_id'
            AND t.status = 'running'
            AND t.lease_expires_at > now()
      )
    ORDER BY j.id
    LIMIT $3
    FOR UPDATE OF j SKIP LOCKED
)
UPDATE river_job j
SET state = 'available',
    scheduled_at = least(j.scheduled_at, now()),
    attempt = greatest(j.attempt - 1, 0),
    metadata = j.metadata || jsonb_build_object(
        'orphan_recovered', coalesce((j.metadata ->> 'orphan_recovered')::int, 0) + 1)
FROM orphans o
WHERE j.id = o.id
RETURNING j.id;

-- name: job_index_valid
-- Whether an index of that name exists in the search path, and is valid (NULL: it does not
-- exist; false: a concurrent build of it failed half-way). $1: index name.
SELECT i.indisvalid FROM pg_index i WHERE i.indexrelid = to_regclass($1);

-- name: job_index_create_args
-- River's GIN index on args (River creates it; engine only on request: queue.river_indexes).
CREATE INDEX CONCURRENTLY river_job_args_index ON river_job USING GIN (args);

-- name: job_index_create_kind
-- River's btree on kind (engine's migration 0006 drops it; back on request).
CREATE INDEX CONCURRENTLY river_job_kind ON river_job USING btree (kind);

-- name: job_index_create_metadata
-- River's GIN index on metadata (engine only on request).
CREATE INDEX CONCURRENTLY river_job_metadata_index ON river_job USING GIN (metadata);

-- name: job_index_drop_args
-- Drop what a failed concurrent build of river_job_args_index left (an invalid index).
DROP INDEX CONCURRENTLY IF EXISTS river_job_args_index;

-- name: job_index_drop_kind
-- Drop what a failed concurrent build of river_job_kind left.
DROP INDEX CONCURRENTLY IF EXISTS river_job_kind;

-- name: job_index_drop_metadata
-- Drop what a failed concurrent build of river_job_metadata_index left.
DROP INDEX CONCURRENTLY IF EXISTS river_job_metadata_index;
