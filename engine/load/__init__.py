"""Load-aware admission inside one process: may one more execution start now, and may it enter
a heavy phase?

The controller (:mod:`~engine.load.controller`) bounds all executions of the process by its
claim limit, by a *safe capacity* that shrinks under CPU, memory and pool pressure, and by a
*heavy limit* on executions in the heavy phases (preparing, finalizing). The sampler
(:mod:`~engine.load.sampler`) reads the resources; a refused start snoozes its job for a short,
jittered delay (:mod:`~engine.load.retry_delay`) that uses no attempt. Time comes through a
clock protocol (:mod:`~engine.load.clock`), so tests drive it by hand.
"""
