"""How many jobs this instance may run at once, and the generations that run them.

The *global capacity* follows the catalogue: each enabled model and group contributes its
concurrency limit (:mod:`~engine.capacity.snapshot`). Every live instance registers with a
heartbeat and gets a share of it (:mod:`~engine.capacity.registry`,
:mod:`~engine.capacity.allocation`). The refresher (:mod:`~engine.capacity.refresher`) turns a
changed share into a new queue generation of that size, and the generation room
(:mod:`~engine.capacity.room`), the one owner of this process's generations, drains the old one.
``worker.capacity = "fixed"`` (:mod:`~engine.capacity.fixed`) skips the registry: one generation
of a set size.
"""
