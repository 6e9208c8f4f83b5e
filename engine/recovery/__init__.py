"""Self-healing: bring back work whose executor is gone.

A round, run at start and every ``recovery.interval`` seconds on every instance:

1. interrupted tasks: running tasks whose lease expired or whose owner is stale (or draining
   for too long) go back to queued, or to manual_review when their upstream submission is
   ambiguous; a task with an upstream reference resumes polling on its next run;
2. orphaned jobs: running jobs whose instance has no live heartbeat go back to available
   without using an attempt;
3. lost tasks: queued tasks with no live job get one (a unique insert, so this is idempotent).

Every step is safe on many instances at once (``FOR UPDATE SKIP LOCKED``, token fencing, unique
inserts); an error abandons only the rest of that round.
"""
