"""Providers: the seam between a task and the upstream API that does its work.

:mod:`~engine.providers.base` is the protocol a provider implements (prepare, submit, poll,
finalize) and the answers it may give; :mod:`~engine.providers.context` is what a provider
knows about the task it runs and the resources it shares for the service's life;
:mod:`~engine.providers.app` loads the user's providers from the ``app`` setting and checks
them; :mod:`~engine.providers.simulated` is the simulated upstream every engine has;
:mod:`~engine.providers.throttle` holds a model back while its upstream says it is busy; and
:mod:`engine.providers.http` is a provider for an HTTP API built from a description, with a
fake upstream for tests. Providers depend only on the task models, never on the runner.
"""
