-- River's river_job_kind index (a btree on kind) goes the way of its GIN indexes (0001): every
-- claim and completion is a non-HOT update that writes every index of the row again, this one
-- cost ~8 % of the no-op burn-down's throughput, and nothing in engine reads jobs by kind. Only
-- the schema engine created is changed: when 0001 was skipped, river_job is River's own, and
-- River's indexes stay as they are. Add it back if you filter jobs by kind on a large table
-- (docs/queue.md).
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM engine_migration WHERE version = 1 AND NOT skipped) THEN
        DROP INDEX IF EXISTS river_job_kind;
    END IF;
END
$$;
