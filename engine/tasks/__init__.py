"""Tasks: storing them, giving them jobs, and running them fenced.

- **Storing**: :mod:`~engine.tasks.submit` validates requests and stores each task with its
  job in one transaction; :mod:`~engine.tasks.store` reads task rows and batches their fenced
  writes and events; :mod:`~engine.tasks.jobs` is the one home of "give a task a job" (the
  job's args, its insert options, and the statement that points tasks at their jobs), used by
  submission, admission, recovery and retry.
- **Running**: :mod:`~engine.tasks.runner` is the job handler with the decision table; it
  claims, admits and runs one execution (:mod:`~engine.tasks.execution`), calls the provider
  (:mod:`~engine.tasks.upstream`), writes under its lease token (:mod:`~engine.tasks.fenced`),
  and the lease keeper renews every lease of the process (:mod:`~engine.tasks.leases`). It asks
  the load controller and the admission through protocols of its own
  (:mod:`~engine.tasks.gates`), since both sit in the control layer above it.
- **Around a run**: notifications to waiters and executions (:mod:`~engine.tasks.notices`),
  verified upstream callbacks (:mod:`~engine.tasks.callbacks`), operators' decisions and
  retries (:mod:`~engine.tasks.review`, through the open engine's protocol in
  :mod:`~engine.tasks.host`), and the ``[tasks]`` settings (:mod:`~engine.tasks.config`).

The task data itself (task, request, status, events) is :mod:`engine.domain`.
"""
