-- Table engine_migration: which of sql/migrations/ this database has applied.

-- name: migration_table_create
-- Create the bookkeeping table if it is missing (idempotent; run under the migration lock).
CREATE TABLE IF NOT EXISTS engine_migration (
    version integer PRIMARY KEY,
    name text NOT NULL,
    skipped boolean NOT NULL DEFAULT false,
    applied_at timestamptz NOT NULL DEFAULT now()
);

-- name: migration_lock
-- Session advisory lock serializing migrators across processes. $1: lock key.
SELECT pg_advisory_lock($1);

-- name: migration_unlock
-- Release the lock taken by migration_lock. $1: lock key.
SELECT pg_advisory_unlock($1);

-- name: migration_get_applied
-- Versions already applied, in order.
SELECT version, name, skipped FROM engine_migration ORDER BY version;

-- name: migration_insert
-- Record one migration. $1: version, $2: name, $3: skipped because River's own schema is there.
INSERT INTO engine_migration (version, name, skipped) VALUES ($1, $2, $3);

-- name: migration_river_table_exists
-- Whether River's own migration table exists in the search path.
SELECT to_regclass('river_migration') IS NOT NULL;

-- name: migration_river_version
-- River's migration level on line main (NULL if none); only run when the table exists.
SELECT max(version) FROM river_migration WHERE line = 'main';
