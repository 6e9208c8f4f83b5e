"""Every NOTIFY channel the engine sends on or listens to, named in one place.

River's three channels are qualified by the schema its tables live in (``<schema>.river_insert``
and friends, :class:`RiverChannels`), so a Go River client on the same database wakes our
producers and ours wake it. The engine's own channels are fixed names (:data:`ENGINE_CHANNELS`).

Python imports the names from here. SQL cannot: a trigger or a named query that NOTIFYs with a
literal channel (``pg_notify('engine_task_finished', ...)``) spells it out, and a test scans
``sql/`` so that every such literal is one of the names below (:func:`is_known_channel`).
"""

from __future__ import annotations

import attrs

from engine.db.bridge import Connection, Pool

__all__ = [
    "ADMISSION",
    "CATALOG",
    "ENGINE_CHANNELS",
    "RIVER_NAMES",
    "TASK_CALLBACK",
    "TASK_CANCEL",
    "TASK_FINISHED",
    "RiverChannels",
    "every_channel",
    "is_known_channel",
    "river_channels",
]

#: A task became final (a trigger on every such write, whoever wrote it); payload: its id.
TASK_FINISHED = "engine_task_finished"
#: Cancel requested for a running task; payload: its id. Its owner stops the execution.
TASK_CANCEL = "engine_task_cancel"
#: A verified upstream callback was recorded; payload: the task id. Wakes its execution.
TASK_CALLBACK = "engine_task_callback"
#: A scope slot was released: the admission dispatcher runs now.
ADMISSION = "engine_admission"
#: The catalogue (models, groups) or the set of instances changed: capacity refreshes now.
CATALOG = "engine_catalog"

#: The engine's own channels, in no schema.
ENGINE_CHANNELS: tuple[str, ...] = (TASK_FINISHED, TASK_CANCEL, TASK_CALLBACK, ADMISSION, CATALOG)

#: River's channel names, each sent as ``<schema>.<name>``.
RIVER_NAMES: tuple[str, ...] = ("river_insert", "river_control", "river_leadership")


@attrs.frozen
class RiverChannels:
    """River's NOTIFY channel names in one schema."""

    insert: str
    control: str
    leadership: str

    @classmethod
    def for_schema(cls, schema: str) -> RiverChannels:
        """River's names: ``<schema>.river_insert`` and friends."""
        insert, control, leadership = (f"{schema}.{name}" for name in RIVER_NAMES)
        return cls(insert, control, leadership)

    @property
    def all(self) -> tuple[str, str, str]:
        """The three names."""
        return (self.insert, self.control, self.leadership)


async def river_channels(db: Pool | Connection) -> RiverChannels:
    """River's channels in the schema ``db`` works in (its ``current_schema()``)."""
    return RiverChannels.for_schema(str(await db.fetchval("SELECT current_schema()")))


def every_channel(river: RiverChannels) -> tuple[str, ...]:
    """Every channel of a process: River's in its schema and the engine's own."""
    return (*river.all, *ENGINE_CHANNELS)


def is_known_channel(name: str) -> bool:
    """True if ``name`` is one of the engine's channels or River's in some schema."""
    schema, dot, rest = name.rpartition(".")
    return name in ENGINE_CHANNELS or (bool(dot) and bool(schema) and rest in RIVER_NAMES)
