"""``python -m engine models`` and ``groups``: the catalogue, its limits and rates.

``models list`` / ``models set NAME [--limit N | --unlimited] [--rate N/S | --no-rate]
[--enable | --disable] [--provider P]`` / ``models delete NAME``
    ``{"models": [MODEL]}`` / ``{"model": MODEL}``; MODEL is ``{"name", "enabled",
    "concurrency_limit" (null: unlimited), "rate_limit" (requests per interval; null: none),
    "rate_interval" (seconds; null without a rate limit), "provider", "settings", "created_at",
    "updated_at"}``. ``--rate 10/1`` allows 10 requests per second (a token bucket of 10, refilled
    at that rate), ``--rate 30/60`` 30 a minute; ``--no-rate`` removes it. ``set`` changes only
    the options given; a new model starts enabled, unlimited, without a rate limit, on provider
    ``simulated``. Tables show the rate as ``10/1s``, which ``--rate`` accepts as it is.
    ``delete`` removes a model (``{"model": MODEL, "deleted": true}``) that no queued or running
    task uses; otherwise it refuses (exit 1) naming how many do: cancel them or let them finish
    first. Finished tasks keep the model's name; new submissions for it are refused.
``groups list`` / ``groups set KEY [--limit N | --unlimited] [--rate N/S | --no-rate]
[--enable | --disable]`` / ``groups delete KEY``
    ``{"groups": [GROUP]}`` / ``{"group": GROUP}``; GROUP is ``{"key", "enabled",
    "concurrency_limit", "rate_limit", "rate_interval", "created_at", "updated_at"}``.
    ``delete`` as for models (a group's tasks are those with that ``group_key``).

``list`` only reads; ``set`` and ``delete`` write (:mod:`engine.cli.common`).
"""

from __future__ import annotations

import argparse
from typing import Final

from engine.cli.exits import EXIT_OK
from engine.cli.formats import dumps, group_json, limit_text, model_json, model_settings, rate_text
from engine.cli.render import make_console, print_out, printable, table
from engine.db.bridge import Record
from engine.db.channels import CATALOG
from engine.db.sqlfiles import QUERIES
from engine.errors import EngineError
from engine.service.engine import Engine

__all__ = [
    "cmd_groups_delete",
    "cmd_groups_list",
    "cmd_groups_set",
    "cmd_models_delete",
    "cmd_models_list",
    "cmd_models_set",
]

_MODEL_GET: Final = QUERIES["model_get"]
_MODEL_LIST: Final = QUERIES["model_list"]
_MODEL_DELETE: Final = QUERIES["model_delete"]
_GROUP_LIST: Final = QUERIES["group_list"]
_GROUP_DELETE: Final = QUERIES["group_delete"]
_UNFINISHED_FOR_MODEL: Final = QUERIES["task_count_unfinished_for_model"]
_UNFINISHED_FOR_GROUP: Final = QUERIES["task_count_unfinished_for_group"]


async def cmd_models_list(eng: Engine, args: argparse.Namespace) -> int:
    """``models list``."""
    rows = await eng.db.coordination.fetch(_MODEL_LIST)
    if args.json:
        print(dumps({"models": [model_json(r) for r in rows]}))
        return EXIT_OK
    if not rows:
        print("no models")
        return EXIT_OK
    print_out(
        make_console(),
        table(
            ["NAME", "ENABLED", "LIMIT", "RATE", "PROVIDER", "UPDATED"],
            [
                [
                    r["name"],
                    r["enabled"],
                    limit_text(r["concurrency_limit"]),
                    rate_text(r),
                    r["provider"],
                    r["updated_at"],
                ]
                for r in rows
            ],
        ),
    )
    return EXIT_OK


async def cmd_models_set(eng: Engine, args: argparse.Namespace) -> int:
    """``models set NAME ...``: create a model or change the options given."""
    current = await eng.db.coordination.fetchrow(_MODEL_GET, args.name)
    rate_limit, rate_interval = _new_rate(args, current)
    await eng.set_model(
        args.name,
        enabled=args.enabled
        if args.enabled is not None
        else (current is None or current["enabled"]),
        concurrency_limit=_new_limit(
            args, None if current is None else current["concurrency_limit"]
        ),
        provider=args.provider or ("simulated" if current is None else current["provider"]),
        settings=None if current is None else model_settings(current["settings"]),
        rate_limit=rate_limit,
        rate_interval=rate_interval,
    )
    row = await eng.db.coordination.fetchrow(_MODEL_GET, args.name)
    assert row is not None
    if args.json:
        print(dumps({"model": model_json(row)}))
    else:
        verb = "created" if current is None else "updated"
        state = "enabled" if row["enabled"] else "disabled"
        print(
            f"model {printable(row['name'])} {verb}: {state}, "
            f"limit {limit_text(row['concurrency_limit'])}, rate {rate_text(row)}, "
            f"provider {printable(row['provider'])}"
        )
    return EXIT_OK


def _refuse_delete(kind: str, name: str, unfinished: int, hint: str) -> EngineError:
    noun = "task uses" if unfinished == 1 else "tasks use"
    return EngineError(
        f"{kind} {printable(name)!r} is not deleted: {unfinished} queued or running {noun} it "
        f"(`python -m engine tasks list {hint}`); cancel them or let them finish, then delete "
        "it again"
    )


async def cmd_models_delete(eng: Engine, args: argparse.Namespace) -> int:
    """``models delete NAME``: refused while unfinished tasks use it."""
    name: str = args.name
    if await eng.db.coordination.fetchrow(_MODEL_GET, name) is None:
        raise EngineError(f"no model named {printable(name)!r} (see `models list`)")
    unfinished = int(await eng.db.tasks.fetchval(_UNFINISHED_FOR_MODEL, name))
    if unfinished:
        raise _refuse_delete("model", name, unfinished, f"--model {printable(name)}")
    row = await eng.db.coordination.fetchrow(_MODEL_DELETE, name, CATALOG)
    if row is None:  # someone else deleted it meanwhile
        raise EngineError(f"no model named {printable(name)!r} (see `models list`)")
    if args.json:
        print(dumps({"model": model_json(row), "deleted": True}))
    else:
        print(f"model {printable(name)} deleted")
    return EXIT_OK


async def cmd_groups_list(eng: Engine, args: argparse.Namespace) -> int:
    """``groups list``."""
    rows = await eng.db.coordination.fetch(_GROUP_LIST)
    if args.json:
        print(dumps({"groups": [group_json(r) for r in rows]}))
        return EXIT_OK
    if not rows:
        print("no groups")
        return EXIT_OK
    print_out(
        make_console(),
        table(
            ["KEY", "ENABLED", "LIMIT", "RATE", "UPDATED"],
            [
                [
                    r["key"],
                    r["enabled"],
                    limit_text(r["concurrency_limit"]),
                    rate_text(r),
                    r["updated_at"],
                ]
                for r in rows
            ],
        ),
    )
    return EXIT_OK


async def _group_row(eng: Engine, key: str) -> Record | None:
    for row in await eng.db.coordination.fetch(_GROUP_LIST):
        if row["key"] == key:
            return row
    return None


async def cmd_groups_set(eng: Engine, args: argparse.Namespace) -> int:
    """``groups set KEY ...``: create a group or change the options given."""
    current = await _group_row(eng, args.key)
    rate_limit, rate_interval = _new_rate(args, current)
    await eng.set_group(
        args.key,
        enabled=args.enabled
        if args.enabled is not None
        else (current is None or current["enabled"]),
        concurrency_limit=_new_limit(
            args, None if current is None else current["concurrency_limit"]
        ),
        rate_limit=rate_limit,
        rate_interval=rate_interval,
    )
    row = await _group_row(eng, args.key)
    assert row is not None
    if args.json:
        print(dumps({"group": group_json(row)}))
    else:
        verb = "created" if current is None else "updated"
        state = "enabled" if row["enabled"] else "disabled"
        print(
            f"group {printable(row['key'])} {verb}: {state}, "
            f"limit {limit_text(row['concurrency_limit'])}, rate {rate_text(row)}"
        )
    return EXIT_OK


async def cmd_groups_delete(eng: Engine, args: argparse.Namespace) -> int:
    """``groups delete KEY``: refused while unfinished tasks use it."""
    key: str = args.key
    if await _group_row(eng, key) is None:
        raise EngineError(f"no group named {printable(key)!r} (see `groups list`)")
    unfinished = int(await eng.db.tasks.fetchval(_UNFINISHED_FOR_GROUP, key))
    if unfinished:
        raise _refuse_delete("group", key, unfinished, "--status queued")
    row = await eng.db.coordination.fetchrow(_GROUP_DELETE, key, CATALOG)
    if row is None:
        raise EngineError(f"no group named {printable(key)!r} (see `groups list`)")
    if args.json:
        print(dumps({"group": group_json(row), "deleted": True}))
    else:
        print(f"group {printable(key)} deleted")
    return EXIT_OK


def _new_limit(args: argparse.Namespace, current: int | None) -> int | None:
    if args.unlimited:
        return None
    if args.limit is not None:
        return int(args.limit)
    return current


def _new_rate(args: argparse.Namespace, current: Record | None) -> tuple[int | None, float]:
    """The ``rate_limit`` and ``rate_interval`` to write: ``--rate``, ``--no-rate``, or what the
    catalogue holds (none for a new entry)."""
    if args.no_rate or (args.rate is None and current is None):
        return None, 1.0
    if args.rate is not None:
        limit, interval = args.rate
        return int(limit), float(interval)
    assert current is not None
    return current["rate_limit"], float(current["rate_interval"])
