"""engine.domain: the task data every layer shares (the task, its request, identity, status,
phase and events), below the providers that run tasks and the tasks layer that stores them.

It imports nothing of engine but the database's record type, so a provider depends on the
data it is handed and on nothing that runs it.
"""
