"""Argument types and shared names of the command line, light enough for ``--help``.

``python -m engine --help`` and a malformed command line must answer at once, so this module
(and :mod:`engine.cli.commands`, which builds the parsers from it) imports only the standard
library: no trio, asyncpg, attrs or engine configuration. The commands' bodies live in a
module per command group (:mod:`engine.cli.tasks`, :mod:`engine.cli.submit`, ...), imported by
:func:`lazy` when a command runs.

A malformed value is an ``argparse.ArgumentTypeError``: argparse reports it as a usage error
naming the option (exit status 2).
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
import uuid
from collections.abc import Callable, Sequence
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

if TYPE_CHECKING:
    from engine.config import EngineConfig

__all__ = [
    "INT32_MAX",
    "JOB_STATES",
    "MAX_SUBMIT_COUNT",
    "TASK_STATUSES",
    "CommandFn",
    "before_arg",
    "count_arg",
    "format_interval",
    "join_dash_values",
    "json_arg",
    "lazy",
    "payload_arg",
    "positive_int",
    "rate_arg",
    "task_id_arg",
]

#: What a leaf parser stores as ``cli_run`` (``set_defaults``): run the command, return the exit
#: status. :func:`engine.cli.main.main` calls it with the parsed arguments and the configuration.
CommandFn = Callable[[argparse.Namespace, "EngineConfig"], int]

#: The largest count the catalogue and the registry store (PostgreSQL's integer).
INT32_MAX: Final = 2_147_483_647
#: The most tasks one ``submit`` stores (it streams them in batches; more is a usage error).
MAX_SUBMIT_COUNT: Final = 1_000_000

#: The task statuses (``engine.domain.tasks.TaskStatus``), spelled out so that building the
#: parser imports nothing heavy; a test checks that they match.
TASK_STATUSES: Final = (
    "queued", "running", "succeeded", "failed", "cancelled", "manual_review",
)  # fmt: skip
#: The job states (``engine.queue.states.JobState``), as :data:`TASK_STATUSES`.
JOB_STATES: Final = (
    "available", "cancelled", "completed", "discarded", "pending", "retryable", "running",
    "scheduled",
)  # fmt: skip

#: Options whose value may start with ``-`` (``--rate -1/1``): :func:`join_dash_values` glues
#: them to their option, so argparse reads the value instead of taking it for an option.
_DASH_VALUE_OPTIONS: Final = frozenset({"--rate"})


def lazy(module: str, name: str) -> CommandFn:
    """A :data:`CommandFn` that imports ``module`` when the command runs and calls its
    ``name``: parsing (and ``--help``) never imports a command's dependencies."""

    def run(args: argparse.Namespace, config: EngineConfig) -> int:
        command: CommandFn = getattr(importlib.import_module(module), name)
        return int(command(args, config))

    return run


def join_dash_values(argv: Sequence[str]) -> list[str]:
    """``argv`` with ``--rate -1/1`` written as ``--rate=-1/1``, so that a value starting with
    ``-`` reaches the option's type (and its clear message) instead of argparse's
    "expected one argument"."""
    out: list[str] = []
    items = list(argv)
    i = 0
    while i < len(items):
        item = items[i]
        if (
            item in _DASH_VALUE_OPTIONS
            and i + 1 < len(items)
            and items[i + 1].startswith("-")
            and items[i + 1][1:2] not in ("-", "")
        ):
            out.append(f"{item}={items[i + 1]}")
            i += 2
            continue
        out.append(item)
        i += 1
    return out


def positive_int(text: str) -> int:
    """argparse type: an integer from 1 to 2,147,483,647."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if not 1 <= value <= INT32_MAX:
        raise argparse.ArgumentTypeError(
            f"expected a positive integer up to {INT32_MAX:,}, got {value}"
        )
    return value


def count_arg(text: str) -> int:
    """argparse type of ``submit --count``: 1 to :data:`MAX_SUBMIT_COUNT`."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if not 1 <= value <= MAX_SUBMIT_COUNT:
        raise argparse.ArgumentTypeError(
            f"expected a count from 1 to {MAX_SUBMIT_COUNT:,} (the most one submit stores; "
            f"run several for more), got {value:,}"
        )
    return value


def task_id_arg(text: str) -> uuid.UUID:
    """argparse type: a task id (a UUID)."""
    try:
        return uuid.UUID(text.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a task id (a UUID): {text!r}") from None


def before_arg(text: str) -> uuid.UUID | datetime:
    """argparse type of ``tasks list --before``: a task id (the tasks listed after it, as the
    next page) or an ISO 8601 timestamp (tasks created before it; without an offset it is local
    time)."""
    value = text.strip()
    try:
        return uuid.UUID(value)
    except ValueError:
        pass
    try:
        when = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected a task id or an ISO 8601 timestamp (2026-12-01T10:00:00+00:00), got {text!r}"
        ) from None
    return when if when.tzinfo is not None else when.astimezone()


def json_arg(text: str) -> Any:
    """argparse type: any JSON value."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"not valid JSON ({exc})") from None


def payload_arg(text: str) -> Any:
    """argparse type of ``submit --payload``: JSON text, ``@FILE`` (the JSON in that file) or
    ``-`` (the JSON on standard input)."""
    source = "the command line"
    if text == "-":
        source = "standard input"
        text = sys.stdin.read()
    elif text.startswith("@"):
        path = Path(text[1:]).expanduser()
        source = str(path)
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise argparse.ArgumentTypeError(f"cannot read {path}: {exc}") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"not valid JSON ({exc}; from {source})") from None


def format_interval(seconds: float) -> str:
    """A rate interval as ``--rate`` reads it back: ``1``, ``0.5``, ``86400`` (no exponent, no
    rounding: ``models list`` prints rates in the form ``--rate`` accepts)."""
    if float(seconds).is_integer():
        return str(int(seconds))
    return repr(float(seconds))


def rate_arg(text: str) -> tuple[int, float]:
    """argparse type of ``--rate``: ``N/S`` or ``N/Ss``, N requests (an integer > 0) per S
    seconds (> 0, at most a year). ``10/1s`` is what ``models list`` prints for ``10/1``."""
    count, sep, seconds = text.strip().partition("/")
    seconds = seconds.strip().removesuffix("s")
    try:
        limit = int(count)
        interval = float(seconds)
    except ValueError:
        limit, interval = 0, 0.0
    if not sep or not 0 < limit <= INT32_MAX or not 0 < interval <= 86_400 * 366:
        raise argparse.ArgumentTypeError(
            f"expected N/S (N requests, 1 to {INT32_MAX:,}, per S seconds, more than 0 and at "
            f"most a year; e.g. 10/1 or 10/1s), got {text!r}"
        )
    return limit, interval
