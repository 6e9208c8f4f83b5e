-- Callbacks: an upstream that finishes a job calls POST /hooks/<task id>, signed with the
-- model's shared secret. Each accepted delivery is one row, written before the owner of the
-- task is woken, so a callback is not lost while the owner is between polls or restarting.
-- The primary key refuses a replay: a delivery is named by a hash of its signature, and the
-- same signature is never recorded twice for a task. Rows are history for the run that reads
-- them and are deleted by the leader after a day (far longer than any timestamp tolerance, so
-- a replay is refused by its timestamp once its row is gone).
CREATE TABLE engine_task_callback (
    task_id uuid NOT NULL,
    delivery text NOT NULL,
    upstream_id text,
    done boolean NOT NULL,
    result jsonb,
    error text,
    progress real,
    received_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (task_id, delivery)
);
CREATE INDEX engine_task_callback_received_index ON engine_task_callback (received_at);
