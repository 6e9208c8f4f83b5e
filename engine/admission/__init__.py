"""Scope admissions and rate limits.

A model or group with a concurrency limit is a *scope* (``model:<name>``, ``group:<key>``).
A running task holds one lease per limited scope it belongs to; when a scope is full, or other
tasks already wait for it, the task waits as an *admission* instead of busy-snoozing::

    (task claimed) ──room in every scope, nobody ahead──► leases taken ──► runs
          │                                                  ▲
          └──no room──► waiting ──dispatcher: room──► admitted (slot reserved, job enqueued)
                          │  ▲                              │
               queue timeout │  └───── not started in 45 s ──┘  (yielded back, keeps its place)
                          ▼
                        failed

The dispatcher serves waiting admissions first in, first out within a scope and round-robin
across groups, woken by NOTIFY when a lease is released plus a periodic tick. Several
dispatchers at once are safe: every decision about a scope runs under that scope's advisory
lock, taken in sorted order. Rate limits are token buckets kept in the database; a token taken
by a task that fails before reaching the upstream is given back.
"""
