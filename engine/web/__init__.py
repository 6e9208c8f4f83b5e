"""The process's HTTP server: ``/metrics``, ``/healthz``, ``/readyz`` and the web dashboard.

One ASGI server on trio (hypercorn's trio worker, :mod:`engine.web.server`) serves a Starlette
application (:mod:`engine.web.app`): prometheus_client's own exposition, the health checks,
and, when ``dashboard.enabled``, server-rendered pages (Jinja2 templates in ``templates/``,
htmx vendored in ``static/`` for the live refresh; no JavaScript build step). Who may use the
dashboard and how state changes are protected is :mod:`engine.web.auth`.
"""
