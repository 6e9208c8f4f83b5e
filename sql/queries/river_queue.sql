-- Table river_queue: one row per queue; paused_at pauses fetching in every process.

-- name: queue_upsert
-- Register or touch a queue (producers do this on start). $1 name.
INSERT INTO river_queue (name) VALUES ($1)
ON CONFLICT (name) DO UPDATE SET updated_at = now()
RETURNING name, paused_at;

-- name: queue_pause
-- Pause queue $1 and tell every process through NOTIFY $2. Returns the row.
WITH q AS (
    INSERT INTO river_queue (name, paused_at) VALUES ($1, now())
    ON CONFLICT (name) DO UPDATE SET paused_at = coalesce(river_queue.paused_at, now()),
                                     updated_at = now()
    RETURNING name, paused_at
)
SELECT q.*, pg_notify($2, json_build_object('action', 'pause', 'queue', $1::text)::text)
FROM q;

-- name: queue_resume
-- Resume queue $1 and tell every process through NOTIFY $2 (producers fetch at once).
WITH q AS (
    INSERT INTO river_queue (name, paused_at) VALUES ($1, NULL)
    ON CONFLICT (name) DO UPDATE SET paused_at = NULL, updated_at = now()
    RETURNING name, paused_at
)
SELECT q.*, pg_notify($2, json_build_object('action', 'resume', 'queue', $1::text)::text)
FROM q;

-- name: queue_list
-- Every queue with its pause state.
SELECT name, paused_at, created_at, updated_at FROM river_queue ORDER BY name;

-- name: queue_notify_many
-- Wake the producers of some queues in every process: one NOTIFY per payload. $1 the insert
-- channel, $2 payloads (engine.queue.notifier.insert_payload).
SELECT pg_notify($1, payload) FROM unnest($2::text[]) AS payload;
