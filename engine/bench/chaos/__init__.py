"""``python -m engine bench chaos``: crash scenarios against real engine processes.

Each scenario runs on fresh databases with three worker processes
(:mod:`engine.bench.chaos.worker`: the full service, a simulated upstream of about 0.75 s per task,
and a ledger that records every upstream submission before the upstream accepts it). The intervals
are short (:data:`~engine.bench.chaos.run.WORKER_SETTINGS`): heartbeat every 0.5 s, stale after
3 s, recovery every 1 s, task leases of 3 s renewed every 1 s (a dead execution is detected by its
lease as soon as by its heartbeat). The bench process submits tasks open-loop at a steady rate
(about 60 % of the 30 execution slots: 500 tasks at 25/s, quick 150 at 20/s), injects the fault a
third of the way through, keeps submitting, then waits (bounded: 60 s, quick 30 s) for every task
to be final.

``bench chaos`` runs every scenario twice: at those short intervals, then at the production
defaults (60 s leases renewed every 20 s, heartbeats every 5 s, stale after 45 s, a recovery round
every 15 s: :func:`~engine.bench.chaos.run.production_settings`), where a dead worker's tasks wait
out its stale window before they move. The second pass's figures are prefixed ``production_``; its
recovery target is the stale window plus a scan interval (60 s) instead of 5 s, and the wait for
the last tasks grows by a lease and a stale window.

Scenarios (:data:`~engine.bench.chaos.scenarios.CHAOS_SCENARIOS`):

* ``sigkill_worker``: SIGKILL the worker running the most tasks.
* ``postgres_restart``: ``pg_ctl restart -m fast`` of the database server; the engine database
  lives on a private embedded server for this one, so restarting it hurts nobody else.
* ``backend_kill``: ``pg_terminate_backend`` of every ``engine%`` connection to the engine
  database (workers and the bench's own submitting client; restricted to that database so
  other users of the server are spared).
* ``lock_timeout``: workers run with ``database.lock_timeout = 0.2``; the bench submits a batch
  due one second later and holds ``SELECT … FOR UPDATE`` on those queued rows for 3 s, so the
  workers' claims hit SQLSTATE 55P03. The tasks must come back and complete after the release,
  and none may fail.
* ``scope_limits``: no fault; scope admissions and rate limits under contention. 1,000 tasks
  (quick 200) at 40/s, twice what the limits let through, over five models with concurrency
  limits 2, 3, 4, 5 and 6, two of them rate-limited (``sl-d`` 8 per 2 s, ``sl-e`` 5 per 1 s:
  both below what their slots could run), and three groups (``g-1`` limit 7, ``g-2`` limit 4,
  ``g-3`` unlimited with a rate limit of 20 per 1 s), written with ``Engine.set_model`` /
  ``set_group`` and read back from the catalogue. The wait for the last tasks is bounded at
  120 s (quick 60 s). Figures below.
* ``upstream_idempotent`` and ``upstream_once``: SIGKILL the worker with the most submissions
  in flight while an HTTP upstream (a fake on loopback, in the bench process) holds their
  answers for 2 s, on a model that sends an idempotency key and on one that does not; see
  :mod:`engine.bench.chaos.upstream` for their own figures and targets.
* ``pgbouncer_sigkill`` and ``pgbouncer_restart``: the workers reach the engine database only
  through a private PgBouncer in transaction pooling mode, with fewer server connections than
  they hold; SIGKILL a worker (LISTEN on a direct URL), or restart PgBouncer itself, cutting
  every connection the workers have (polling fallback, no LISTEN). See
  :mod:`engine.bench.chaos.pgbouncer`.

Figures, each prefixed with the scenario name (``sigkill_worker_tasks_lost``…):

* ``tasks``: tasks submitted (committed) by the bench.
* ``tasks_lost``: submitted tasks not in a final status (succeeded, failed, cancelled,
  manual_review) when the bounded wait ends. Target 0.
* ``submitted_twice``: tasks with more than one row in the ledger (the upstream saw them twice,
  or may have). Target 0.
* ``recovery_seconds``: from the fault ``F`` (for ``lock_timeout``: the release of the locks)
  until all work moves again, i.e. the later of

  - every task that existed and was not final at ``F`` has either been claimed by a new
    execution after ``F`` (its first ``task.started`` event after ``F``) or reached a final
    status after ``F``, and
  - a task claimed after ``F`` has completed (work flows end to end).

  "Existed and was not final at ``F``" is ``created_at <= F`` and no ``finished_at`` before
  ``F``, read from the rows afterwards, so it needs no racy snapshot; event times are the
  workers' clocks, ``F`` the bench's, all on one host. A task that never moves makes it the
  length of the whole wait (so the target is missed). Target ≤ 5 s.
* ``manual_review``: tasks in manual review; expected only for submissions that were in flight
  (sent, answer not recorded) at the fault. They are final, not lost.
* ``tasks_failed``: tasks that failed. The simulated upstream never fails, so each is a wrong
  outcome caused by the fault (target 0 for ``lock_timeout``; reported for the others).
* ``seconds`` (instead of ``recovery_seconds`` in a scenario without a fault): from the first
  task's creation until the last one is final.
* per scenario: ``victim_running_tasks`` (tasks the killed worker was running),
  ``outage_seconds`` (how long ``pg_ctl restart`` took), ``backends_killed``,
  ``locked_tasks`` / ``blocked_claims`` (rows locked; jobs of locked tasks worked while the
  locks were held: ≥ 1 proves the lock-timeout path ran), ``locked_not_succeeded`` (locked
  tasks that did not end succeeded, target 0), ``hold_seconds``.

``scope_limits`` figures (the limits are those the catalogue holds):

* ``limit_exceeded_samples``: the bench samples ``engine_scope_lease`` every 20 ms (one
  statement, so one snapshot) on a connection of its own; each (sample, scope) where a scope
  holds more leases than its concurrency limit counts one. Target 0. ``samples`` is how many
  samples were taken; ``slots_exceeded_samples`` counts the same for leases plus reserved slots
  (admitted, not started: what admission itself counts against the limit), reported only;
  ``reserved_share`` is the share of the held slot-time that was reserved-not-started.
* ``limit_exceeded_events``: the same from the task events, between samples too. An execution
  runs from its ``task.started`` (unless the next event is ``task.waiting`` or
  ``task.rate_limited``: admission turned it away) to its final or requeue event; a sweep per
  model and group counts each time the running executions stayed above the limit for longer
  than 50 ms. Event times are stamped as admission commits and just after the release commits,
  in different trio tasks, so the intervals over-cover the slot: at a
  hand-over the next task's start can be stamped a few milliseconds before the previous one's
  end. Those boundary excesses are counted apart as ``limit_boundary_overlaps`` (reported
  only); a task running without its slot would overlap for most of its ~0.85 s run. Target 0.
  ``limit_exceeded_longest_seconds`` is the longest excess of either kind.
  ``peak_running_<scope>`` (the most executions at once for longer than 50 ms) and
  ``peak_leases_<scope>`` (sampled) next to ``concurrency_limit_<scope>`` show each limit was
  reached.
* ``rate_exceeded_windows``: from the ledger's submission times (what the upstream saw), per
  rate-limited scope of capacity ``C`` per interval ``I``: a token bucket lets at most
  ``C + floor(C * w / I)`` requests through in any window of length ``w``, ``2 C`` for
  ``w = I``. Every window ``[t, t + I]`` starting at a submission is checked; each over ``2 C``
  counts one. Target 0. So a reader can judge how tight that is: ``rate_window_max_<scope>``
  (most submissions in one such window, against ``rate_allowed_per_window_<scope>`` = 2 C),
  and ``rate_long_run_per_s_<scope>`` (submissions per second from the first to the last, the
  initial burst included) against ``rate_limit_per_s_<scope>`` (C / I). Ledger times follow the
  token by the prepare phase (50–150 ms), so they are what the upstream saw, not the bucket's
  own clock.
* ``admissions_waited`` (tasks that waited in line at least once), ``rate_limited_retries``
  (``task.rate_limited`` events): the limits bound.

The modules:

* :mod:`~engine.bench.chaos.run`: what a scenario is (:class:`~engine.bench.chaos.run.ChaosScenario`
  and its hooks) and what one run holds, the workers' settings, the bench's monitor connection;
* :mod:`~engine.bench.chaos.harness`: the pieces of a run (a private server, worker processes,
  submissions at a rate, waits for final states, the bench's databases), also used by
  ``bench soak``;
* :mod:`~engine.bench.chaos.faults`: the injectors (kills, restarts, locks);
* :mod:`~engine.bench.chaos.scope_limits`: the ``scope_limits`` scenario's hooks and analysis;
* :mod:`~engine.bench.chaos.upstream`, :mod:`~engine.bench.chaos.pgbouncer`: the scenarios of
  real upstreams and of PgBouncer;
* :mod:`~engine.bench.chaos.report`: the common figures and targets;
* :mod:`~engine.bench.chaos.scenarios`: the list of scenarios, and running one or all of them
  (:func:`~engine.bench.chaos.scenarios.run_chaos_scenario`,
  :func:`~engine.bench.chaos.scenarios.run_chaos_bench`);
* :mod:`~engine.bench.chaos.worker`: the worker process (``python -m engine.bench.chaos.worker``).

This package's ``__init__`` imports nothing, so starting a worker process loads only what the
worker needs.
"""
