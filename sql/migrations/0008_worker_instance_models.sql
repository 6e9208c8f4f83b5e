-- Which models each instance serves: the models it has a provider for, whose live tasks it
-- claims (engine/tasks/jobs.py routes a live task's job by its model). NULL means every model
-- (an instance that claims every job, as before this column existed); an empty array means no
-- live model: the instance runs only tasks whose jobs name no model (simulation tasks, jobs
-- inserted without one). Status output reads it to say which queued models no live instance
-- serves (worker_instance_unserved_models).
ALTER TABLE engine_worker_instance ADD COLUMN models text[];
