"""What ``/readyz`` and :attr:`Engine.ready <engine.service.engine.Engine.ready>` report: the live
state of the tree, not a flag set once at start."""

from __future__ import annotations

__all__ = ["Health"]


class Health:
    """Which supervised services are up right now, and whether the tree is serving."""

    def __init__(self) -> None:
        #: True between the end of the start and the beginning of the stop.
        self.serving = False
        self._up: dict[str, bool] = {}

    def mark(self, service: str, up: bool) -> None:
        """Record that ``service`` is up (started and running) or down (crashed, restarting)."""
        self._up[service] = up

    def down(self) -> list[str]:
        """The services that are down now."""
        return [name for name, up in self._up.items() if not up]

    def ready(self) -> bool:
        """True while the tree serves and every supervised service is up."""
        return self.serving and not self.down()
