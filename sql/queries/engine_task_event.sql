-- Table engine_task_event: the append-only history of each task.

-- name: task_event_insert_many
-- Append events. $1 task_id[], $2 type[], $3 status[], $4 phase[], $5 progress[], $6 message[],
-- $7 payload JSON text[], $8 simulated[], $9 instance_id[], $10 at[].
INSERT INTO engine_task_event (
    task_id, type, status, phase, progress, message, payload, simulated, instance_id, at
)
SELECT task_id, type, status, phase, progress, message, coalesce(payload::jsonb, '{}'),
       simulated, instance_id, at
FROM unnest($1::uuid[], $2::text[], $3::text[], $4::text[], $5::real[], $6::text[], $7::text[],
            $8::boolean[], $9::text[], $10::timestamptz[])
     AS e(task_id, type, status, phase, progress, message, payload, simulated, instance_id, at);

-- name: task_event_list
-- A task's events in order. $1 task id.
SELECT * FROM engine_task_event WHERE task_id = $1 ORDER BY id;

-- name: task_report_progress_many
-- Record providers' progress reports of running tasks: the task's progress (never lowered: a
-- report overtaken by the next phase leaves the phase's own value), and a task.progress
-- event, both only where the execution token still holds the running task (a stale
-- execution writes nothing). $1 id[], $2 token[], $3 phase[], $4 progress[], $5 message[],
-- $6 payload JSON text[], $7 simulated[], $8 instance_id[], $9 at[]. Returns the ids written.
-- Locks its rows in id order first (see the top of engine_task.sql).
WITH locked AS MATERIALIZED (
    SELECT id FROM engine_task WHERE id = ANY($1::uuid[]) ORDER BY id FOR NO KEY UPDATE
),
reported AS (
    UPDATE engine_task t
    SET progress = greatest(t.progress, i.progress), updated_at = now()
    FROM unnest($1::uuid[], $2::uuid[], $3::text[], $4::real[], $5::text[], $6::text[],
                $7::boolean[], $8::text[], $9::timestamptz[])
         AS i(id, token, phase, progress, message, payload, simulated, instance_id, at)
    WHERE t.id = ANY($1::uuid[]) AND t.id = i.id AND (SELECT count(*) FROM locked) > 0
      AND i.token IS NOT NULL AND t.execution_token IS NOT DISTINCT FROM i.token
      AND coalesce(t.status = 'running', false)  -- see the top of engine_task.sql
    -- The event's fields come back with the row, so the events need no join with the input.
    RETURNING t.id, i.phase, i.progress, i.message, i.payload, i.simulated, i.instance_id, i.at
),
events AS (
    INSERT INTO engine_task_event (
        task_id, type, status, phase, progress, message, payload, simulated, instance_id, at
    )
    SELECT r.id, 'task.progress', 'running', r.phase, r.progress, r.message,
           coalesce(r.payload::jsonb, '{}'), r.simulated, r.instance_id, r.at
    FROM reported r
)
SELECT id FROM reported;
