-- Table engine_task_callback: verified upstream callbacks, one row per delivery.

-- name: task_callback_record
-- Record a verified callback of a live task and wake its owner (the NOTIFY is sent when the
-- statement commits). $1 task id, $2 delivery (hash of the signature), $3 upstream id or NULL,
-- $4 done, $5 result JSON text, $6 error message, $7 progress 0..1. Returns one row when it was
-- recorded; none when the task is missing or final, or the delivery was recorded before.
WITH recorded AS (
    INSERT INTO engine_task_callback (task_id, delivery, upstream_id, done, result, error,
                                      progress)
    SELECT t.id, $2, $3, $4, $5::jsonb, $6, $7
    FROM engine_task t
    -- Not final, said by finished_at (set exactly for the final statuses): a status test
    -- would let the planner walk the partial index of live tasks instead of the primary key.
    WHERE t.id = $1 AND t.finished_at IS NULL
    ON CONFLICT (task_id, delivery) DO NOTHING
    RETURNING task_id
)
SELECT task_id, pg_notify('engine_task_callback', task_id::text) AS notified FROM recorded;

-- name: task_callback_latest_many
-- The most telling callback of each task received since its submission: a finished one
-- before one that only reports progress, the newest first. $1 task id[]. One row per task at
-- most (tasks without one are left out). Per task, a lookup by the primary key's task_id.
SELECT t.id AS task_id, c.upstream_id, c.done, c.result, c.error, c.progress, c.received_at
FROM engine_task t
CROSS JOIN LATERAL (
    SELECT upstream_id, done, result, error, progress, received_at
    FROM engine_task_callback
    WHERE task_id = t.id AND received_at >= t.submitted_at
    ORDER BY done DESC, received_at DESC
    LIMIT 1
) c
WHERE t.id = ANY($1::uuid[]) AND t.submitted_at IS NOT NULL;

-- name: task_callback_delete_before
-- Delete callbacks received before $1, at most $2 of them. Returns the count (DELETE n).
DELETE FROM engine_task_callback
WHERE ctid = ANY (
    ARRAY(SELECT ctid FROM engine_task_callback WHERE received_at < $1 LIMIT $2)
);
