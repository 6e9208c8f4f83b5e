"""Unique-insert keys, byte for byte the same as River's.

A unique job carries ``unique_key = sha256(<key string>)`` and ``unique_states`` (a ``bit(8)``
mask). The partial unique index on ``unique_key`` plus ``river_job_state_in_bitmask`` makes a
second insert with the same key collide while the first job is in one of the masked states.
Jobs inserted by a River client (Go) and by this engine must therefore produce the *same* key
for the same logical job, so this module mirrors ``internal/dbunique/db_unique.go`` and
``rivershared/structtag`` (River commit ``fdf6cdf1``) exactly, including Go's JSON encoding.

The key string is built in this order::

    &kind=<kind>            unless exclude_kind
    &args=<json>            if by_args
    &period=<RFC3339>       if by_period
    &queue=<queue>          if by_queue

Gateway example: ``&kind=gateway_task_run&args={"task_id":"<uuid>"}&queue=gateway_tasks``.

Everything here is pure: no database, no clock (the caller passes ``now``).
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
import re
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import attrs

from engine.errors import JobError
from engine.queue.states import GATEWAY_UNIQUE_STATES, LIVE_UNIQUE_STATES_DEFAULT, JobState

__all__ = [
    "GATEWAY_UNIQUE_OPTS",
    "UniqueOpts",
    "go_json",
    "unique_key",
    "unique_key_string",
    "unique_states_bitmask",
    "unique_states_from_bitmask",
    "validate_unique_states",
]

# River's requiredV3states (insert_opts.go): a custom ByState may drop only `retryable` (and the
# finalized states); these four must stay. Kept in River's (alphabetical) order because the error
# message lists the missing ones in this order.
_REQUIRED_UNIQUE_STATES: tuple[JobState, ...] = (
    JobState.AVAILABLE,
    JobState.PENDING,
    JobState.RUNNING,
    JobState.SCHEDULED,
)

# River's jobStateBitPositions (db_unique.go): the position of each state in the bit(8) string,
# counted from the LEFT, as PostgreSQL's get_bit() counts. `available` is therefore the
# right-most bit and `scheduled` the left-most.
_BIT_POSITION: Mapping[JobState, int] = {
    JobState.AVAILABLE: 7,
    JobState.CANCELLED: 6,
    JobState.COMPLETED: 5,
    JobState.DISCARDED: 4,
    JobState.PENDING: 3,
    JobState.RETRYABLE: 2,
    JobState.RUNNING: 1,
    JobState.SCHEDULED: 0,
}

# River rejects ByPeriod under one second (UniqueOpts.validate in insert_opts.go).
_MIN_PERIOD_SECONDS = 1.0

# Go's time.Time.Truncate rounds down to a multiple of d "since the zero time", i.e.
# 0001-01-01T00:00:00Z, not the Unix epoch. The two agree for periods that divide a day, but
# not for e.g. 7 days or 7 minutes, so we count from Go's zero time too.
_GO_ZERO_TIME = datetime(1, 1, 1, tzinfo=UTC)


def _go_quote(text: str) -> str:
    """Quote ``text`` roughly as Go's ``%q`` does, for error messages that mirror River's."""
    return json.dumps(text, ensure_ascii=False)


def _coerce_state(state: JobState | str) -> JobState:
    """Return ``state`` as a :class:`JobState`, raising River's message for an unknown one."""
    try:
        return JobState(state)
    except ValueError:
        raise JobError(
            f"UniqueOpts.ByState contains invalid state {_go_quote(str(state))}"
        ) from None


def validate_unique_states(states: Iterable[JobState | str] | None) -> None:
    """Check a custom ``ByState`` set as River's ``UniqueOpts.validate`` does.

    ``None`` or an empty set means "use River's default" and is always valid. Otherwise every
    state must be a known one, and the set must contain ``available``, ``pending``, ``running``
    and ``scheduled``: only ``retryable`` (and the finalized states) may be dropped.

    Raises:
        JobError: with River's exact message, e.g.
            ``UniqueOpts.ByState must contain all required states, missing: pending, running``
            or ``UniqueOpts.ByState contains invalid state "bogus"``.
    """
    if states is None:
        return
    listed = [_coerce_state(s) for s in states]
    if not listed:
        # River skips the required-states check when no custom states were given.
        return
    missing = [s.value for s in _REQUIRED_UNIQUE_STATES if s not in listed]
    if missing:
        raise JobError(
            "UniqueOpts.ByState must contain all required states, missing: " + ", ".join(missing)
        )


@functools.lru_cache(maxsize=64)
def _bitmask_of(states: frozenset[JobState]) -> str:
    # Every unique insert asks for its mask; the sets in use are few (a task job's is one).
    return unique_states_bitmask(states)


def unique_states_bitmask(states: Iterable[JobState | str]) -> str:
    """Return the ``bit(8)`` literal for ``states``, e.g. ``'11110001'`` for the gateway set.

    Bit order is River's (``UniqueStatesToBitmask``): ``available`` is the right-most bit and
    ``scheduled`` the left-most, so PostgreSQL's ``get_bit(mask, 7)`` tests ``available``. The
    gateway set {available, pending, retryable, running, scheduled} gives ``'11110001'`` (241).

    Raises:
        JobError: for an unknown state (River would silently ignore it; we refuse, since it can
            only be a bug and would quietly weaken uniqueness).
    """
    bits = ["0"] * 8
    for state in states:
        bits[_BIT_POSITION[_coerce_state(state)]] = "1"
    return "".join(bits)


def unique_states_from_bitmask(mask: str) -> frozenset[JobState]:
    """Inverse of :func:`unique_states_bitmask`: the states set in a ``bit(8)`` literal.

    Raises:
        ValueError: if ``mask`` is not exactly eight ``0``/``1`` characters.
    """
    if len(mask) != 8 or set(mask) - {"0", "1"}:
        raise ValueError(f"not a bit(8) literal: {mask!r}")
    return frozenset(state for state, pos in _BIT_POSITION.items() if mask[pos] == "1")


def _convert_by_args(value: bool | Iterable[str]) -> bool | tuple[str, ...]:
    """Normalise ``by_args`` to a bool or a tuple of field paths."""
    if isinstance(value, bool):
        return value
    if isinstance(value, str):
        # A bare string is iterable too; turning "task_id" into its letters would be a silent bug.
        raise JobError("UniqueOpts.by_args takes True/False or a tuple of field names, not a str")
    fields = tuple(value)
    for field in fields:
        if not isinstance(field, str) or not field:
            raise JobError(f"UniqueOpts.by_args field names must be non-empty str, got {field!r}")
    return fields


def _convert_by_state(
    value: Iterable[JobState | str] | None,
) -> frozenset[JobState] | None:
    """Normalise ``by_state`` to a frozenset of :class:`JobState` (``None`` stays ``None``)."""
    if value is None:
        return None
    return frozenset(_coerce_state(s) for s in value)


@attrs.frozen(slots=True)
class UniqueOpts:
    """What makes an insert unique; River's ``UniqueOpts``.

    Attributes:
        by_args: ``True`` hashes all top-level arg keys (River's behaviour for an args struct with
            no ``river:"unique"`` tags). A tuple names the tagged subset instead; a dotted name
            such as ``"customer.id"`` selects a nested field, as River's struct-tag walk does for
            nested structs. An empty tuple behaves like ``True``, as in River, where "no tagged
            fields" falls back to all keys.
        by_queue: include the queue name.
        by_period: seconds; include the insert time rounded down to this period. At least 1 s.
        by_state: the states in which an existing job blocks a new one. ``None`` (or empty)
            means River's default, :data:`LIVE_UNIQUE_STATES_DEFAULT`.
        exclude_kind: leave the job kind out of the key.

    Construction validates like River's ``UniqueOpts.validate`` and raises :class:`JobError`.
    """

    by_args: bool | tuple[str, ...] = attrs.field(default=False, converter=_convert_by_args)
    by_queue: bool = False
    by_period: float | None = None
    by_state: frozenset[JobState] | None = attrs.field(default=None, converter=_convert_by_state)
    exclude_kind: bool = False

    def __attrs_post_init__(self) -> None:
        """Validate as River does at insert time, so a bad option set cannot exist at all."""
        if self.by_period is not None and not (
            math.isfinite(self.by_period) and self.by_period >= _MIN_PERIOD_SECONDS
        ):
            raise JobError("UniqueOpts.ByPeriod should not be less than 1 second")
        validate_unique_states(self.by_state)

    @property
    def is_empty(self) -> bool:
        """True when no uniqueness is asked for; River then stores a NULL ``unique_key``."""
        # Mirrors dbunique.UniqueOpts.IsEmpty: an explicit (even empty) by_state is not empty.
        return (
            self.by_args is False
            and self.by_period is None
            and not self.by_queue
            and self.by_state is None
            and not self.exclude_kind
        )

    @property
    def effective_states(self) -> frozenset[JobState]:
        """``by_state``, or River's default set when it is ``None`` or empty (``StateBitmask``)."""
        return self.by_state if self.by_state else LIVE_UNIQUE_STATES_DEFAULT

    def states_bitmask(self) -> str:
        """The ``bit(8)`` literal to store in ``river_job.unique_states``."""
        return _bitmask_of(self.effective_states)


GATEWAY_UNIQUE_OPTS = UniqueOpts(
    by_args=("task_id",),
    by_queue=True,
    by_state=GATEWAY_UNIQUE_STATES,
)
"""The gateway's insert options: ``task_id`` is the one ``river:"unique"``-tagged field."""


# --- Go encoding/json compatibility ----------------------------------------------------------
#
# River hashes the raw bytes of the args as Go's json.Marshal wrote them. Python's json module
# differs from Go in three ways that matter here, and each is corrected below:
#   1. Go escapes <, > and & (HTML-safe by default) and U+2028/U+2029 as \u003c, \u003e, \u0026,
#      \u2028, \u2029. Python leaves them raw.
#   2. Go writes invalid UTF-8 as the escape \ufffd. In a Python str, invalid bytes surface as
#      lone surrogates (surrogateescape), which we map to the same escape.
#   3. Go formats floats without a trailing ".0" and switches to exponent form only below 1e-6
#      or from 1e21 up, with a one-digit negative exponent ("1e-7", not "1e-07").
# Control characters already agree with Go >= 1.22: both write \b \f \n \r \t short and the rest
# as lower-case \u00XX (Go < 1.22 wrote \u0008 and \u000c for \b and \f).
_GO_STRING_ESCAPES = str.maketrans(
    {
        "<": "\\u003c",
        ">": "\\u003e",
        "&": "\\u0026",
        "\u2028": "\\u2028",
        "\u2029": "\\u2029",
    }
)
_LONE_SURROGATE = re.compile("[\ud800-\udfff]")


def _go_json_string(text: str) -> str:
    """Encode a str as Go's ``json.Marshal`` does (HTML-escaped, compact)."""
    encoded = json.dumps(text, ensure_ascii=False).translate(_GO_STRING_ESCAPES)
    return _LONE_SURROGATE.sub(lambda _m: "\\ufffd", encoded)


def _go_json_float(value: float) -> str:
    """Format a float as Go's ``encoding/json`` floatEncoder does for float64."""
    if not math.isfinite(value):
        # Go: json: unsupported value: NaN / +Inf.
        raise JobError(f"unique args contain an unsupported float value: {value!r}")
    magnitude = abs(value)
    if magnitude != 0 and (magnitude < 1e-6 or magnitude >= 1e21):
        # Go uses strconv 'e' with the shortest round-trip digits; Python's repr uses the same
        # digits and an exponent form in this range. Go then shortens "e-07" to "e-7".
        text = repr(value)
        mantissa, _, exponent = text.partition("e")
        sign, digits = exponent[0], exponent[1:]
        if sign == "-" and len(digits) == 2 and digits[0] == "0":
            digits = digits[1:]
        return f"{mantissa}e{sign}{digits}"
    # Go uses strconv 'f' with the shortest round-trip digits: no exponent, no trailing ".0".
    return format(Decimal(repr(value)).normalize(), "f")


def go_json(value: Any) -> str:
    """Encode ``value`` as compact JSON the way Go's ``json.Marshal`` would.

    Supports ``None``, ``bool``, ``int``, ``float``, ``str``, mappings with ``str`` keys and
    lists/tuples. Mapping keys keep their iteration order: River hashes the args *as they were
    stored*, and a Go struct is encoded in field order, so we must not re-sort nested objects
    (only the top-level selection in :func:`unique_key_string` is sorted, as River does).

    Raises:
        JobError: for a value Go could not encode (NaN, infinities, non-str keys, other types).
    """
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return _go_json_float(value)
    if isinstance(value, str):
        return _go_json_string(value)
    if isinstance(value, Mapping):
        parts = []
        for key, item in value.items():
            if not isinstance(key, str):
                raise JobError(f"unique args keys must be str, got {type(key).__name__}")
            parts.append(f"{_go_json_string(key)}:{go_json(item)}")
        return "{" + ",".join(parts) + "}"
    if isinstance(value, list | tuple):
        return "[" + ",".join(go_json(item) for item in value) + "]"
    raise JobError(f"unique args value of type {type(value).__name__} is not JSON-encodable")


_MISSING = object()


def _lookup(args: Mapping[str, Any], path: str) -> Any:
    """Follow a dotted path through nested mappings; ``_MISSING`` if any step is absent.

    This is what gjson does for the paths River's struct-tag walk produces. Limitation: a key
    that itself contains a dot cannot be addressed (gjson would need an escape; River's tag walk
    never produces one for the gateway's args).
    """
    current: Any = args
    for part in path.split("."):
        if not isinstance(current, Mapping) or part not in current:
            return _MISSING
        current = current[part]
    return current


def _args_json(args: Mapping[str, Any], by_args: bool | tuple[str, ...]) -> str:
    """The ``&args=`` payload: the selected arg values, keys sorted, Go-encoded."""
    if isinstance(by_args, tuple) and by_args:
        # Tagged subset (River: structtag.SortedFieldsWithTag + sjson.SetRawBytes). sort.Strings
        # orders by bytes; Python orders str by code point, which is the same order for UTF-8.
        fields = sorted(set(by_args))
        chosen = set(fields)
        for field in fields:
            parts = field.split(".")
            for cut in range(1, len(parts)):
                prefix = ".".join(parts[:cut])
                if prefix in chosen:
                    # River's tag walk never selects a struct and one of its fields together.
                    raise JobError(f"UniqueOpts.by_args paths overlap: {prefix!r} and {field!r}")
        selected: dict[str, Any] = {}
        for field in fields:
            found = _lookup(args, field)
            if found is _MISSING:
                # River marks absent keys "undefined" and skips them.
                continue
            *parents, leaf = field.split(".")
            node = selected
            for parent in parents:
                node = node.setdefault(parent, {})
            node[leaf] = found
        # River builds this object into an EMPTY buffer, so when every selected key is absent the
        # payload is "" (not "{}"). Mirror that so such keys match River's.
        return go_json(selected) if selected else ""
    # All keys, sorted; River starts this one from "{}", so no args give "{}".
    for key in args:
        if not isinstance(key, str):
            raise JobError(f"unique args keys must be str, got {type(key).__name__}")
    return go_json({key: args[key] for key in sorted(args)})


def _period_bound(now: datetime, period_seconds: float) -> str:
    """``now`` rounded down to the period as Go's ``Truncate`` does, formatted as RFC 3339 UTC."""
    if now.tzinfo is None or now.utcoffset() is None:
        raise JobError("unique key with by_period needs a timezone-aware `now`")
    period_ns = round(period_seconds * 1_000_000_000)
    since_zero = now.astimezone(UTC) - _GO_ZERO_TIME
    ns = (
        since_zero.days * 86_400 + since_zero.seconds
    ) * 1_000_000_000 + since_zero.microseconds * 1_000
    bound_ns = ns - ns % period_ns
    bound = _GO_ZERO_TIME + timedelta(microseconds=bound_ns // 1_000)
    # Go's time.RFC3339 layout: no fractional seconds, "Z" for UTC. River formats the time in its
    # own location (time.Now() is local in Go); Go hosts run in UTC in practice, and we always
    # use UTC so the key never depends on this process's time zone.
    return (
        f"{bound.year:04d}-{bound.month:02d}-{bound.day:02d}"
        f"T{bound.hour:02d}:{bound.minute:02d}:{bound.second:02d}Z"
    )


def unique_key_string(
    kind: str,
    args: Mapping[str, Any],
    queue: str,
    opts: UniqueOpts,
    now: datetime | None = None,
) -> str:
    """Build River's unique key string (before hashing); see the module docstring for the layout.

    Args:
        kind: the job kind.
        args: the job args, as they are encoded into ``river_job.args``.
        queue: the queue name.
        opts: the unique options.
        now: the time the period is taken from; only used with ``by_period`` and then required.
            River uses the job's ``scheduled_at`` when the insert sets one, else the current time,
            so pass the same.

    Raises:
        JobError: for args Go could not encode, or a missing/naive ``now`` with ``by_period``.
    """
    parts: list[str] = []
    if not opts.exclude_kind:
        parts.append("&kind=" + kind)
    if opts.by_args is not False:
        parts.append("&args=" + _args_json(args, opts.by_args))
    if opts.by_period is not None:
        if now is None:
            raise JobError("unique key with by_period needs `now`")
        parts.append("&period=" + _period_bound(now, opts.by_period))
    if opts.by_queue:
        parts.append("&queue=" + queue)
    return "".join(parts)


def unique_key(
    kind: str,
    args: Mapping[str, Any],
    queue: str,
    opts: UniqueOpts,
    now: datetime | None = None,
) -> bytes:
    """Return ``sha256`` of :func:`unique_key_string` (32 bytes), River's ``unique_key`` column.

    Callers should check :attr:`UniqueOpts.is_empty` first: River stores NULL (no uniqueness)
    for empty options and never calls this.
    """
    text = unique_key_string(kind, args, queue, opts, now)
    return hashlib.sha256(text.encode("utf-8")).digest()
