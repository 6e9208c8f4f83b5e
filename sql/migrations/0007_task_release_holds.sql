-- What a task gives back when it stops running, in one place for every path that stops it
-- (task_finish_many, task_requeue_many): its scope slots, waking the admission dispatchers when
-- it held any, and its unspent rate tokens, returned to their buckets.
CREATE FUNCTION engine_task_release_holds(task_ids uuid[]) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    released integer;
BEGIN
    DELETE FROM engine_scope_lease WHERE task_id = ANY(task_ids);
    GET DIAGNOSTICS released = ROW_COUNT;
    WITH refunded AS (
        DELETE FROM engine_rate_reservation WHERE task_id = ANY(task_ids) RETURNING scope
    )
    UPDATE engine_rate_bucket b SET tokens = b.tokens + x.n
    FROM (SELECT scope, count(*) AS n FROM refunded GROUP BY scope) x
    WHERE b.scope = x.scope;
    IF released > 0 THEN
        PERFORM pg_notify('engine_admission', '');
    END IF;
END
$$;
