-- Table engine_task: operator commands of the CLI (engine tasks retry, engine submit --follow).

-- name: task_requeue_final
-- Put a final task back to queued as a fresh run, if its status is one of $2: clear its
-- outcome, its cancel request and its execution lease, and make it due now. For failed and
-- manual_review tasks also clear submitted_at and upstream_ref: the operator decided to submit
-- upstream again (a manual_review task was ambiguous because of exactly those two fields).
-- Records an event of type $3 with message $4 and payload $5 (who decided and why, for a
-- resubmission). $6 instance id (of the event). Returns the row, or nothing when the task does
-- not exist or is not in one of $2. The caller inserts its job (task_set_job_many).
-- Used as `tasks retry` ($2 failed, cancelled, manual_review; task.retried) and as a review's
-- resubmission ($2 manual_review; task.resubmitted).
WITH requeued AS (
    UPDATE engine_task
    SET status = 'queued',
        phase = NULL,
        progress = 0,
        result = NULL,
        error = NULL,
        finished_at = NULL,
        cancel_requested_at = NULL,
        execution_token = NULL,
        execution_owner = NULL,
        lease_expires_at = NULL,
        started_at = NULL,
        submitted_at = CASE
            WHEN status IN ('failed', 'manual_review') THEN NULL ELSE submitted_at
        END,
        submitted_idempotently = CASE
            WHEN status IN ('failed', 'manual_review') THEN false ELSE submitted_idempotently
        END,
        upstream_ref = CASE
            WHEN status IN ('failed', 'manual_review') THEN NULL ELSE upstream_ref
        END,
        next_run_at = now(),
        updated_at = now()
    WHERE id = $1 AND status = ANY($2::text[])
      AND status IN ('failed', 'cancelled', 'manual_review')
    RETURNING *
),
events AS (
    INSERT INTO engine_task_event (task_id, type, status, progress, message, payload, simulated,
                                   instance_id)
    SELECT id, $3, 'queued', 0, $4, $5::jsonb, run_mode = 'simulation', $6
    FROM requeued
)
SELECT * FROM requeued;

-- name: task_count_by_status_for_ids
-- Counts per status of the given tasks, and the sum of their progress (0..1, as providers
-- report it), for progress displays. $1 id[].
SELECT status, count(*) AS n, coalesce(sum(progress), 0)::float8 AS progress
FROM engine_task WHERE id = ANY($1::uuid[]) GROUP BY status;

-- name: task_count_queued_live_by_model
-- Queued live tasks per model, for status: their jobs go only to instances serving the model.
SELECT model, count(*) AS n
FROM engine_task
WHERE status = 'queued' AND run_mode = 'live'
GROUP BY model
ORDER BY model;

-- name: task_resolve
-- An operator's decision on a manual_review task: $2 'succeeded' with result $3, or 'failed'
-- with error $4. Fenced: only a task still in manual_review changes. Records a task.resolved
-- event whose payload $6 says who decided and why, with message $5. $7 instance id (of the
-- event). Returns the row, or nothing when the task does not exist or is not in manual_review.
WITH resolved AS (
    UPDATE engine_task
    SET status = $2,
        phase = NULL,
        progress = CASE WHEN $2 = 'succeeded' THEN 1 ELSE progress END,
        result = CASE WHEN $2 = 'succeeded' THEN $3::jsonb END,
        error = CASE WHEN $2 = 'failed' THEN $4::jsonb END,
        finished_at = now(),
        updated_at = now()
    WHERE id = $1 AND status = 'manual_review' AND $2 IN ('succeeded', 'failed')
    RETURNING *
),
events AS (
    INSERT INTO engine_task_event (task_id, type, status, progress, message, payload, simulated,
                                   instance_id)
    SELECT id, 'task.resolved', status, progress, $5, $6::jsonb, run_mode = 'simulation', $7
    FROM resolved
)
SELECT * FROM resolved;

-- name: task_count_unfinished_for_model
-- Queued and running tasks of model $1 (from engine_task_live_index), before `models delete`.
SELECT count(*) FROM engine_task WHERE status IN ('queued', 'running') AND model = $1;

-- name: task_count_unfinished_for_group
-- Queued and running tasks of group $1 (from engine_task_live_index), before `groups delete`.
SELECT count(*) FROM engine_task WHERE status IN ('queued', 'running') AND group_key = $1;
