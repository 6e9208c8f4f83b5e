"""The one place that maps the app's configuration onto each control loop's settings.

The control loops (recovery, the admission dispatcher) sit below the configuration that
composes every section, so each takes a small settings class of its own: the sections it owns
and the few values it borrows from other sections. The service builds them here, and so do
tests that build a loop on its own.
"""

from __future__ import annotations

from engine.admission.dispatcher import DispatcherSettings
from engine.config import EngineConfig
from engine.recovery.rescuer import RecoverySettings

__all__ = ["dispatcher_settings", "recovery_settings"]


def recovery_settings(config: EngineConfig) -> RecoverySettings:
    """Recovery's settings: ``[recovery]``, ``[queue]`` and the worker and admission timings
    it judges liveness and stale admissions by."""
    return RecoverySettings(
        recovery=config.recovery,
        queue=config.queue,
        stop_timeout=config.worker.stop_timeout,
        rollback_timeout=config.worker.enqueue_rollback_timeout,
        admission_stale_after=config.admission.stale_after,
    )


def dispatcher_settings(config: EngineConfig) -> DispatcherSettings:
    """The admission dispatcher's settings: ``[admission]``, ``[queue]`` and the enqueue
    rollback bound."""
    return DispatcherSettings(
        admission=config.admission,
        queue=config.queue,
        rollback_timeout=config.worker.enqueue_rollback_timeout,
    )
