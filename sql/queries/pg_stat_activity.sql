-- View pg_stat_activity: the server's sessions. Every role may read another session's
-- application_name and datname there (most other columns are hidden from other users).

-- name: session_mark_for_transaction
-- Give this session the application name $1 until the end of the current transaction, so other
-- connections can find it (engine.db.database checks the role URLs reach one database).
SELECT set_config('application_name', $1, true);

-- name: session_count_marked
-- How many sessions of the current database carry the application name $1.
SELECT count(*) FROM pg_stat_activity WHERE application_name = $1 AND datname = current_database();
