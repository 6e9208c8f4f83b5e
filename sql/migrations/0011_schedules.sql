-- Periodic schedules: one row per schedule a leader has declared. last_period is the cursor
-- (the boundary of the newest period submitted or passed over); the leader locks the row, submits
-- the due periods and moves the cursor in one transaction, so a period is submitted once even
-- when two leaders overlap during a hand-over.
CREATE TABLE engine_schedule (
    name text PRIMARY KEY,
    timing text NOT NULL,
    target text NOT NULL,
    last_period timestamptz,
    next_period timestamptz,
    fired_count bigint NOT NULL DEFAULT 0,
    passed_over_count bigint NOT NULL DEFAULT 0,
    last_fired_at timestamptz,
    last_error text,
    last_error_at timestamptz,
    declared_by text NOT NULL,
    declared_at timestamptz NOT NULL DEFAULT now(),
    created_at timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT name_length CHECK (char_length(name) > 0 AND char_length(name) <= 100)
);
