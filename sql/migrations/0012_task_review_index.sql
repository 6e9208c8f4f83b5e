-- The dashboard lists tasks in manual review, a status few tasks are ever in. A partial index
-- keeps that list index-bound; it costs nothing on the hot path, where no task enters the
-- status and the index's columns (status, created_at) are not ones the running writes change.
CREATE INDEX engine_task_review_index ON engine_task (created_at DESC, id DESC)
    WHERE status = 'manual_review';
