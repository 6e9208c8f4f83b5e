-- Table engine_model (and engine_group): the concurrency limits the global capacity is computed
-- from. The tables belong to sql/migrations/0002_tasks.sql; this file holds only the capacity
-- read side.

-- name: capacity_limits_get
-- Every enabled model and group with its concurrency_limit (NULL or <= 0 = unlimited), in one
-- round trip: kind is 'model' or 'group', key is the model name or group key. No parameters.
-- Disabled rows never count toward capacity, so they are left out here already.
SELECT 'model' AS kind, name AS key, enabled, concurrency_limit
FROM engine_model
WHERE enabled
UNION ALL
SELECT 'group' AS kind, key, enabled, concurrency_limit
FROM engine_group
WHERE enabled
ORDER BY kind, key;
