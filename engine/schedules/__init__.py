"""Periodic tasks: schedules that submit a task (or a plain job) once per period.

:mod:`~engine.schedules.timing` says when periods begin (cron or fixed interval),
:mod:`~engine.schedules.model` what a schedule submits, :mod:`~engine.schedules.due` which
periods are due (pure), and :mod:`~engine.schedules.scheduler` fires them on the elected leader,
each period exactly once (docs/schedules.md).
"""
