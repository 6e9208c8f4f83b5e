-- The one statement of the rule "is this task's upstream submission ambiguous?": an upstream
-- call started (submitted_at), no reference was recorded, and the call carried no idempotency
-- key. Such a task cannot be submitted again safely, so requeueing and recovery send it to
-- manual review. A plain SQL expression, IMMUTABLE: the planner inlines it into each statement
-- that uses it, so it costs what the expression costs. engine.domain.tasks.Task states the same
-- rule for the rows Python holds (submission_ambiguous).
CREATE FUNCTION engine_task_submission_ambiguous(
    submitted_at timestamptz, upstream_ref text, submitted_idempotently boolean
) RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN submitted_at IS NOT NULL AND upstream_ref IS NULL AND NOT submitted_idempotently;
