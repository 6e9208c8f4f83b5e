"""The command line, ``python -m engine``: one module per command group.

:mod:`~engine.cli.main` parses and dispatches (each command's module is imported only when it
runs, so ``--help`` stays fast); :mod:`~engine.cli.service` runs the service (``run``,
``migrate``), :mod:`~engine.cli.demo` the demo, :mod:`~engine.cli.db` the embedded server,
:mod:`~engine.cli.bench` the benchmarks, :mod:`~engine.cli.dashboard` the dashboard alone.
The client commands (:mod:`~engine.cli.submit`, :mod:`~engine.cli.status`,
:mod:`~engine.cli.tasks`, :mod:`~engine.cli.queue`, :mod:`~engine.cli.models`) open the engine
through :mod:`~engine.cli.common` and write with :mod:`~engine.cli.formats` (JSON) and
:mod:`~engine.cli.render` (rich tables). Shared pieces with no engine imports: argument types
(:mod:`~engine.cli.args`), exit statuses (:mod:`~engine.cli.exits`), signal handling
(:mod:`~engine.cli.signals`). Domain operations live in the engine, never here: a command
calls :class:`~engine.service.engine.Engine`.
"""
