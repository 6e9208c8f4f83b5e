-- A task holds an execution token while it runs, and also while a claim of it waits to be
-- admitted into its scopes (a pending claim: status queued, token set). Recovery must find both
-- kinds when their owner dies, by owner and by lease expiry, without scanning every queued task.
DROP INDEX engine_task_owner_index;
CREATE INDEX engine_task_owner_index ON engine_task (execution_owner)
    WHERE execution_token IS NOT NULL;
CREATE INDEX engine_task_lease_index ON engine_task (lease_expires_at)
    WHERE execution_token IS NOT NULL;
