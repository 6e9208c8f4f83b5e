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
