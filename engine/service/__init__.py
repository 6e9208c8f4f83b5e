"""The service: the one tree every way of running engine runs.

* :mod:`engine.service.root` — :func:`~engine.service.root.serve` owns the root nursery and the
  whole start and stop order; :func:`~engine.service.root.open` runs it for an ``async with``
  block (``engine.open``). Two layers, each shielded and stopped explicitly in order: the
  records layer (event writer, completer, notifier, task notices, lease keeper, elector)
  outlives the control layer (metrics, load sampler, recovery, admission, capacity with its
  generations, gauges), so every outcome of a stopping run is recorded.
* :mod:`engine.service.assemble` builds every part from the configuration before any runs;
  :mod:`engine.service.control` starts the control layer's siblings in order;
  :mod:`engine.service.settings` gives each control loop its own settings;
  :mod:`engine.service.observe` is the one observer every part reports to (the metrics).
* :mod:`engine.service.supervise` — the control layer's siblings restart from a fresh state
  after a crash; :mod:`engine.service.health` is what ``/readyz`` reports.
* :mod:`engine.service.engine` — the open :class:`~engine.service.engine.Engine` (submit,
  wait, cancel, read, the catalogue).

Invariants: nothing outside this package opens a root nursery or knows the start order; a
start that fails is retried from scratch (``worker.startup_attempts``) unless it is a
configuration error; the shutdown policy is the capacity room's
(:mod:`engine.capacity.room`): drain for ``worker.shutdown_drain_timeout``, then requeue.
"""
