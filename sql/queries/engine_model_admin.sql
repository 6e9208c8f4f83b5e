-- Tables engine_model and engine_group: the catalogue operators and submitters read and write.

-- name: model_get
-- One model by name. $1 name.
SELECT * FROM engine_model WHERE name = $1;

-- name: model_get_many
-- Models by name. $1 name[].
SELECT * FROM engine_model WHERE name = ANY($1::text[]);

-- name: model_list
-- Every model, by name.
SELECT * FROM engine_model ORDER BY name;

-- name: model_upsert
-- Create or change a model. $1 name, $2 enabled, $3 concurrency_limit (NULL = unlimited),
-- $4 provider, $5 settings JSON text, $6 rate_limit (requests per interval; NULL = none),
-- $7 rate_interval (seconds). NOTIFY $8 so capacity refreshes at once.
WITH upserted AS (
    INSERT INTO engine_model (name, enabled, concurrency_limit, provider, settings, rate_limit,
                              rate_interval)
    VALUES ($1, $2, $3, $4, $5::jsonb, $6, $7)
    ON CONFLICT (name) DO UPDATE
        SET enabled = EXCLUDED.enabled,
            concurrency_limit = EXCLUDED.concurrency_limit,
            provider = EXCLUDED.provider,
            settings = EXCLUDED.settings,
            rate_limit = EXCLUDED.rate_limit,
            rate_interval = EXCLUDED.rate_interval,
            updated_at = now()
    RETURNING *
)
SELECT upserted.*, pg_notify($8, json_build_object('model', $1::text)::text) IS NOT NULL AS notified
FROM upserted;

-- name: group_list
-- Every group, by key.
SELECT * FROM engine_group ORDER BY key;

-- name: group_upsert
-- Create or change a group. $1 key, $2 enabled, $3 concurrency_limit (NULL = unlimited),
-- $4 rate_limit (requests per interval; NULL = none), $5 rate_interval (seconds).
-- NOTIFY $6 so capacity refreshes at once.
WITH upserted AS (
    INSERT INTO engine_group (key, enabled, concurrency_limit, rate_limit, rate_interval)
    VALUES ($1, $2, $3, $4, $5)
    ON CONFLICT (key) DO UPDATE
        SET enabled = EXCLUDED.enabled,
            concurrency_limit = EXCLUDED.concurrency_limit,
            rate_limit = EXCLUDED.rate_limit,
            rate_interval = EXCLUDED.rate_interval,
            updated_at = now()
    RETURNING *
)
SELECT upserted.*, pg_notify($6, json_build_object('group', $1::text)::text) IS NOT NULL AS notified
FROM upserted;

-- name: model_delete
-- Remove a model from the catalogue (`models delete`). $1 name. NOTIFY $2 so capacity refreshes
-- at once. Returns the deleted row, none if there was no such model.
WITH deleted AS (
    DELETE FROM engine_model WHERE name = $1 RETURNING *
)
SELECT deleted.*, pg_notify($2, json_build_object('model', $1::text)::text) IS NOT NULL AS notified
FROM deleted;

-- name: group_delete
-- Remove a group from the catalogue (`groups delete`). $1 key. NOTIFY $2 so capacity refreshes
-- at once. Returns the deleted row, none if there was no such group.
WITH deleted AS (
    DELETE FROM engine_group WHERE key = $1 RETURNING *
)
SELECT deleted.*, pg_notify($2, json_build_object('group', $1::text)::text) IS NOT NULL AS notified
FROM deleted;
