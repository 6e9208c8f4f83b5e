-- Table engine_schedule: periodic schedules, their cursors, and what the leader last did.

-- name: schedule_declare_many
-- Register the schedules a new leader runs (their cursors are kept). $1: names, $2: timings,
-- $3: targets (texts for status), $4: the leader's id.
INSERT INTO engine_schedule (name, timing, target, declared_by)
SELECT name, timing, target, $4
FROM unnest($1::text[], $2::text[], $3::text[]) AS d (name, timing, target)
ON CONFLICT (name) DO UPDATE
SET timing = excluded.timing,
    target = excluded.target,
    declared_by = excluded.declared_by,
    declared_at = now();

-- name: schedule_lock
-- The schedule's cursor, locked until the transaction ends (a second leader waits here).
-- $1: name.
SELECT last_period FROM engine_schedule WHERE name = $1 FOR UPDATE;

-- name: schedule_advance
-- Record a pass: the new cursor and next boundary, how many periods it submitted and passed
-- over. $1: name, $2: cursor, $3: next boundary, $4: submitted, $5: passed over.
UPDATE engine_schedule
SET last_period = $2,
    next_period = $3,
    fired_count = fired_count + $4,
    passed_over_count = passed_over_count + $5,
    last_fired_at = CASE WHEN $4 > 0 THEN now() ELSE last_fired_at END,
    last_error = NULL,
    last_error_at = NULL
WHERE name = $1;

-- name: schedule_set_error
-- Record why a pass failed (it is tried again). $1: name, $2: the error.
UPDATE engine_schedule SET last_error = $2, last_error_at = now() WHERE name = $1;

-- name: schedule_list
-- Every schedule any leader declared, by name.
SELECT name, timing, target, last_period, next_period, fired_count, passed_over_count,
       last_fired_at, last_error, last_error_at, declared_by, declared_at
FROM engine_schedule
ORDER BY name;
