"""What ``/healthz``, ``/readyz`` and :attr:`Engine.ready <engine.service.engine.Engine.ready>`
report: the live state of the tree, not a flag set once at start.

Readiness is every supervised service up plus the conditions the services report (the
database answers, the capacity refreshes succeed, a share has a generation running it).
Liveness is only the database answering: a process that cannot reach its database does no
useful work, while one whose service restarts is mending itself.
"""

from __future__ import annotations

__all__ = ["DATABASE", "Health"]

#: The condition that ``/healthz`` reports (marked by the database probe).
DATABASE = "database"


class Health:
    """Which supervised services and conditions are up right now, and whether the tree serves."""

    def __init__(self) -> None:
        #: True between the end of the start and the beginning of the stop.
        self.serving = False
        self._up: dict[str, bool] = {}

    def mark(self, service: str, up: bool) -> None:
        """Record that ``service`` (or a condition) is up or down (crashed, restarting,
        failing)."""
        self._up[service] = up

    def down(self) -> list[str]:
        """The services and conditions that are down now."""
        return [name for name, up in self._up.items() if not up]

    def ready(self) -> bool:
        """True while the tree serves and every supervised service and condition is up."""
        return self.serving and not self.down()

    def alive(self) -> bool:
        """False while the database does not answer; true otherwise."""
        return self._up.get(DATABASE, True)
