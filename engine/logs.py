"""Structured log lines: ``key=value`` for people, one JSON object per line for collectors.

Engine logs with a stable ``event`` key and its fields in ``extra``, never meaning only in the
message text::

    log.info("generation started", extra={"event": "generation_started", "generation": 3})

renders as (``kv``)::

    ts=2026-11-30T16:33:00.123Z level=info logger=engine.queue event=generation_started generation=3 msg="generation started"

or (``json``)::

    {"ts": "2026-11-30T16:33:00.123Z", "level": "info", "logger": "engine.queue", "event": "generation_started", "generation": 3, "msg": "generation started"}

Records without an ``event`` (from other libraries) get ``event=log``. An exception attached to
a record (``log.exception``) is rendered as ``exc_type`` plus the traceback in ``exc``, still on
one line.
"""  # noqa: E501

from __future__ import annotations

import json
import logging
import re
import sys
from datetime import UTC, datetime
from typing import IO, Any, Final, Literal

import attrs

from engine.settings import choice, setting

__all__ = [
    "JsonFormatter",
    "KvFormatter",
    "LogFormat",
    "LoggingConfig",
    "OneLineReconnects",
    "configure_logging",
    "record_fields",
]

LogFormat = Literal["kv", "json"]


@attrs.frozen
class LoggingConfig:
    """Log output."""

    format: Literal["kv", "json"] = setting(
        "kv",
        "`kv` writes `key=value` lines for people; `json` writes one JSON object per line for "
        "log collectors. Every line carries a stable `event` key.",
        choice("kv", "json"),
    )
    level: Literal["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"] = setting(
        "INFO",
        "Lowest level written (case-insensitive).",
        choice("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"),
    )


# Attributes every LogRecord has; anything else on a record came from ``extra``.
_STANDARD_ATTRS: Final = frozenset(
    vars(logging.LogRecord("x", logging.INFO, "x", 0, "x", None, None))
) | {"message", "asctime", "taskName"}

_DEFAULT_EVENT: Final = "log"
# Values that can be written bare in kv output; anything else is JSON-quoted.
_BARE: Final = re.compile(r"\A[A-Za-z0-9_.:/@+\-,\[\]*]+\Z")


def _timestamp(created: float) -> str:
    return (
        datetime.fromtimestamp(created, UTC)
        .isoformat(timespec="milliseconds")
        .replace("+00:00", "Z")
    )


def record_fields(record: logging.LogRecord) -> dict[str, Any]:
    """The fields of one log line, in output order: ts, level, logger, event, extras, msg, exc."""
    fields: dict[str, Any] = {
        "ts": _timestamp(record.created),
        "level": record.levelname.lower(),
        "logger": record.name,
        "event": getattr(record, "event", None) or _DEFAULT_EVENT,
    }
    for key, value in vars(record).items():
        if key not in _STANDARD_ATTRS and key != "event":
            fields[key] = value
    fields["msg"] = record.getMessage()
    if record.exc_info and record.exc_info[0] is not None:
        fields["exc_type"] = record.exc_info[0].__name__
        fields["exc"] = logging.Formatter().formatException(record.exc_info)
    elif record.exc_text:
        fields["exc"] = record.exc_text
    if record.stack_info:
        fields["stack"] = record.stack_info
    return fields


def _kv_value(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    text = value if isinstance(value, str) else _json_value(value)
    if _BARE.match(text):
        return text
    return json.dumps(text, ensure_ascii=False)


def _json_value(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, default=str, separators=(",", ":"))


class KvFormatter(logging.Formatter):
    """``key=value`` pairs on one line; values with spaces, quotes or ``=`` are JSON-quoted."""

    def format(self, record: logging.LogRecord) -> str:
        """Render ``record`` as one line (without the newline)."""
        return " ".join(f"{key}={_kv_value(value)}" for key, value in record_fields(record).items())


class JsonFormatter(logging.Formatter):
    """One JSON object per line; values JSON cannot hold are written as their ``str``."""

    def format(self, record: logging.LogRecord) -> str:
        """Render ``record`` as one JSON object (without the newline)."""
        return json.dumps(record_fields(record), ensure_ascii=False, default=str)


class _EngineHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """Marks the handler :func:`configure_logging` installed, so a second call replaces it."""


class OneLineReconnects(logging.Filter):
    """asyncpg's pool logs each failed attempt to reopen a connection with a whole traceback
    (``Failed to restore the pool connection floor``): while the server restarts that is a
    screenful a second for an error that is one line. The record keeps its level and message;
    the traceback becomes ``error=<type>: <message>``."""

    def filter(self, record: logging.LogRecord) -> bool:
        """Shorten the record (never drops one)."""
        exc = record.exc_info[1] if record.exc_info else None
        if record.name.startswith("asyncpg") and isinstance(exc, OSError):
            record.exc_info = None
            record.exc_text = None
            record.error = f"{type(exc).__name__}: {exc}"
        return True


def configure_logging(
    format: LogFormat = "kv",  # the name of the setting logging.format
    level: str | int = "INFO",
    *,
    stream: IO[str] | None = None,
) -> None:
    """Send every log record to ``stream`` (default stderr) as structured lines.

    Configures the root logger, so other libraries' records come out in the same format.
    Calling it again replaces the handler it installed before; other handlers are left alone.

    Args:
        format: ``"kv"`` or ``"json"`` (the ``logging.format`` setting).
        level: lowest level written, a name (case-insensitive) or a number.

    Raises:
        ValueError: unknown format or level.
    """
    formatters: dict[str, type[logging.Formatter]] = {"kv": KvFormatter, "json": JsonFormatter}
    if format not in formatters:
        raise ValueError(f"unknown log format {format!r}; expected 'kv' or 'json'")
    if isinstance(level, str):
        number = logging.getLevelName(level.upper())
        if not isinstance(number, int):
            raise ValueError(f"unknown log level {level!r}")
        level = number
    handler = _EngineHandler(stream if stream is not None else sys.stderr)
    handler.setFormatter(formatters[format]())
    handler.addFilter(OneLineReconnects())
    root = logging.getLogger()
    for old in [h for h in root.handlers if isinstance(h, _EngineHandler)]:
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level)
