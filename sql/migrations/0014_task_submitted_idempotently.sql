-- A submission made with an idempotency key (the task's provider submits idempotently). When
-- its owner dies before recording the answer, submitting again with the same key cannot run
-- the job twice, so recovery requeues the task instead of sending it to manual review.
ALTER TABLE engine_task ADD COLUMN submitted_idempotently boolean NOT NULL DEFAULT false;
