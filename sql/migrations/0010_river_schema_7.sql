-- River's migration line main, version 7, on the schema engine created (0001): the notification
-- outbox table River's drivers without LISTEN use, the end of the unused river_client tables,
-- and the two column defaults (max_attempts 25, river_queue.updated_at now(); 0001 already set
-- them). Recorded in river_migration, so River's migrator and its Validate see the schema as
-- current. A River schema River created (0001 skipped), or one River's own migrator already
-- moved to 7 or later, is left as it is.
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM engine_migration WHERE version = 1 AND NOT skipped)
       AND NOT EXISTS (SELECT 1 FROM river_migration WHERE line = 'main' AND version >= 7)
    THEN
        CREATE TABLE river_notification (
            id bigserial PRIMARY KEY,
            created_at timestamptz NOT NULL DEFAULT now(),
            payload text NOT NULL,
            topic text NOT NULL,
            CONSTRAINT topic_length CHECK (length(topic) > 0 AND length(topic) < 128)
        );
        CREATE INDEX river_notification_created_at_idx ON river_notification (created_at);
        CREATE INDEX river_notification_topic_id_idx ON river_notification (topic, id);
        DROP TABLE river_client_queue;
        DROP TABLE river_client;
        ALTER TABLE river_job ALTER COLUMN max_attempts SET DEFAULT 25;
        ALTER TABLE river_queue ALTER COLUMN updated_at SET DEFAULT CURRENT_TIMESTAMP;
        INSERT INTO river_migration (line, version) VALUES ('main', 7);
    END IF;
END
$$;
